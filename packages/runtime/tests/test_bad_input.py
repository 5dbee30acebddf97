"""Bad input to InferenceSession: every refusal is one line naming the thing, expected, actual and one fix."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import opstrata.graph as og  # noqa: E402
from opstrata.graph.testing import mlp_model, random_feeds  # noqa: E402
from opstrata.runtime import InferenceSession, InvalidArgument, InvalidModel  # noqa: E402


def _one_fix(exc: pytest.ExceptionInfo[BaseException]) -> str:
    text = str(exc.value)
    assert "\n" not in text, text
    assert text.count("Fix:") == 1, text
    return text


@pytest.fixture(scope="module")
def mlp() -> tuple[InferenceSession, dict[str, np.ndarray]]:
    model = mlp_model()
    return InferenceSession(model), random_feeds(model, {"batch": 3})


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return og.compile(og.from_onnx(mlp_model())).save(tmp_path_factory.mktemp("plan") / "mlp.plan")


# ---------------------------------------------------------------- corrupt model files


@pytest.mark.parametrize(
    ("label", "data", "problem"),
    [
        ("empty", b"", "not an ONNX model"),
        ("truncated", "half", "not a valid ONNX model"),
        ("a TensorProto", "tensor", "not a valid ONNX model"),
        ("random bytes", b"\x08\x07garbage that is not a model", "not a valid ONNX model"),
    ],
)
def test_corrupt_onnx_file_names_the_file(tmp_path, label: str, data: object, problem: str) -> None:
    raw = mlp_model().SerializeToString()
    if data == "half":
        data = raw[: len(raw) // 2]
    elif data == "tensor":
        data = onnx.numpy_helper.from_array(np.zeros(3, np.float32), "t").SerializeToString()
    path = tmp_path / "model.onnx"
    path.write_bytes(data)  # type: ignore[arg-type]
    with pytest.raises(InvalidModel) as exc:
        InferenceSession(path)
    text = _one_fix(exc)
    assert "model.onnx" in text and problem in text, (label, text)


def test_missing_model_file_is_named(tmp_path) -> None:
    with pytest.raises(InvalidModel, match=r"no such file '.*nope\.onnx'.*Fix: check the path") as exc:
        InferenceSession(tmp_path / "nope.onnx")
    _one_fix(exc)


# ---------------------------------------------------------------- corrupt plan files


def _rewrite(src: Path, dst: Path, member: str, how: str) -> Path:
    with zipfile.ZipFile(src) as z, zipfile.ZipFile(dst, "w") as out:
        for name in z.namelist():
            data = z.read(name)
            if name == member:
                if how == "drop":
                    continue
                data = data[: len(data) // 2]
            out.writestr(name, data)
    return dst


@pytest.mark.parametrize("member", ["format.json", "plan.json", "graph.json", "tensors/0.bin"])
@pytest.mark.parametrize("how", ["drop", "truncate"])
def test_corrupt_plan_member_is_named(tmp_path, plan_file: Path, member: str, how: str) -> None:
    bad = _rewrite(plan_file, tmp_path / "bad.plan", member, how)
    with pytest.raises(InvalidModel) as exc:
        InferenceSession(bad)
    text = _one_fix(exc)
    assert "Plan.load" in text and "bad.plan" in text and "corrupt or truncated plan file" in text, text
    assert "recompile" in text


def test_truncated_plan_bytes(plan_file: Path) -> None:
    with pytest.raises(InvalidModel, match=r"corrupt|truncated|not an opstrata plan") as exc:
        InferenceSession(plan_file.read_bytes()[:-100])
    _one_fix(exc)


# ---------------------------------------------------------------- feeds


@pytest.mark.parametrize(
    ("label", "value", "expected", "actual"),
    [
        ("python list", "list", "expected dtype tensor(float) (float32)", "got float64"),
        ("0-d scalar", np.float32(1.0), "expected rank 2 shape ['batch', 16]", "got shape []"),
        ("None", None, "expected dtype tensor(float)", "got object"),
        ("a string", "abc", "expected dtype tensor(float)", "got <U3"),
        ("int array", np.zeros((3, 16), np.int64), "expected dtype tensor(float)", "got int64"),
        ("wrong static dim", np.zeros((3, 15), np.float32), "dim 1 must be 16", "got shape [3, 15]"),
    ],
)
def test_bad_feed_names_input_expected_actual(
    mlp, label: str, value: object, expected: str, actual: str
) -> None:
    sess, feeds = mlp
    name = sess.get_inputs()[0].name
    bad = feeds[name].tolist() if isinstance(value, str) and value == "list" else value
    with pytest.raises(InvalidArgument) as exc:
        sess.run(None, {**feeds, name: bad})
    text = _one_fix(exc)
    assert f"input '{name}'" in text and expected in text and actual in text, (label, text)


def test_unknown_and_missing_names_list_the_model_inputs(mlp) -> None:
    sess, feeds = mlp
    name = sess.get_inputs()[0].name
    with pytest.raises(
        InvalidArgument, match=rf"unknown input name\(s\) '{name}x' \(did you mean '{name}'\?\)"
    ):
        sess.run(None, {f"{name}x": feeds[name]})
    with pytest.raises(
        InvalidArgument, match=rf"missing input\(s\) \['{name}'\]; the model's inputs are"
    ) as exc:
        sess.run(None, {})
    _one_fix(exc)


def test_refused_feed_leaves_the_session_usable(mlp) -> None:
    sess, feeds = mlp
    want = sess.run(None, feeds)
    with pytest.raises(InvalidArgument):
        sess.run(None, {k: v.astype(np.float64) for k, v in feeds.items()})
    for a, b in zip(want, sess.run(None, feeds), strict=True):
        np.testing.assert_array_equal(a, b)
