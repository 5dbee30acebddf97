"""The model zoo: models built in code, exported by both torch.onnx exporters, checked against onnxruntime.

Tests that need torch, torchvision, transformers or onnxruntime skip cleanly without them (install
`opstrata-eval[zoo]`). A refusal by opstrata passes as long as it names its reason; a wrong answer or
a crash fails (so does a kernel failing at run time on feeds onnxruntime runs). The whole zoo runs
under `-m slow`; the default set runs squeezenet1_1 and resnet18 through both exporters (their numbers
are checked against onnxruntime) and gpt2 through both (right, or refused with a reason).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from opstrata.eval import _cli
from opstrata.eval.zoo import (
    EXPORTERS,
    MODELS,
    TOLERANCE_ORT,
    ExportError,
    UnknownModelError,
    ZooResult,
    _export,
    _runner,
    export_model,
    list_models,
    max_rel_error,
    run_model,
)
from opstrata.eval.zoo._table import markdown_table, missing_ops_line, summary_line

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch loads: no spinning OpenMP beside numpy

#: Models that run through both exporters today: their numbers are checked, not only their contract.
RUNS_BOTH = ("squeezenet1_1", "resnet18")
FAST = ("squeezenet1_1", "resnet18", "gpt2")


@pytest.fixture(scope="module")
def zoo_deps() -> None:
    """Skip unless every zoo dependency imports (torch, torchvision, transformers, onnx, onnxruntime)."""
    for name in ("torch", "torchvision", "transformers", "onnxscript", "onnx", "onnxruntime"):
        pytest.importorskip(name, reason=f"the zoo needs {name}: pip install './packages/eval[zoo]'")


_ROWS: dict[tuple[str, str], ZooResult] = {}


def _row(name: str, exporter: str) -> ZooResult:
    """run_model(name, exporter), computed once per test session."""
    key = (name, exporter)
    if key not in _ROWS:
        _ROWS[key] = run_model(name, exporter)
    return _ROWS[key]


def _check_contract(row: ZooResult) -> None:
    """A row is right, or declined with a reason; never wrong, never a crash, never silent."""
    assert row.status in ("ok", "refused", "export-failed"), f"{row.model}/{row.exporter}: {row}"
    if row.status == "ok":
        assert row.nodes and row.nodes > 0
        assert row.err_vs_torch is not None
        if row.err_vs_ort is None:  # onnxruntime could not run this export: said so, judged against torch
            assert row.notes, row
        else:
            assert row.err_vs_ort <= TOLERANCE_ORT, row
            assert row.ort_create_s is not None and row.ort_create_s > 0, row  # setup time side by side
        assert row.import_s is not None and row.compile_s is not None
    elif row.status == "refused":
        assert row.reason and "node" in row.reason, f"a refusal must name its node: {row}"
        assert row.nodes and row.nodes > 0
    else:
        assert row.reason and row.reason.startswith(f"{row.exporter} exporter:"), row


# ---------------------------------------------------------------- no torch needed


def test_table_lists_the_required_models() -> None:
    names = list_models()
    for name in ("resnet18", "mobilenet_v3_small", "efficientnet_b0", "vit_b_16", "gpt2", "bert", "llama"):
        assert name in names
    for spec in MODELS.values():
        assert len(spec.shapes) == 2 and spec.shapes[0][0] == 1 and spec.shapes[1][0] == 2
        assert spec.input_kind in ("image", "tokens")


@pytest.mark.parametrize("name", ["mobilenet_v3_small", "efficientnet_b0", "shufflenet_v2_x0_5"])
def test_lightweight_nets_have_logits_that_depend_on_the_input(zoo_deps, name: str) -> None:
    """He-normal weights: logits of a working scale (torchvision's init gave ~1e-10 / ~1e-13), differing
    between two images by more than 1% of that scale (ShuffleNet's were its bias to four digits)."""
    import torch

    from opstrata.eval.zoo._builders import build
    from opstrata.eval.zoo._export import example_input

    spec = MODELS[name]
    model = build(spec.builder)
    with torch.no_grad():
        a, b = (model(example_input(spec, (1, 3, 64, 64), seed=s)) for s in (0, 1))
    scale = float(torch.maximum(a.abs().max(), b.abs().max()))
    assert scale > 1e-3, scale
    assert float((a - b).abs().max()) > 0.01 * scale


def test_unknown_model_names_the_available_ones(tmp_path: Path) -> None:
    with pytest.raises(UnknownModelError) as info:
        run_model("resnet9000")
    assert "resnet9000" in str(info.value) and "resnet18" in str(info.value) and "gpt2" in str(info.value)
    with pytest.raises(UnknownModelError):
        export_model("resnet9000", "dynamo", tmp_path)


def test_unknown_exporter_is_refused(zoo_deps) -> None:
    with pytest.raises(ValueError, match="dynamo, torchscript"):
        run_model("squeezenet1_1", "onnxscript")


def test_max_rel_error_scales_by_the_reference() -> None:
    ref = np.array([[10.0, -20.0], [0.0, 5.0]], dtype=np.float32)
    assert max_rel_error(ref, ref) == 0.0
    assert max_rel_error(ref + np.array([[0, 0], [0.2, 0]], np.float32), ref) == pytest.approx(0.01)
    assert max_rel_error(ref[:1], ref) == float("inf")
    assert max_rel_error(np.array([np.nan, 1.0]), np.array([0.0, 1.0])) == float("inf")
    assert max_rel_error(np.zeros(3), np.zeros(3)) == 0.0


def test_cli_list_prints_every_model(capsys) -> None:
    assert _cli.main(["zoo", "list"]) == 0
    out = capsys.readouterr().out
    for name in MODELS:
        assert name in out


def test_cli_unknown_model_exits_2(capsys) -> None:
    assert _cli.main(["zoo", "run", "nosuchnet"]) == 2
    err = capsys.readouterr().err
    assert "nosuchnet" in err and "available models" in err and "resnet18" in err


def test_cli_without_subcommand_exits_2(capsys) -> None:
    assert _cli.main(["zoo"]) == 2
    assert "list or run" in capsys.readouterr().err


def test_tables_summarise_rows() -> None:
    rows = [
        ZooResult("a", "dynamo", nodes=3, err_vs_ort=1e-7, err_vs_torch=2e-7),
        ZooResult("b", "torchscript", status="refused", reason="node 'n|1': Foo", unsupported_ops=["Foo"]),
    ]
    md = markdown_table(rows)
    assert md.count("\n") == 3 and "node 'n\\|1': Foo" in md and "1.0e-07" in md
    assert summary_line(rows) == "2 rows: 1 ok, 1 refused"
    assert missing_ops_line(rows) == "ops to add: Foo (b/torchscript)"


# ---------------------------------------------------------------- end to end


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", FAST)
def test_fast_models_are_right_or_refused_with_a_reason(zoo_deps, name: str, exporter: str) -> None:
    row = _row(name, exporter)
    _check_contract(row)
    assert row.shapes == [tuple(s) for s in MODELS[name].shapes]


@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", RUNS_BOTH)
def test_models_match_onnxruntime_through_both_exporters(zoo_deps, name: str, exporter: str) -> None:
    row = _row(name, exporter)
    assert row.status == "ok", row
    assert row.err_vs_ort is not None and row.err_vs_ort <= TOLERANCE_ORT
    assert row.err_vs_torch is not None and row.err_vs_torch <= 1e-3
    assert row.ort_vs_torch is not None and row.ort_vs_torch <= 1e-3


@pytest.mark.parametrize("exporter", EXPORTERS)
def test_exported_file_runs_the_same_in_opstrata_and_onnxruntime(zoo_deps, tmp_path, exporter: str) -> None:
    """Independent of run_model's bookkeeping: load the exported file in both runtimes and compare."""
    import onnxruntime as ort

    from opstrata.runtime import InferenceSession

    path = export_model("squeezenet1_1", exporter, tmp_path)
    assert path == tmp_path / f"squeezenet1_1.{exporter}.onnx" and path.is_file()
    sess = InferenceSession(str(path))
    ref = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    assert [i.name for i in sess.get_inputs()] == ["pixel_values"]
    for batch in (1, 3):  # 3: the batch axis is dynamic beyond the shapes the zoo checks
        x = np.random.default_rng(batch).standard_normal((batch, 3, 64, 64)).astype(np.float32)
        got, want = sess.run(None, {"pixel_values": x})[0], ref.run(None, {"pixel_values": x})[0]
        assert got.shape == want.shape == (batch, 100)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("name", ["resnet18", "vit_b_16", "gpt2"])
def test_exported_models_run_wholly_on_a_device_with_its_own_memory(zoo_deps, tmp_path, name: str) -> None:
    """The stand-in for cuda (ops.testing; its kernels refuse host arrays): every float node on the device,
    the cpu session's outputs. The GPU runs the same placement (tools/gpu_check.sh)."""
    import opstrata.ops as ops
    import opstrata.ops.testing as ot
    from opstrata.runtime import InferenceSession

    if not hasattr(ot, "register_standin_device"):
        pytest.skip("opstrata-ops < 0.4.69 has no stand-in device")
    if not hasattr(InferenceSession, "run_on_device"):
        pytest.skip("opstrata-runtime < 0.5.48 runs no sessions on a device with its own memory")
    path = export_model(name, "torchscript", tmp_path)
    spec = MODELS[name]
    rng = np.random.default_rng(0)
    if spec.input_kind == "image":
        x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
    else:
        x = rng.integers(0, spec.vocab, (2, 16)).astype(np.int64)
    with ot.isolated_registry():
        dev = ot.register_standin_device("_zoo_standin")
        sess = InferenceSession(str(path), device=dev)
        feeds = {sess.get_inputs()[0].name: x}
        got = sess.run(None, feeds)[0]
        assert sess.device_fallbacks() == [], sess.device_fallbacks()
        assert ops.fallback_report().count(device=dev) == 0
    want = InferenceSession(str(path)).run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))


