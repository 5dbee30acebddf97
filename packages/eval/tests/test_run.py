"""`opstrata run`: outputs equal InferenceSession's, timings, trace, random feeds, ORT check, bad input."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

onnx = pytest.importorskip("onnx")

import opstrata.runtime as rt  # noqa: E402
from opstrata.eval import _cli, _run  # noqa: E402
from opstrata.graph.testing import bert_block_model, mlp_model, random_feeds  # noqa: E402


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The MLP (one input x: float32[batch, 16]) and BERT block (x, mask) models with .npy/.npz feeds."""
    d = tmp_path_factory.mktemp("run")
    mlp, bert = mlp_model(), bert_block_model()
    onnx.save(mlp, d / "mlp.onnx")
    onnx.save(bert, d / "bert.onnx")
    fm = random_feeds(mlp, {"batch": 3}, seed=1)
    fb = random_feeds(bert, {"batch": 2, "seq": 5}, seed=2)
    np.save(d / "x.npy", fm["x"])
    np.save(d / "bx.npy", fb["x"])
    np.save(d / "mask.npy", fb["mask"])
    np.savez(d / "bert_feeds.npz", **fb)
    np.save(d / "x64.npy", fm["x"].astype(np.float64))
    np.save(d / "x15.npy", fm["x"][:, :15])
    np.save(d / "mask3.npy", np.ones((3, 5), np.float32))
    np.savez(d / "two.npz", a=fm["x"], b=fm["x"])
    (d / "junk.npy").write_bytes(b"this is not numpy")
    np.save(d / "fake.npy", fm["x"])
    (d / "fake.npy").rename(d / "fake.npz")
    (d / "corrupt.onnx").write_bytes(mlp.SerializeToString()[:100])
    return {p.stem if p.suffix != ".npz" else p.name: p for p in d.iterdir()} | {"dir": d}


