"""`opstrata conformance ops`: the cpu device agrees with ref; a deliberately wrong kernel deviates."""

from __future__ import annotations

import json
from collections.abc import Iterator

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
from opstrata.eval import _cli, _conformance, conformance_ops
from opstrata.eval._conformance_samples import SAMPLES, Gen


@pytest.fixture
def wrong_relu() -> Iterator[object]:
    """A float32 relu on cpu that is 1% off, registered above the real one for the test's duration."""

    def bad(x: np.ndarray) -> np.ndarray:
        return np.maximum(x, x.dtype.type(0)) * x.dtype.type(1.01)

    ops.register("relu", device="cpu", dtypes=[np.float32], priority=100)(bad)
    try:
        yield bad
    finally:
        ops.unregister("relu", device="cpu", kernel=bad)


def test_a_wrong_kernel_deviates_with_a_reproducer(wrong_relu, tmp_path) -> None:
    report = conformance_ops("cpu", op_names=["relu"], dtypes=["float32", "float64"], out_dir=tmp_path)
    bad, good = report.cells[("relu", "float32")], report.cells[("relu", "float64")]
    assert bad.status == "deviates" and good.status == "native"
    assert bad.max_error == pytest.approx(0.01, rel=1e-3) and "outside float32 tolerance" in bad.detail
    data = np.load(bad.repro)
    assert list(data["meta"]) == ["relu", "cpu", "ref", bad.detail.split(":")[0]]
    with ops.device("cpu"):  # the file reproduces the deviation
        again = ops.relu(data["arg0"])
    np.testing.assert_array_equal(again, data["actual0"])
    assert not np.allclose(again, data["expected0"])