@pytest.mark.parametrize("mode", ["graph", "arena"])
@pytest.mark.parametrize("name", ["resnet18", "gpt2"])
def test_exported_models_replay_as_device_graphs(zoo_deps, tmp_path, name: str, mode: str) -> None:
    """enable_device_graph on the stand-in (its capture records kernel calls; a replay re-runs only those):
    the second run records, later runs replay with new feed values and give the cpu session's outputs.
    Eager runs instead (``arena``): the second run traces the kernels' allocations, later runs place every
    intermediate in one planned block (the stand-in copies each result there) and still give them."""
    import opstrata.ops as ops
    import opstrata.ops.testing as ot
    from opstrata.runtime import InferenceSession, SessionOptions

    if not hasattr(ops, "capturing") or "enable_device_graph" not in SessionOptions.__dataclass_fields__:
        pytest.skip("opstrata-ops < 0.4.75 / opstrata-runtime < 0.5.56 record no device graphs")
    if mode == "arena" and not hasattr(InferenceSession, "device_arenas"):
        pytest.skip("opstrata-runtime < 0.5.61 plans no device arenas")
    path = export_model(name, "torchscript", tmp_path)
    spec = MODELS[name]
    cpu = InferenceSession(str(path))
    with ot.isolated_registry():
        dev = ot.register_standin_device("_zoo_graphs")
        sess = InferenceSession(str(path), SessionOptions(enable_device_graph=mode == "graph"), device=dev)
        for seed in range(3 if mode == "graph" else 4):
            rng = np.random.default_rng(seed)
            if spec.input_kind == "image":
                x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
            else:
                x = rng.integers(0, spec.vocab, spec.shapes[-1]).astype(np.int64)
            feeds = {sess.get_inputs()[0].name: x}
            got, want = sess.run(None, feeds)[0], cpu.run(None, feeds)[0]
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5 * float(np.abs(want).max()))
        if mode == "graph":
            assert len(sess._device_program.recorded_signatures()) == 1
            return
        (arena,) = sess.device_arenas.values()
        assert arena.state == "serving" and arena.runs_served == 2 and arena.unplanned == 0, arena.summary()
        assert arena.lower_bound_bytes <= arena.arena_bytes < arena.traced_bytes


