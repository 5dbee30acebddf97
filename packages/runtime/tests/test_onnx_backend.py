"""The whole ONNX backend node test suite through InferenceSession, beside onnxruntime (docs/onnx-backend.md).

tests/data/onnx_backend_expected.txt lists the cases that pass (as shipped, or adapted: run-time
axes/shape inputs frozen); each must keep passing. Every other case must fail with a clear, named
RuntimeFailure — never a wrong answer, never a stray exception. float8/float4/int2 cases are skipped, and
random ops' cases are run but checked for shape and dtype only.
Regenerate the list and the doc with ``python packages/runtime/benchmarks/onnx_backend.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("onnx.backend.test.case.node")

import opstrata.graph as og
from opstrata.runtime import onnx_backend

EXPECTED_FILE = Path(__file__).parent / "data" / "onnx_backend_expected.txt"

try:
    import onnxruntime  # noqa: F401

    HAVE_ORT = True
except ImportError:  # the opstrata side still runs; the onnxruntime column is left out
    HAVE_ORT = False


def _expected() -> dict[str, str]:
    rows = (line.split() for line in EXPECTED_FILE.read_text(encoding="utf-8").splitlines() if line.strip())
    return {name: status for name, status in rows}


EXPECTED = _expected()

#: The onnx whose backend cases the list above was made from (docs/onnx-backend.md). An older onnx (the
#: lowest session installs the declared minimum) ships fewer cases and, for a few, outdated outputs.
LIST_ONNX = "1.23.2"
#: Cases whose expected outputs an older onnx ships wrong -> the first onnx with corrected (or no) data,
#: found by comparing each case's data across onnx releases 1.16 ... 1.23.
STALE_DATA = {
    # onnx 1.16/1.17: outputs of the AveragePool reference before its ceil_mode + dilations fix
    "test_averagepool_3d_dilations_large_count_include_pad_is_1_ceil_mode_is_True": "1.18",
    # onnx <= 1.21: int8 outputs that onnx 1.22 recomputed (the uint8 cases' data is unchanged)
    "test_qlinearmatmul_2D_int8_float16": "1.22",
    "test_qlinearmatmul_2D_int8_float32": "1.22",
    "test_qlinearmatmul_3D_int8_float16": "1.22",
    "test_qlinearmatmul_3D_int8_float32": "1.22",
    # onnx <= 1.18 expects numpy's shortest repr ('0.6048455'); the spec does not pin float-to-string
    # digits and onnx 1.19 dropped the cases; opstrata writes 9 significant digits ('0.60484552')
    "test_cast_FLOAT_to_STRING": "1.19",
    "test_castlike_FLOAT_to_STRING": "1.19",
}


def _onnx_older(version: str) -> bool:
    import onnx
    from packaging.version import Version

    return Version(onnx.__version__) < Version(version)


def _stale(name: str) -> bool:
    """Whether the installed onnx ships outdated expected outputs for case ``name`` (see STALE_DATA; an
    ``_expanded`` case, the op's function body, shares its op case's data)."""
    base = name.removesuffix("_expanded")
    return base in STALE_DATA and _onnx_older(STALE_DATA[base])


@pytest.fixture(scope="module")
def results() -> dict[str, onnx_backend.CaseResult]:
    """Every backend node case of the installed onnx, run once for the module (about 10 s + 5 s with ort)."""
    return {r.name: r for r in onnx_backend.run_cases(versus_ort=HAVE_ORT)}


def _case(name: str) -> tuple[str, object]:
    return next((op, c) for op, c in onnx_backend.collect_cases() if c.name == name)


def test_the_whole_suite_runs(results) -> None:
    ops = {r.op for r in results.values()}
    assert len(ops) == len(onnx_backend.suite_ops()) > 150  # every op with a node test, not a fixed list
    assert {"Relu", "Scan", "LabelEncoder", "Resize"} <= ops
    present = [n for n in EXPECTED if n in results]
    if len(present) < 0.9 * len(EXPECTED) and _onnx_older(LIST_ONNX):
        import onnx

        pytest.skip(
            f"installed onnx {onnx.__version__} ships {len(present)} of the {len(EXPECTED)} cases listed from "
            f"onnx {LIST_ONNX}: the presence check needs that onnx or newer (the cases it has still ran above)"
        )
    assert len(present) >= 0.9 * len(EXPECTED), f"only {len(present)} of {len(EXPECTED)} listed cases exist"


def test_listed_cases_still_pass(results) -> None:
    regressed = {
        n: f"{r.op} {r.status}: {r.detail[:200]}"
        for n, r in results.items()
        if n in EXPECTED and not (r.status == "pass" or r.status == EXPECTED[n]) and not _stale(n)
    }
    assert not regressed, f"{len(regressed)} listed cases no longer pass: {regressed}"


def test_no_wrong_answer_and_no_stray_exception(results) -> None:
    bad = {
        n: (r.op, r.status, r.detail[:300])
        for n, r in results.items()
        if r.status in ("wrong", "crash") and not (r.status == "wrong" and _stale(n))
    }
    assert not bad, bad


def test_unsupported_cases_fail_with_a_named_error_and_a_fix(results) -> None:
    unsupported = [r for r in results.values() if r.status == "unsupported"]
    assert unsupported  # the installed onnx has cases opstrata refuses: they must be refused clearly
    for r in unsupported:
        assert "Fix:" in r.detail, r
        assert any(w in r.detail for w in ("node '", "graph input '", "graph '", "from_onnx")), r
        assert r.reason and len(r.reason) < 130, r


def test_float8_float4_cases_are_skipped_with_the_reason(results) -> None:
    for name in ("test_cast_FLOAT_to_FLOAT8E4M3FN", "test_cast_FLOAT_to_FLOAT4E2M1"):
        if name in results:
            assert results[name].status == "skipped" and "float8/float6/float4/int2" in results[name].reason
    assert results["test_cast_FLOAT_to_FLOAT16"].status != "skipped"
    table = onnx_backend.format_report(list(results.values()))
    assert "**Skipped**" in table and "| Cast |" in table.split("**Skipped**")[1]


def test_int4_quantization_cases_run_and_pass(results) -> None:
    """int4/uint4 are ops dtypes (ml_dtypes): the 4-bit QuantizeLinear/DequantizeLinear cases run."""
    int4 = [r for n, r in results.items() if n.startswith(("test_quantizelinear_", "test_dequantizelinear_"))
            and "int4" in n]  # fmt: skip
    assert int4 and all(r.status == "pass" for r in int4), [r for r in int4 if r.status != "pass"]


def test_random_op_cases_are_run_and_checked_for_shape_and_dtype(results) -> None:
    bern = [r for n, r in results.items() if n.startswith("test_bernoulli")]
    assert bern and all(r.status == "skipped" and r.reason == onnx_backend.RANDOM_REASON for r in bern)
    assert all(r.detail.startswith("random ops ") for r in bern)


def test_old_opset_cases_pass_as_shipped(results) -> None:
    """The importer converts opsets < 13 (onnx.version_converter): no opset adaptation is needed."""
    assert results["test_and2d"].status == "pass"  # opset 7
    assert not [r for r in results.values() if r.status == "adapted" and "opset" in r.reason]


def test_a_wrong_kernel_is_caught_as_wrong(monkeypatch, results) -> None:
    """The harness can fail: a Relu kernel that is off by one shows up as a wrong answer."""
    op, case = _case("test_relu")
    assert results["test_relu"].status == "pass"
    real = og.EXECUTOR_KERNELS[("", "Relu")]
    monkeypatch.setitem(og.EXECUTOR_KERNELS, ("", "Relu"), lambda n, x: [real(n, x)[0] + np.float32(1)])
    r = onnx_backend.run_case(op, case)
    assert r.status == "wrong" and "output 0" in r.detail


def test_adapted_cases_freeze_only_shape_inputs(results) -> None:
    _, case = _case("test_reshape_one_dim")
    feeds = {
        v.name: onnx_backend._array(x)
        for v, x in zip(case.model.graph.input, case.data_sets[0][0], strict=True)
    }
    model, left = onnx_backend._adapt(case.model, feeds)
    assert [v.name for v in model.graph.input] == ["data"] and list(left) == ["data"]
    assert [t.name for t in model.graph.initializer] == ["shape"]
    # the session runs the shipped model too: a run-time target shape plans the rest and allocates it per run
    assert results["test_reshape_one_dim"].status == "pass"


def test_report_counts_per_op() -> None:
    rs = [
        onnx_backend.CaseResult("a", "Add", "pass"),
        onnx_backend.CaseResult("b", "Add", "adapted", "axes given as a run-time input"),
        onnx_backend.CaseResult("c", "Add", "unsupported", "no add kernel for int16"),
        onnx_backend.CaseResult("d", "Add", "unsupported", "no add kernel for uint16"),
        onnx_backend.CaseResult(
            "e", "Cast", "skipped", onnx_backend.SKIP_REASON, "uses float8e4m3fn tensors"
        ),
    ]
    table = onnx_backend.format_report(rs, ["Add", "Sub"])
    assert (
        "| Add | 4 | 1 | 2 | - | - | 2: no add kernel for int16/uint16; "
        "adapted for axes given as a run-time input (1) |" in table
    )
    assert "| Sub | 0 | 0 | 0 | - | - | no backend node test in the installed onnx |" in table
    assert "| Cast | 0 | 0 | 0 | - | - | all 1 skipped (see below) |" in table
    assert "| **all (3 ops)** | 4 | 1 (25%) | 2 (50%) | - | - | wrong answers: 0, crashes: 0 |" in table
    assert (
        "**Total**: opstrata passes 2 (50%) of 4 cases (1 as shipped, 1 adapted); wrong answers: 0" in table
    )
    assert "| Cast | 1 | float8e4m3fn |" in table
    rs[0] = onnx_backend.CaseResult("a", "Add", "pass", ort="agree", ort_status="pass")
    rs[1] = onnx_backend.CaseResult(
        "b", "Add", "adapted", "x", ort="differ: output 0: ...", ort_status="fail"
    )
    rs[2] = onnx_backend.CaseResult("c", "Add", "unsupported", "no add kernel for int16", ort_status="pass")
    rs[3] = onnx_backend.CaseResult(
        "d", "Add", "unsupported", "no add kernel for uint16", ort_status="refused"
    )
    table = onnx_backend.format_report(rs, ["Add"])
    assert "| Add | 4 | 1 | 2 | 2 | 1/2 |" in table
    assert (
        "onnxruntime passes 2 (50%) on the same run (1 pass in both, 1 only in onnxruntime, 1 only in opstrata)"
        in table
    )


def _ort_max_ir_version() -> int:
    """The newest model IR version the installed onnxruntime loads, asked of onnxruntime itself: an
    Identity model stamped with each IR version from onnx's own down (an older onnxruntime refuses newer
    ones with "Unsupported model IR version")."""
    import onnx
    import onnxruntime as ort
    from onnx import helper as oh

    x = oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])
    y = oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1])
    graph = oh.make_graph([oh.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    for ir in range(onnx.IR_VERSION, 6, -1):
        model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 13)], ir_version=ir)
        try:
            ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
        except Exception as exc:
            if "Unsupported model IR version" not in str(exc):
                raise
            continue
        return ir
    raise AssertionError(
        f"onnxruntime {ort.__version__} loads no IR version from {onnx.IR_VERSION} down to 7"
    )


@pytest.mark.skipif(not HAVE_ORT, reason="onnxruntime is not installed")
def test_onnxruntime_column(results) -> None:
    """onnxruntime runs every case as shipped; a case both pass gives the same outputs in both.

    The pass-rate floor counts the cases whose IR version the installed onnxruntime loads at all: an
    onnxruntime older than the installed onnx (onnxruntime 1.30 loads IR <= 13, onnx 1.23 writes the
    newest cases at IR 14) refuses the rest before running anything.
    """
    assert all(r.ort_status in ("pass", "fail", "refused") for r in results.values() if r.status != "skipped")
    max_ir = _ort_max_ir_version()
    loadable = {c.name for _, c in onnx_backend.collect_cases() if c.model.ir_version <= max_ir}
    considered = [r for n, r in results.items() if n in loadable]
    assert len(considered) > 0.5 * len(results), f"onnxruntime loads IR <= {max_ir}: too few cases to judge"
    assert sum(r.ort_status == "pass" for r in considered) > 0.75 * len(considered)
    for name in ("test_relu", "test_reduce_sum_keepdims_random", "test_and2d", "test_softmax_axis_1"):
        r = results[name]
        assert r.status in ("pass", "adapted") and r.ort_status == "pass" and r.ort == "agree", r
    differ = {n: r.ort for n, r in results.items() if r.ort.startswith("differ") and r.ort_status == "pass"}
    assert not differ, differ


def test_a_case_refused_after_adapting_names_the_remaining_limit() -> None:
    """ReduceSum with run-time axes (runs as shipped), then an op opstrata does not import: the reason is the op."""
    from types import SimpleNamespace

    import onnx
    import onnx.helper as oh

    g = oh.make_graph(
        [oh.make_node("ReduceSum", ["x", "axes"], ["s"]), oh.make_node("Foo", ["s"], ["y"], domain="com.example")],
        "g",
        [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2, 3]),
         oh.make_tensor_value_info("axes", onnx.TensorProto.INT64, [1])],
        [oh.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = oh.make_model(g, opset_imports=[oh.make_opsetid("", 18), oh.make_opsetid("com.example", 1)])
    x, axes = np.ones((2, 3), np.float32), np.array([1], np.int64)
    case = SimpleNamespace(name="t", model=model, data_sets=[([x, axes], [x.sum(1)])], rtol=1e-3, atol=1e-7)
    r = onnx_backend.run_case("ReduceSum", case)
    assert r.status == "unsupported", r
    assert r.reason == "uses op Foo (not imported)", r