def test_cli_matrix_exit_1_on_a_deviation(wrong_relu, tmp_path, capsys) -> None:
    code = _cli.main(
        ["conformance", "ops", "--ops", "relu,abs", "--dtypes", "float32,int8", "--out", str(tmp_path)]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "relu  DEV" in out and "abs   ok" in out
    assert "DEVIATES relu float32" in out and str(tmp_path) in out


def test_cpu_agrees_with_ref_on_common_ops(tmp_path, capsys) -> None:
    names = ["abs", "add", "matmul", "softmax", "exp", "sum", "transpose", "gelu"]
    report = conformance_ops("cpu", op_names=names, out_dir=tmp_path)
    assert not report.deviations, report.deviations
    assert report.cells[("matmul", "float32")].status == "native"
    assert report.cells[("matmul", "float32")].variants >= 4  # normal, size-1, empty, broadcast, nan/inf, ...
    assert report.cells[("exp", "int32")].status == "missing"
    code = _cli.main(
        ["conformance", "ops", "--ops", ",".join(names), "--format", "json", "--out", str(tmp_path)]
    )
    data = json.loads(capsys.readouterr().out)
    assert code == 0 and data["ops"]["add"]["bfloat16"]["status"] == "native"
    assert not list(tmp_path.iterdir())  # no deviation, no reproducer


def test_ops_without_a_generated_sample_are_listed_not_judged(monkeypatch) -> None:
    monkeypatch.delitem(_conformance.SAMPLES, "where")  # no table entry: back to the shape search
    cell = conformance_ops("cpu", op_names=["where"], dtypes=["float32"]).cells[("where", "float32")]
    assert cell.status == "no-sample" and "3 required tensor arguments" in cell.detail
    assert cell.variants == 0 and cell.max_error == 0.0


def test_a_dtype_the_reference_refuses_is_a_candidate_error_not_a_finding() -> None:
    report = conformance_ops(
        "cpu", op_names=["hann_window", "dequantize_linear"], dtypes=["float32", "int32"]
    )
    cell = report.cells[("hann_window", "float32")]  # the size argument must be an int
    assert cell.status == "no-sample" and "ref refuses every float32 sample" in cell.detail
    assert "expected an int" in cell.detail
    assert report.cells[("hann_window", "int32")].status == "native"
    assert report.cells[("dequantize_linear", "float32")].status == "no-sample"
    assert report.cells[("dequantize_linear", "int32")].status == "native"
    assert not report.deviations


def test_bad_input(capsys) -> None:
    with pytest.raises(ValueError, match=r"unknown op\(s\) \['nope'\]"):
        conformance_ops("cpu", op_names=["nope"])
    with pytest.raises(ValueError, match="unknown device 'tpu'; registered devices are"):
        conformance_ops("tpu")
    assert _cli.main(["conformance", "ops", "--dtypes", "float33"]) == 2
    assert "unknown dtype 'float33'" in capsys.readouterr().err


def test_onnx_backend_node_tests_through_the_runtimes_runner(capsys) -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    assert _cli.main(["conformance", "onnx", "--ops", "Relu", "--against", "onnxruntime"]) == 0
    out = capsys.readouterr().out
    assert "| Relu | 2 | 2 | 2 | 2 | 2/2 |" in out and "wrong answers: 0" in out
    assert _cli.main(["conformance", "onnx", "--ops", "Nope"]) == 2
    assert "no backend node tests for ['Nope']" in capsys.readouterr().err
    assert _cli.main(["conformance", "onnx", "--against", "ref"]) == 2
    assert "--against must be onnxruntime or omitted" in capsys.readouterr().err


# ---- the per-op sample table -----------------------------------------------------------------------

#: Ops that took no generated input before the sample table; each must now be judged on cpu.
TABLE_OPS = [
    "concat", "split", "slice", "reshape", "expand", "tile", "pad", "where", "clip", "cast", "gather",
    "gather_elements", "gather_nd", "scatter_elements", "scatter_nd", "one_hot", "embedding", "cumsum",
    "top_k", "batch_norm", "group_norm", "avg_pool2d", "max_pool_nd", "conv_transpose_nd", "attention",
    "attention_onnx", "rotary_embedding", "linear_attention", "resize", "grid_sample", "roi_align",
    "quantize_linear", "layer_norm_backward", "dft", "stft", "recurrent", "adamw_step",
]  # fmt: skip


def test_the_sample_table_judges_ops_the_shape_search_could_not() -> None:
    report = conformance_ops("cpu", op_names=TABLE_OPS, dtypes=["float32"])
    for op in TABLE_OPS:
        cell = report.cells[(op, "float32")]
        assert cell.status == "native", (op, cell)
        assert cell.variants >= 2, (op, cell)  # more than one generated input ran on both sides
    assert (
        report.cells[("attention", "float32")].variants >= 7
    )  # normal ... nan/inf, extreme, causal, mask, lse
    assert report.cells[("top_k", "float32")].variants >= 5


def test_integer_only_ops_are_judged_on_their_dtypes() -> None:
    names = [
        "bitwise_and",
        "bitwise_not",
        "bit_shift",
        "matmul_integer",
        "qlinear_matmul",
        "dequantize_linear",
    ]
    report = conformance_ops("cpu", op_names=names, dtypes=["int8", "uint8", "float32"])
    for op in names:
        assert report.cells[(op, "uint8")].status == "native", (op, report.cells[(op, "uint8")])
    assert report.cells[("bitwise_and", "float32")].status == "missing"
    assert not report.deviations


@pytest.fixture
def wrong_pad() -> Iterator[object]:
    """A float32 pad on cpu that ignores ``value`` (always pads with 0): only a kwarg reveals it."""

    def bad(x: np.ndarray, pads: list[int], *, mode: str = "constant", value: object = 0) -> np.ndarray:
        return ops.pad(x, pads, mode=mode, value=0, device="ref")

    ops.register("pad", device="cpu", dtypes=[np.float32], priority=100)(bad)
    try:
        yield bad
    finally:
        ops.unregister("pad", device="cpu", kernel=bad)


def test_a_wrong_table_kernel_deviates_with_a_replayable_reproducer(wrong_pad, tmp_path) -> None:
    report = conformance_ops("cpu", op_names=["pad"], dtypes=["float32", "float64"], out_dir=tmp_path)
    bad, good = report.cells[("pad", "float32")], report.cells[("pad", "float64")]
    assert bad.status == "deviates" and good.status == "native" and good.variants >= 8
    assert bad.detail.startswith(("normal:", "size-1 dim:", "nan/inf:", "extreme:", "full-range:"))
    rep = _conformance.load_reproducer(bad.repro)
    assert (rep.op, rep.device, rep.against) == ("pad", "cpu", "ref")
    assert rep.args[1] == [0, 1, 0, 0, 2, 3] and float(rep.kwargs["value"]) == 1.0  # the kwarg survived
    again = _conformance.replay_reproducer(bad.repro)  # on cpu: the deviation comes back
    np.testing.assert_array_equal(again[0], rep.actual[0])
    assert not np.allclose(again[0], rep.expected[0], equal_nan=True)
    np.testing.assert_array_equal(_conformance.replay_reproducer(bad.repro, device="ref")[0], rep.expected[0])


@pytest.fixture
def wrong_top_k_indices() -> Iterator[object]:
    """A cpu top_k whose values are right but whose indices are reversed: the second output is wrong."""

    def bad(x: np.ndarray, *, k: int, axis: int = -1, largest: bool = True, sorted: bool = True) -> tuple:
        vals, idx = ops.top_k(x, k=k, axis=axis, largest=largest, sorted=sorted, device="ref")
        return vals, np.flip(idx, axis=axis).copy()

    ops.register("top_k", device="cpu", dtypes=[np.float32], priority=100)(bad)
    try:
        yield bad
    finally:
        ops.unregister("top_k", device="cpu", kernel=bad)


def test_every_output_of_a_multi_output_op_is_compared(wrong_top_k_indices, tmp_path) -> None:
    cell = conformance_ops("cpu", op_names=["top_k"], dtypes=["float32"], out_dir=tmp_path).cells[
        ("top_k", "float32")
    ]
    assert cell.status == "deviates" and "output 1:" in cell.detail
    rep = _conformance.load_reproducer(cell.repro)
    assert rep.kwargs["k"] == 3 and set(rep.actual) == {0, 1}
    np.testing.assert_array_equal(rep.actual[0], rep.expected[0])  # the values agree ...
    assert not np.array_equal(rep.actual[1], rep.expected[1])  # ... the indices do not


@pytest.fixture
def noisy_reference() -> Iterator[str]:
    """A reference device whose relu adds fresh noise on every call (a random op)."""
    rng = np.random.default_rng()

    def noisy(x: np.ndarray) -> np.ndarray:
        return np.maximum(x, 0) + rng.random(x.shape).astype(x.dtype)

    ops.register("relu", device="noisy", dtypes=[np.float32])(noisy)
    try:
        yield "noisy"
    finally:
        ops.unregister("relu", device="noisy", kernel=noisy)


def test_a_random_reference_is_listed_unjudged_not_ok(noisy_reference) -> None:
    cell = conformance_ops("cpu", against=noisy_reference, op_names=["relu"], dtypes=["float32"]).cells[
        ("relu", "float32")
    ]
    assert cell.status == "no-sample" and cell.detail.startswith("random:") and cell.variants == 0


def test_every_table_op_has_a_function_and_known_variants() -> None:
    known = {"normal", "size-1 dim", "empty dim", "broadcast", "nan/inf", "extreme", "full-range"}
    for op, entry in SAMPLES.items():
        assert op in ops.list_ops(), op
        assert _conformance._callable(op) is not None, op
        assert entry.variants[0] == "normal", op
        assert known & set(entry.variants), op


#: float32 ops whose reference refuses float32 by design (an int size, or integer-only data).
_REFUSE_FLOAT32 = {"hann_window", "hamming_window", "blackman_window", "mel_weight_matrix", "dequantize_linear",
                   "qlinear_matmul", "qlinear_conv", "bit_shift", "bitwise_and", "bitwise_or", "bitwise_xor",
                   "bitwise_not", "matmul_integer", "conv_integer", "qconv"}  # fmt: skip


@settings(max_examples=4, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1))
def test_sample_builders_give_inputs_the_reference_accepts_for_any_seed(seed: int) -> None:
    """Index tensors in range, matching weight shapes, valid modes: the ref runs every op's normal sample."""
    f32 = np.dtype(np.float32)
    for op, entry in sorted(SAMPLES.items()):
        if op in _REFUSE_FLOAT32:
            continue
        fn = _conformance._callable(op)
        cases, failed = _conformance._table_cases(entry, f32, seed)
        assert not failed, (op, failed)
        assert cases[0][0] == "normal"
        want = _conformance._reference(fn, "ref", cases[0], entry.inplace)  # CandidateError fails the test
        again, _ = _conformance._table_cases(entry, f32, seed)  # seeded: the same inputs again
        assert _conformance._same(want, _conformance._reference(fn, "ref", again[0], entry.inplace)), op