def test_bench_reports_a_latency_ratio(zoo_deps) -> None:
    row = run_model("squeezenet1_1", "torchscript", bench=True, threads=1, memory=True)
    assert row.status == "ok" and row.latency_ratio is not None and row.latency_ratio > 0
    if os.path.exists("/proc/self/clear_refs"):  # Linux: both sides' session memory measured
        assert row.peak_mib is not None and row.peak_mib > 0
        assert row.ort_peak_mib is None or row.ort_peak_mib > 0


def test_custom_shapes_are_used(zoo_deps) -> None:
    row = run_model("squeezenet1_1", "torchscript", shapes=[(3, 3, 64, 64)])
    assert row.status == "ok" and row.shapes == [(3, 3, 64, 64)]


# ---------------------------------------------------------------- error paths


def test_exporter_failure_is_recorded_with_the_exporter(zoo_deps, monkeypatch, tmp_path) -> None:
    def broken(*args: object) -> None:
        raise RuntimeError("no symbolic function for aten::frobnicate\nlong traceback text")

    monkeypatch.setattr(_export, "_export_dynamo", broken)
    row = run_model("squeezenet1_1", "dynamo", out_dir=tmp_path)
    assert row.status == "export-failed" and not row.failed
    assert row.reason == "dynamo exporter: RuntimeError: no symbolic function for aten::frobnicate"
    assert not list(tmp_path.glob("*.onnx"))
    with pytest.raises(ExportError, match="dynamo export of squeezenet1_1 failed"):
        export_model("squeezenet1_1", "dynamo", tmp_path)