def _main(capsys: pytest.CaptureFixture[str], *argv: object) -> tuple[int, str, str]:
    code = _cli.main(["run", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


# ---------------------------------------------------------------- runs


def test_outputs_equal_inference_session_golden(files, tmp_path, capsys) -> None:
    code, out, err = _main(
        capsys, files["mlp"], "--input", f"x={files['x']}", "--output-dir", tmp_path, "--repeat", 3
    )
    assert code == 0, err
    got = np.load(tmp_path / "probs.npy")
    (want,) = rt.InferenceSession(str(files["mlp"])).run(None, {"x": np.load(files["x"])})
    np.testing.assert_array_equal(got, want)
    line = next(ln for ln in out.splitlines() if ln.strip().startswith("probs:"))
    assert f"float32[{want.shape[0]}, {want.shape[1]}]" in line
    assert f"min {want.min():.6g} max {want.max():.6g} mean {want.mean():.6g}" in line
    assert f"[{want.ravel()[0]:.6g}, " in line
    for label in ("compile", "first run", "steady"):
        assert any(ln.strip().startswith(label) and " ms" in ln for ln in out.splitlines()), label
    assert "median" in out and "p90" in out and "over 3 runs" in out


def test_two_inputs_from_npz_and_level_zero(files, tmp_path, capsys) -> None:
    code, _, err = _main(
        capsys,
        files["bert"],
        "--input",
        files["bert_feeds.npz"],
        "--level",
        0,
        "--repeat",
        1,
        "--output-dir",
        tmp_path,
    )
    assert code == 0, err
    feeds = dict(np.load(files["bert_feeds.npz"]))
    opts = rt.SessionOptions(graph_optimization_level=0)
    (want,) = rt.InferenceSession(str(files["bert"]), opts).run(None, feeds)
    np.testing.assert_array_equal(np.load(tmp_path / "y.npy"), want)


def test_profile_writes_a_chrome_trace(files, tmp_path, capsys) -> None:
    trace = tmp_path / "trace.json"
    code, out, err = _main(
        capsys, files["mlp"], "-i", f"x={files['x']}", "--profile", trace, "--repeat", 2, "--warmup", 0
    )
    assert code == 0, err
    events = json.loads(trace.read_text())["traceEvents"]
    runs = [e for e in events if e.get("cat") == "session"]
    assert len(runs) == 3  # first run + 2 timed
    assert {e["args"]["op_type"] for e in events if e.get("ph") == "X" and "op_type" in e.get("args", {})}
    assert "hottest nodes" in out and str(trace) in out


def test_random_inputs_follow_dims_and_seed(files, tmp_path, capsys) -> None:
    outs = []
    for seed, sub in ((7, "a"), (7, "b"), (8, "c")):
        args = ["--random", "--dim", "batch=4", "--dim", "seq=3", "--seed", seed, "--repeat", 0]
        code, out, err = _main(capsys, files["bert"], *args, "--output-dir", tmp_path / sub)
        assert code == 0, err
        assert "x: random float32[4, 3, 32] (seed" in out
        outs.append(np.load(tmp_path / sub / "y.npy"))
    assert outs[0].shape == (4, 3, 32)
    np.testing.assert_array_equal(outs[0], outs[1])
    assert not np.array_equal(outs[0], outs[2])


def test_random_fills_only_missing_inputs_and_reuses_their_dims(files, tmp_path, capsys) -> None:
    code, out, err = _main(capsys, files["bert"], "-i", f"x={files['bx']}", "--random", "--repeat", 0)
    assert code == 0, err
    assert "mask: random float32[2, 5]" in out and "x: random" not in out


def test_unbound_symbolic_dims_default_to_one_and_say_so(files, capsys) -> None:
    code, out, _ = _main(capsys, files["mlp"], "--random", "--repeat", 0, "--dim", "seq=4")
    assert code == 0
    assert "symbolic dims batch=1 (set with --dim NAME=VALUE)" in out and "probs: float32[1, 8]" in out
    assert "note: --dim seq is not a symbolic dim of the model's inputs (['batch'])" in out


def test_check_ort_passes(files, capsys) -> None:
    pytest.importorskip("onnxruntime")
    code, out, err = _main(capsys, files["bert"], "-i", files["bert_feeds.npz"], "--check-ort", "--repeat", 0)
    assert code == 0, err
    assert "PASS y: max |diff|" in out


def test_check_ort_failure_exits_1(files, capsys, monkeypatch) -> None:
    pytest.importorskip("onnxruntime")
    real = rt.InferenceSession.run
    monkeypatch.setattr(
        rt.InferenceSession, "run", lambda self, names, feeds: [o + 1 for o in real(self, names, feeds)]
    )
    code, out, _ = _main(capsys, files["mlp"], "-i", f"x={files['x']}", "--check-ort", "--repeat", 0)
    assert code == 1
    assert "FAIL probs" in out and "outputs differ from onnxruntime" in out


def test_saved_plan_runs_like_the_onnx_file(files, tmp_path, capsys) -> None:
    import opstrata.graph as og

    plan = og.compile(og.from_onnx(files["mlp"])).save(tmp_path / "mlp.plan")
    code, out, err = _main(
        capsys, plan, "-i", f"x={files['x']}", "--check-ort", "--repeat", 0, "--output-dir", tmp_path
    )
    assert code == 0, err
    (want,) = rt.InferenceSession(str(files["mlp"])).run(None, {"x": np.load(files["x"])})
    np.testing.assert_array_equal(np.load(tmp_path / "probs.npy"), want)
    if importlib.util.find_spec("onnxruntime") is not None:
        assert "skipped: the model is a saved opstrata plan" in out


def test_failing_kernel_is_one_line_exit_1(files, capsys, monkeypatch) -> None:
    import opstrata.graph as og

    def boom(node, args):
        raise FloatingPointError("overflow")

    monkeypatch.setitem(og.EXECUTOR_KERNELS, ("", "Softmax"), boom)
    code, _, err = _main(capsys, files["mlp"], "-i", f"x={files['x']}", "--level", 0, "--repeat", 0)
    assert code == 1
    (line,) = err.strip().splitlines()
    assert (
        line.startswith("opstrata run: a kernel failed: node ") and "Softmax" in line and "overflow" in line
    )


def test_unwritable_output_dir_is_one_line_exit_2(files, tmp_path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    code, _, err = _main(
        capsys, files["mlp"], "-i", f"x={files['x']}", "--repeat", 0, "--output-dir", blocker / "out"
    )
    assert code == 2
    (line,) = err.strip().splitlines()
    assert line.startswith("opstrata run: error: --output-dir: cannot write to") and "file/out" in line


def test_summary_of_special_values() -> None:
    line = _run.summarize("y", np.array([1.0, np.nan, -np.inf, 3.0], np.float32), values=2)
    assert line == "   y: float32[4]  min 1 max 3 mean 2  (2 NaN/inf)  [1, nan, ...]"
    assert _run.summarize("b", np.array([True, False])) == "   b: bool[2]  min 0 max 1 mean 0.5  [1, 0]"
    assert _run.summarize("e", np.zeros((0, 3), np.int64)) == "   e: int64[0, 3] (empty)"


# ---------------------------------------------------------------- bad input: one line, exit 2


BAD = {  # argv ({d}: the fixture directory) -> what the one stderr line must say
    "unknown name": (["{d}/mlp.onnx", "-i", "y={d}/x.npy"], ["unknown input 'y'", "inputs are x: float32[batch, 16]"]),
    "missing input": (["{d}/bert.onnx", "-i", "x={d}/bx.npy"], ["missing input(s) mask: float32[batch, seq]", "--random"]),
    "wrong dtype": (["{d}/mlp.onnx", "-i", "x={d}/x64.npy"], ["input 'x'", "x64.npy", "expected dtype float32, got float64"]),
    "wrong shape": (["{d}/mlp.onnx", "-i", "x={d}/x15.npy"], ["input 'x'", "expected shape float32[batch, 16], got [3, 15]"]),
    "unreadable file": (["{d}/mlp.onnx", "-i", "x={d}/junk.npy"], ["input 'x': cannot read", "junk.npy", "not a numeric"]),
    "no such file": (["{d}/mlp.onnx", "-i", "x={d}/nope.npy"], ["input 'x': no such file", "nope.npy"]),
    "corrupt model": (["{d}/corrupt.onnx", "--random"], ["model", "corrupt.onnx", "cannot be loaded", "not a valid ONNX"]),
    "no such model": (["{d}/nope.onnx"], ["model: no such file", "nope.onnx"]),
    "bad --input": (["{d}/mlp.onnx", "-i", "x"], ["--input expects NAME=VALUE, got 'x'"]),
    "bad --dim": (["{d}/mlp.onnx", "--random", "--dim", "batch=two"], ["--dim batch: expected a non-negative integer"]),
    "npz without the name": (["{d}/mlp.onnx", "-i", "x={d}/two.npz"], ["input 'x'", "holds arrays ['a', 'b'], none named 'x'"]),
    "dims disagree": (["{d}/bert.onnx", "-i", "x={d}/bx.npy", "-i", "mask={d}/mask3.npy"], ["input 'mask'", "'batch' is 3 here but 2"]),
    "given twice": (["{d}/mlp.onnx", "-i", "x={d}/x.npy", "-i", "x={d}/x64.npy"], ["input 'x' is given twice"]),
    "npy named .npz": (["{d}/mlp.onnx", "-i", "{d}/fake.npz"], ["holds one unnamed array", "use NAME="]),
    "bad device": (["{d}/mlp.onnx", "--random", "--device", "tpu9"], ["--device: unknown device 'tpu9'"]),
}  # fmt: skip


@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_is_one_line_exit_2(files, capsys, case: str) -> None:
    spec, needles = BAD[case]
    code, out, err = _main(capsys, *(a.format(d=files["dir"]) for a in spec))
    assert code == 2, (out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("opstrata run: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    assert "Traceback" not in out + err


def _subprocess(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run(
        [sys.executable, "-m", "opstrata.eval", "run", *map(str, args)],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_subprocess_run_and_errors(files, tmp_path) -> None:
    ok = _subprocess(
        files["mlp"], "-i", f"x={files['x']}", "--repeat", 1, "--output-dir", tmp_path, cwd=tmp_path
    )
    assert ok.returncode == 0, ok.stderr
    assert "probs: float32[3, 8]" in ok.stdout and (tmp_path / "probs.npy").is_file()
    for args, needle in (
        ((files["mlp"], "-i", f"x={files['x64']}"), "expected dtype float32, got float64"),
        ((files["corrupt"], "--random"), "not a valid ONNX model"),
    ):
        bad = _subprocess(*args, cwd=tmp_path)
        assert bad.returncode == 2 and needle in bad.stderr, bad.stderr
        assert "Traceback" not in bad.stderr and len(bad.stderr.strip().splitlines()) == 1