def test_variant_shapes_follow_the_variant() -> None:
    rng = np.random.default_rng(0)
    shapes = {v: SAMPLES["gather"].build(Gen(np.dtype(np.float32), rng, v))[0][0].shape
              for v in ("normal", "size-1 dim", "empty dim")}  # fmt: skip
    assert shapes == {"normal": (2, 5), "size-1 dim": (1, 5), "empty dim": (0, 5)}
    (x, idx), _ = SAMPLES["gather"].build(Gen(np.dtype(np.float32), rng, "negative indices"))
    assert idx.min() >= -x.shape[1] and idx.max() < x.shape[1]
    (nan,), _ = SAMPLES["clip"].build(Gen(np.dtype(np.float32), rng, "nan/inf"))
    assert np.isnan(nan).any() and np.isinf(nan).any()


# --------------------------------------------------------------------------- hypothesis search


@pytest.fixture
def relu_wrong_on_threes() -> Iterator[object]:
    """A float32 cpu relu that is wrong only when a dim has 3 elements: no fixed variant has one."""

    def bad(x: np.ndarray) -> np.ndarray:
        y = np.maximum(x, x.dtype.type(0))
        return y + x.dtype.type(1) if 3 in x.shape else y

    ops.register("relu", device="cpu", dtypes=[np.float32], priority=100)(bad)
    try:
        yield bad
    finally:
        ops.unregister("relu", device="cpu", kernel=bad)