def test_refusal_is_recorded_with_node_and_reason(zoo_deps, monkeypatch) -> None:
    from opstrata.graph import UnsupportedOpError

    def refuse(*args: object, **kwargs: object) -> None:
        raise UnsupportedOpError("HardSwish", "", 17, "/features/HardSwish", ["Relu"])

    monkeypatch.setattr(_runner.og, "from_onnx", refuse)
    row = run_model("squeezenet1_1", "torchscript")
    assert row.status == "refused" and row.refused and not row.failed
    assert "HardSwish" in row.reason and "/features/HardSwish" in row.reason
    assert "Fix:" in row.detail


def test_wrong_answer_fails_the_row_and_the_cli(zoo_deps, monkeypatch, capsys) -> None:
    real = _runner.InferenceSession

    class Skewed(real):  # type: ignore[misc, valid-type]
        """An InferenceSession whose outputs are off by 1% of their magnitude."""

        def run(self, output_names, input_feed, run_options=None):  # type: ignore[override]
            return [o + 0.01 * np.abs(o).max() for o in super().run(output_names, input_feed, run_options)]

    monkeypatch.setattr(_runner, "InferenceSession", Skewed)
    row = run_model("squeezenet1_1", "torchscript")
    assert row.status == "wrong" and row.failed
    assert "exceeds 0.0001" in row.reason and "onnxruntime" in row.reason
    assert _cli.main(["zoo", "run", "squeezenet1_1", "--exporter", "torchscript"]) == 1
    assert "wrong" in capsys.readouterr().out


def _failing_session(monkeypatch: pytest.MonkeyPatch, cause: Exception) -> None:
    """Make run_model's InferenceSession fail every run with an ExecutionError caused by `cause`."""
    from opstrata.runtime import ExecutionError

    class Failing(_runner.InferenceSession):  # type: ignore[misc, valid-type]
        """An InferenceSession whose every run fails in a kernel."""

        def run(self, output_names, input_feed, run_options=None):  # type: ignore[override]
            err = ExecutionError("node 'conv1' (Conv)", f"kernel conv failed: {cause}", "report the model")
            raise err from cause

    monkeypatch.setattr(_runner, "InferenceSession", Failing)


def test_kernel_failure_on_feeds_onnxruntime_runs_is_a_crash(zoo_deps, monkeypatch) -> None:
    from opstrata.ops import OpError

    _failing_session(monkeypatch, OpError("gather", "indices", "values in [-2, 1]", "4341691758739196362"))
    row = run_model("squeezenet1_1", "torchscript")
    assert row.status == "crashed" and row.failed
    assert row.reason.startswith("failed at run time on feeds onnxruntime runs: node 'conv1' (Conv)")


def test_missing_kernel_at_run_time_is_a_refusal(zoo_deps, monkeypatch) -> None:
    from opstrata.ops import NoKernelError

    _failing_session(monkeypatch, NoKernelError("conv", "cpu", np.dtype("float32"), {"ref": "float64"}))
    row = run_model("squeezenet1_1", "torchscript")
    assert row.status == "refused" and not row.failed and "node 'conv1' (Conv)" in row.reason


def _ort_failing_at_batch(monkeypatch: pytest.MonkeyPatch, batch: int) -> None:
    """Make onnxruntime fail at inputs of batch `batch`, as on a file whose exporter baked that dimension."""
    real = _runner._ort_session

    class Baked:
        def __init__(self, sess: object) -> None:
            self.sess = sess

        def run(self, names, feed):  # type: ignore[no-untyped-def]
            if next(iter(feed.values())).shape[0] == batch:
                raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : Reshape node '/Reshape_4': baked shape")
            return self.sess.run(names, feed)

    monkeypatch.setattr(_runner, "_ort_session", lambda path, threads: Baked(real(path, threads)))


