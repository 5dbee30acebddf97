"""InferenceSession: parity with onnxruntime and run_graph, metadata, bad input, plans, kernel failures."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS
from opstrata.graph.testing import bert_block_model, mlp_model, random_feeds
from opstrata.runtime import ExecutionError, InferenceSession, InvalidArgument, InvalidModel, SessionOptions

MODELS = ["mlp", "cnn", "bert", "gpt"]  # the conftest models fixture builds these


@pytest.mark.parametrize("level", [0, 1, 2, 3])
@pytest.mark.parametrize("name", list(MODELS))
def test_outputs_equal_onnxruntime_and_run_graph(models, name: str, level: int) -> None:
    ort_run = pytest.importorskip("opstrata.graph.testing").ort_run
    pytest.importorskip("onnxruntime")
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    want = ort_run(model, feeds)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=level))
    got = sess.run(None, feeds)
    ref = og.run_graph(og.from_onnx(model), feeds)
    assert [o.name for o in sess.get_outputs()] == list(want)
    for out, (k, w) in zip(got, want.items(), strict=True):
        np.testing.assert_allclose(out, w, rtol=1e-4, atol=1e-5, err_msg=f"{name} L{level} {k}")
        np.testing.assert_allclose(out, ref[k], rtol=1e-4, atol=1e-5)
    again = sess.run(None, feeds)  # the arena is reused: same numbers
    for a, b in zip(got, again, strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_allocator_mode_equals_arena_mode(models, name: str) -> None:
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    a = InferenceSession(model).run(None, feeds)
    sess = InferenceSession(model, SessionOptions(enable_mem_arena=False))
    b = sess.run(None, feeds)
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)
    st = sess.allocator.stats()
    assert st["num_alloc"] > 0 and st["allocated_bytes"] == 0 and st["num_alloc"] == st["num_free"]
    assert sess.arenas == {tuple(f.shape for f in feeds.values()): None}


def test_get_inputs_outputs_like_onnxruntime(models) -> None:
    sess = InferenceSession(models["bert"][0])
    ins, outs = sess.get_inputs(), sess.get_outputs()
    assert [(i.name, i.shape, i.type) for i in ins] == [
        ("x", ["batch", "seq", 32], "tensor(float)"),
        ("mask", ["batch", "seq"], "tensor(float)"),
    ]
    assert [(o.name, o.shape, o.type) for o in outs] == [("y", ["batch", "seq", 32], "tensor(float)")]
    gpt = InferenceSession(models["gpt"][0])
    assert gpt.get_inputs()[0].type == "tensor(int64)"
    ort = pytest.importorskip("onnxruntime")
    o = ort.InferenceSession(models["bert"][0].SerializeToString(), providers=["CPUExecutionProvider"])
    assert [(i.name, i.shape, i.type) for i in o.get_inputs()] == [(i.name, i.shape, i.type) for i in ins]


def test_output_names_select_and_order() -> None:
    from opstrata.graph.testing import opset_variant_model

    model = opset_variant_model(17)
    sess = InferenceSession(model)
    feeds = random_feeds(model, {"batch": 3})
    a, _, c = sess.run(None, feeds)
    c2, a2 = sess.run(["c", "a"], feeds)
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(c, c2)
    with pytest.raises(
        InvalidArgument, match=r"unknown output name\(s\) \['d'\].*outputs are \['a', 'b', 'c'\]"
    ):
        sess.run(["d"], feeds)
    with pytest.raises(InvalidArgument, match="list of names"):
        sess.run("a", feeds)


def test_model_forms_path_bytes_proto_graph_plan(tmp_path, models) -> None:
    model, dims = models["mlp"]
    feeds = random_feeds(model, dims)
    want = InferenceSession(model).run(None, feeds)[0]
    p = tmp_path / "mlp.onnx"
    p.write_bytes(model.SerializeToString())
    plan = og.compile(og.from_onnx(model), level=2)
    plan.save(tmp_path / "mlp.plan")
    for m in (str(p), p, model.SerializeToString(), og.from_onnx(model), plan, tmp_path / "mlp.plan",
              (tmp_path / "mlp.plan").read_bytes()):  # fmt: skip
        np.testing.assert_allclose(InferenceSession(m).run(None, feeds)[0], want, rtol=1e-6)


def test_saved_plan_round_trip(tmp_path, models) -> None:
    model, dims = models["gpt"]
    feeds = random_feeds(model, dims)
    plan = og.compile(og.from_onnx(model), level=3)
    path = plan.save(tmp_path / "gpt.plan")
    a = InferenceSession(plan).run(None, feeds)[0]
    sess = InferenceSession(path)
    assert sess.plan.level == 3 and len(sess.graph) == len(plan.graph)
    np.testing.assert_array_equal(sess.run(None, feeds)[0], a)


# ---------------------------------------------------------------------------- bad input


@pytest.fixture
def bert():
    model = bert_block_model()
    return InferenceSession(model), random_feeds(model, {"batch": 2, "seq": 5})


def test_unknown_feed_name(bert) -> None:
    sess, feeds = bert
    feeds["msk"] = feeds.pop("mask")
    with pytest.raises(
        InvalidArgument, match=r"unknown input name\(s\) 'msk' \(did you mean 'mask'\?\).*\['x', 'mask'\]"
    ):
        sess.run(None, feeds)


def test_missing_feed(bert) -> None:
    sess, feeds = bert
    del feeds["mask"]
    with pytest.raises(InvalidArgument, match=r"missing input\(s\) \['mask'\].*Fix: feed a value"):
        sess.run(None, feeds)


def test_wrong_dtype(bert) -> None:
    sess, feeds = bert
    feeds["x"] = feeds["x"].astype(np.float64)
    with pytest.raises(
        InvalidArgument,
        match=r"input 'x': expected dtype tensor\(float\) \(float32\), got float64\. Fix: pass x.astype\(np.float32\)",
    ):
        sess.run(None, feeds)


def test_wrong_rank(bert) -> None:
    sess, feeds = bert
    feeds["x"] = feeds["x"][0]
    with pytest.raises(
        InvalidArgument, match=r"input 'x': expected rank 3 shape \['batch', 'seq', 32\], got shape \[5, 32\]"
    ):
        sess.run(None, feeds)


def test_wrong_static_dim(bert) -> None:
    sess, feeds = bert
    feeds["x"] = np.zeros((2, 5, 31), np.float32)
    with pytest.raises(InvalidArgument, match=r"input 'x': dim 2 must be 32 .*got shape \[2, 5, 31\]"):
        sess.run(None, feeds)


def test_inconsistent_symbolic_dim(bert) -> None:
    sess, feeds = bert
    feeds["mask"] = np.ones((3, 5), np.float32)
    with pytest.raises(
        InvalidArgument, match=r"input 'mask': symbolic dim 'batch' is 3 here but 2 in input 'x'"
    ):
        sess.run(None, feeds)


def test_feeds_not_a_mapping(bert) -> None:
    sess, feeds = bert
    with pytest.raises(InvalidArgument, match="feeds must be a dict"):
        sess.run(None, list(feeds.values()))


def test_corrupt_model_bytes_and_files(tmp_path) -> None:
    with pytest.raises(InvalidModel, match=r"InferenceSession\(model\)"):
        InferenceSession(b"\x08\x07garbage that is not a model")
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"not an onnx file at all")
    with pytest.raises(InvalidModel, match=r"bad\.onnx"):
        InferenceSession(bad)
    with pytest.raises(InvalidModel, match="no such file"):
        InferenceSession(tmp_path / "missing.onnx")
    with pytest.raises(InvalidModel, match="expected a path, bytes"):
        InferenceSession(42)


def test_corrupt_plan_file(tmp_path, models) -> None:
    path = og.compile(og.from_onnx(models["mlp"][0])).save(tmp_path / "m.plan")
    truncated = tmp_path / "trunc.plan"
    truncated.write_bytes(path.read_bytes()[:-200])
    with pytest.raises(InvalidModel, match=r"trunc.plan.*(corrupt|truncated|not an opstrata plan)"):
        InferenceSession(truncated)
    foreign = tmp_path / "foreign.plan"
    with zipfile.ZipFile(foreign, "w") as z:
        z.writestr("format.json", '{"format": "something-else"}')
    with pytest.raises(InvalidModel, match="not an opstrata plan"):
        InferenceSession(foreign)


def test_bad_options() -> None:
    with pytest.raises(InvalidArgument, match="graph_optimization_level must be an int 0-3, got 7"):
        InferenceSession(mlp_model(), SessionOptions(graph_optimization_level=7))
    with pytest.raises(InvalidArgument, match="fallback_policy must be one of"):
        InferenceSession(mlp_model(), SessionOptions(fallback_policy="sometimes"))
    with pytest.raises(InvalidArgument, match="unknown device 'tpu'"):
        InferenceSession(mlp_model(), device="tpu")


def test_plan_for_another_device(models) -> None:
    plan = og.compile(og.from_onnx(models["mlp"][0]), device="ref")
    with pytest.raises(InvalidModel, match=r"compiled for device 'ref'.*runs on 'cpu'"):
        InferenceSession(plan)


# ---------------------------------------------------------------------------- failures inside run


def test_failing_kernel_names_the_node(monkeypatch, models) -> None:
    def broken(node, args):
        raise FloatingPointError("simulated kernel fault")

    monkeypatch.setitem(KERNELS, ("", "Relu"), broken)
    model, dims = models["mlp"]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    feeds = random_feeds(model, dims)
    with pytest.raises(
        ExecutionError,
        match=r"node '.*' \(Relu\): kernel relu failed on inputs \(float32\[4, 32\]\): FloatingPointError: simulated kernel fault",
    ) as info:
        sess.run(None, feeds)
    assert isinstance(info.value.__cause__, FloatingPointError)
    sess2 = InferenceSession(model, SessionOptions(graph_optimization_level=0, enable_mem_arena=False))
    with pytest.raises(ExecutionError, match="simulated kernel fault"):
        sess2.run(None, feeds)
    assert sess2.allocator.stats()["allocated_bytes"] == 0  # blocks returned after the failure


def test_kernel_returning_wrong_shape_is_an_error(monkeypatch, models) -> None:
    monkeypatch.setitem(KERNELS, ("", "Relu"), lambda node, args: [args[0][:, :3]])
    model, dims = models["mlp"]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    with pytest.raises(
        ExecutionError, match=r"\(Relu\): output 0 .* is float32\[4, 3\], the plan expects float32\[4, 32\]"
    ):
        sess.run(None, random_feeds(model, dims))


def test_fallback_policy_applies_around_runs(monkeypatch, models) -> None:
    seen: list[str] = []
    relu = KERNELS[("", "Relu")]

    def spy(node, args):
        seen.append(ops.get_fallback_policy())
        return relu(node, args)

    monkeypatch.setitem(KERNELS, ("", "Relu"), spy)
    model, dims = models["mlp"]
    before = ops.get_fallback_policy()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, fallback_policy="error"))
    sess.run(None, random_feeds(model, dims))
    assert seen == ["error"]  # kernels ran under the session's policy ...
    assert ops.get_fallback_policy() == before  # ... and the caller's policy is untouched


def test_concurrent_runs_are_serialised(models) -> None:
    import threading

    model, dims = models["bert"]
    sess = InferenceSession(model)
    feeds = random_feeds(model, dims)
    want = sess.run(None, feeds)[0]
    errors: list[BaseException] = []

    def worker() -> None:
        try:
            for _ in range(5):
                np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert not errors