def test_the_search_finds_what_the_fixed_variants_miss_and_shrinks_it(relu_wrong_on_threes, tmp_path) -> None:
    fixed = conformance_ops("cpu", op_names=["relu"], dtypes=["float32"], out_dir=tmp_path)
    assert fixed.cells[("relu", "float32")].status == "native"  # (4, 4), (1, 4), (0, 4): no 3 anywhere
    # seeded (reproducible on any install); enough examples that a dim of 3 (about one drawn shape in
    # three) is drawn whatever the seed
    searched = conformance_ops("cpu", op_names=["relu"], dtypes=["float32"], out_dir=tmp_path, examples=200)
    cell = searched.cells[("relu", "float32")]
    assert cell.status == "deviates" and cell.detail.startswith("hypothesis (shrunk) input of shape(s) [")
    rep = _conformance.load_reproducer(cell.repro)  # shrunk to the smallest input that shows it: 3 elements
    assert 3 in rep.args[0].shape and rep.args[0].size == 3 and rep.variant == "hypothesis (shrunk)"
    got = _conformance.replay_reproducer(cell.repro)
    np.testing.assert_array_equal(got[0], np.maximum(rep.args[0], 0) + 1)


def test_the_search_keeps_agreeing_kernels_native_and_is_reproducible() -> None:
    names = ["add", "abs", "relu", "sum"]
    a = conformance_ops("cpu", op_names=names, dtypes=["float32", "int32"], examples=15)
    b = conformance_ops("cpu", op_names=names, dtypes=["float32", "int32"], examples=15)
    assert not a.deviations and {(c.op, c.dtype): c.status for c in a.cells.values()} == {
        (c.op, c.dtype): c.status for c in b.cells.values()
    }
    assert a.cells[("add", "float32")].variants >= 15 + 4  # the fixed variants, then the drawn inputs


def test_examples_bad_value_and_missing_hypothesis(monkeypatch, capsys) -> None:
    with pytest.raises(ValueError, match="examples must be an int >= 0"):
        conformance_ops("cpu", op_names=["abs"], examples=-1)
    import builtins

    real_import = builtins.__import__

    def no_hypothesis(name, *args, **kwargs):
        if name == "hypothesis" or name.startswith("hypothesis."):
            raise ImportError("No module named 'hypothesis'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_hypothesis)
    code = _cli.main(["conformance", "ops", "--ops", "abs", "--dtypes", "float32", "--examples", "5"])
    assert code == 2
    assert "pip install 'opstrata-eval[conformance]'" in capsys.readouterr().err


@pytest.mark.skipif(not hasattr(ops, "device_memory"), reason="opstrata-ops < 0.4.69 has no device memories")
def test_a_device_with_its_own_memory_runs_the_matrix_on_device_arrays() -> None:
    """The stand-in for cuda (its kernels refuse host arrays): every cuda op agrees with ref."""
    import opstrata.ops.testing as ot

    if not hasattr(ot, "register_standin_device"):
        pytest.skip("opstrata-ops < 0.4.69 has no stand-in device")
    from opstrata.ops._cuda import CudaOps, op_table

    with ot.isolated_registry():
        dev = ot.register_standin_device("_conf_standin")
        names = sorted(op_table(CudaOps(np, erf=np.tanh)))
        report = conformance_ops(dev, op_names=names, dtypes=["float32", "bfloat16"])
    assert not report.deviations, report.deviations
    assert report.cells[("softmax", "float32")].status == "native"
    assert report.cells[("relu", "float32")].variants >= 3  # nan/inf among them: relu(-inf) is 0