def test_shapes_both_runtimes_fail_mark_the_export_as_failed(zoo_deps, monkeypatch) -> None:
    from opstrata.runtime import ExecutionError

    _ort_failing_at_batch(monkeypatch, 1)

    class Baked(_runner.InferenceSession):  # type: ignore[misc, valid-type]
        def run(self, output_names, input_feed, run_options=None):  # type: ignore[override]
            if next(iter(input_feed.values())).shape[0] == 1:
                raise ExecutionError(
                    "node '/Reshape_4' (Reshape)", "kernel reshape failed", "check the feeds"
                )
            return super().run(output_names, input_feed, run_options)

    monkeypatch.setattr(_runner, "InferenceSession", Baked)
    row = run_model("squeezenet1_1", "torchscript")
    assert row.status == "export-failed" and not row.failed, row
    assert "both fail at input [1, 3, 64, 64]" in row.reason and "[2, 3, 64, 64]" in row.reason
    assert row.err_vs_ort is not None and row.err_vs_ort <= TOLERANCE_ORT


def test_running_where_onnxruntime_fails_is_wrong(zoo_deps, monkeypatch) -> None:
    _ort_failing_at_batch(monkeypatch, 2)
    row = run_model("squeezenet1_1", "torchscript")
    assert row.status == "wrong" and row.failed
    assert row.reason == "opstrata gives an output [2, 100] at input [2, 3, 64, 64], where onnxruntime fails"


def test_crash_is_not_a_refusal(zoo_deps, monkeypatch) -> None:
    def crash(*args: object, **kwargs: object) -> None:
        raise IndexError("tuple index out of range")

    monkeypatch.setattr(_runner.og, "compile", crash)
    row = run_model("squeezenet1_1", "torchscript")
    assert row.status == "crashed" and row.failed and "IndexError" in row.reason


# ---------------------------------------------------------------- the command


def test_cli_runs_one_model(zoo_deps, tmp_path, capsys) -> None:
    argv = ["zoo", "run", "squeezenet1_1", "--exporter", "torchscript", "--out", str(tmp_path)]
    assert _cli.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:3] == ["model", "exporter", "status"]
    assert out[1].split()[:3] == ["squeezenet1_1", "torchscript", "ok"]
    assert out[2] == "1 rows: 1 ok"
    assert (tmp_path / "squeezenet1_1.torchscript.onnx").is_file()


def test_cli_strict_makes_refusals_exit_1(zoo_deps, monkeypatch, capsys) -> None:
    from opstrata.graph import UnsupportedOpError

    def refuse(*args: object, **kwargs: object) -> None:
        raise UnsupportedOpError("Mod", "", 17, "/attn/Mod", [])

    monkeypatch.setattr(_runner.og, "from_onnx", refuse)
    argv = ["zoo", "run", "squeezenet1_1", "--exporter", "torchscript"]
    assert _cli.main(argv) == 0
    assert "ops to add: Mod (squeezenet1_1/torchscript)" in capsys.readouterr().out
    assert _cli.main([*argv, "--strict"]) == 1


def test_cli_json_rows(zoo_deps, capsys) -> None:
    assert _cli.main(["zoo", "run", "squeezenet1_1", "--exporter", "torchscript", "--format", "json"]) == 0
    captured = capsys.readouterr()
    rows = json.loads(captured.out)
    assert len(rows) == 1 and rows[0]["model"] == "squeezenet1_1" and rows[0]["status"] == "ok"
    assert "1 rows: 1 ok" in captured.err


# ---------------------------------------------------------------- decode on the paged KV cache


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_decode_bench_agrees_with_torch_and_times_both_sides(zoo_deps, name: str) -> None:
    from opstrata.eval.zoo._decode import decode_bench

    row = decode_bench(name, prompt=8, new_tokens=5, rounds=1)
    assert row.err_vs_torch is not None and row.err_vs_torch < 1e-5 and not row.wrong, row
    assert row.same_tokens is True
    assert row.ms_per_token > 0 and row.torch_ms_per_token > 0
    assert row.ratio == pytest.approx(row.ms_per_token / row.torch_ms_per_token)


def test_decoder_weights_from_the_zoo_models_give_torch_logits(zoo_deps) -> None:
    import torch

    from opstrata.eval.zoo._builders import build
    from opstrata.runtime import DecoderWeights, InferenceSession

    ids = np.random.default_rng(1).integers(0, 1000, (2, 11))
    for name in ("gpt2", "llama"):
        hf = build(name).inner
        w = DecoderWeights.from_transformers(hf)
        with torch.no_grad():
            want = hf(input_ids=torch.from_numpy(ids), use_cache=False).logits.numpy()
        (got,) = InferenceSession(w.to_onnx()).run(None, {"ids": ids})
        assert max_rel_error(got, want) < 1e-5, name


def test_decode_bench_bad_arguments_are_named(zoo_deps) -> None:
    from opstrata.eval.zoo._decode import decode_bench

    with pytest.raises(ValueError, match="decoders"):
        decode_bench("bert")
    with pytest.raises(ValueError, match="threads"):
        decode_bench("gpt2", threads=0)
    with pytest.raises(ValueError, match="exceeds gpt2's 128 positions"):
        decode_bench("gpt2", prompt=100, new_tokens=40)


def test_cli_bench_prints_the_decode_table(zoo_deps, monkeypatch, capsys) -> None:
    from opstrata.eval.zoo import _decode

    real = _decode.decode_bench
    monkeypatch.setattr(_decode, "decode_bench", lambda name, threads: real(name, threads, 8, 4, 1))
    monkeypatch.setattr(_runner, "interleaved_medians", lambda a, b, **kw: (1.0, 1.0))
    assert _cli.main(["zoo", "run", "gpt2", "--exporter", "dynamo", "--bench"]) == 0
    out = capsys.readouterr().out
    assert "decode, per token on the paged KV cache vs torch eager" in out
    row = next(line for line in out.splitlines() if line.startswith("gpt2 ") and " 8 " in line)
    assert row.split()[:4] == ["gpt2", "1", "8", "4"] and row.split()[8] == "yes"


def test_cli_decode_failure_is_a_row_and_exits_1(zoo_deps, monkeypatch, capsys) -> None:
    from opstrata.eval.zoo import _decode

    def broken(name: str, threads: int) -> None:
        raise RuntimeError("cache exploded")

    monkeypatch.setattr(_decode, "decode_bench", broken)
    monkeypatch.setattr(_runner, "interleaved_medians", lambda a, b, **kw: (1.0, 1.0))
    assert _cli.main(["zoo", "run", "llama", "--exporter", "dynamo", "--bench", "--format", "json"]) == 1
    captured = capsys.readouterr()
    (row,) = json.loads(captured.out)
    assert row["decode"]["notes"] == ["decode bench failed: RuntimeError: cache exploded"]
    assert "decode logits disagree with torch (or were not compared): llama" in captured.err


# ---------------------------------------------------------------- the whole zoo


@pytest.mark.slow
@pytest.mark.parametrize("exporter", EXPORTERS)
@pytest.mark.parametrize("name", [n for n in MODELS if n not in FAST])
def test_every_model_is_right_or_refused_with_a_reason(zoo_deps, name: str, exporter: str) -> None:
    _check_contract(_row(name, exporter))


def test_interleaved_medians_takes_turns_in_blocks_with_an_untimed_first_call() -> None:
    """Turns alternate which side goes first; a block turn starts with one untimed call and each side's
    median is over its own timed calls only."""
    from opstrata.eval.zoo._bench import interleaved_medians

    calls: list[str] = []

    def side(name: str, seconds: float) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            time.sleep(seconds)

        return run

    a, b = interleaved_medians(side("a", 0.004), side("b", 0.001), repeats=3, warmup=0, block=2, settle_s=0.0)
    assert calls == ["a"] * 3 + ["b"] * 3 + ["b"] * 3 + ["a"] * 3 + ["a"] * 3 + ["b"] * 3
    assert a > b >= 0.001 and a >= 0.004
    calls.clear()
    interleaved_medians(side("a", 0.0), side("b", 0.0), repeats=3, warmup=1)  # block 1: no untimed call
    assert calls == ["a", "b", "a", "b", "b", "a", "a", "b"]


def test_interleaved_medians_warms_each_turn_for_warm_s_before_timing() -> None:
    """With warm_s, a block turn makes untimed calls for that long (not just one) before its timed calls."""
    from opstrata.eval.zoo._bench import interleaved_medians

    calls: list[str] = []

    def side(name: str) -> Callable[[], None]:
        def run() -> None:
            calls.append(name)
            time.sleep(0.002)

        return run

    interleaved_medians(side("a"), side("b"), repeats=3, warmup=0, block=2, warm_s=0.02)
    turns = [calls[i] for i in range(len(calls)) if i == 0 or calls[i] != calls[i - 1]]
    assert turns == ["a", "b", "a", "b"]  # a b | b a | a b, neighbours merged
    per_turn = len(calls) / 6
    assert per_turn >= 2 + 5, per_turn  # >= 20 ms of 2 ms calls untimed, then the 2 timed ones
