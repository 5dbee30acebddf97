"""Fallback chain and audit: exactly one audited fallback per call, policies, the report."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.testing import isolated_registry

X = np.array([1.0, 2.0], np.float32)


@pytest.fixture
def ref_only():
    """``_test_neg``: a kernel on ref only, so cpu must move it to ref."""
    ops.register("_test_neg", device="ref", dtypes=ops.FLOAT_DTYPES)(lambda x: -x)


@pytest.fixture
def decomposed():
    """``_test_softplus`` = log1p(exp(x)) as a decomposition over two native ops on both devices."""
    for dev in ("ref", "cpu"):
        ops.register("_test_exp", device=dev)(np.exp)
        ops.register("_test_log1p", device=dev)(np.log1p)
    ops.register_decomposition("_test_softplus", lambda x: ops.call("_test_log1p", ops.call("_test_exp", x)))


def _records():
    return [(r.op, r.device, r.path, r.dtype, r.count, r.via) for r in ops.fallback_report().records]


def test_device_fallback_is_audited_once_per_call(ref_only):
    ops.set_fallback_policy("allow")
    for _ in range(3):
        np.testing.assert_array_equal(ops.call("_test_neg", X), -X)
    assert _records() == [("_test_neg", "cpu", "device:ref", "float32", 3, "")]
    assert ops.fallback_report().records[0].reason == "no _test_neg kernel on cpu"
    ops.call("_test_neg", X, device="ref")  # native on ref: not a fallback
    assert ops.fallback_report().total == 3


def test_decomposition_counts_once_not_its_sub_ops(decomposed):
    ops.set_fallback_policy("allow")
    for _ in range(4):
        np.testing.assert_allclose(ops.call("_test_softplus", X), np.log1p(np.exp(X)), rtol=1e-6)
    assert _records() == [("_test_softplus", "cpu", "decomposition", "float32", 4, "")]


def test_sub_op_that_itself_falls_back_is_recorded_with_its_parent(decomposed):
    ops.unregister("_test_exp", device="cpu")  # exp now only on ref
    ops.set_fallback_policy("allow")
    for _ in range(2):
        ops.call("_test_softplus", X)
    assert sorted(_records()) == [
        ("_test_exp", "cpu", "device:ref", "float32", 2, "_test_softplus"),
        ("_test_softplus", "cpu", "decomposition", "float32", 2, ""),
    ]


def test_decomposition_runs_on_the_requested_device(decomposed):
    seen = []
    ops.register("_test_exp", device="ref")(lambda x: seen.append("ref") or np.exp(x))
    ops.register("_test_exp", device="cpu")(lambda x: seen.append("cpu") or np.exp(x))
    with ops.fallback_policy("allow"):
        ops.call("_test_softplus", X, device="ref")
        ops.call("_test_softplus", X)
    assert seen == ["ref", "cpu"]
    assert ops.fallback_report().count("_test_softplus", device="ref", path="decomposition") == 1


def test_decomposition_preferred_over_other_device(decomposed):
    ops.register("_test_softplus", device="ref")(lambda x: np.log1p(np.exp(x)))
    assert ops.dispatch_path("_test_softplus", "cpu") == "decomposition"
    assert ops.dispatch_path("_test_softplus", "ref") == "native"


def test_warn_emits_exactly_one_warning_per_call(ref_only, decomposed):
    ops.set_fallback_policy("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            ops.call("_test_neg", X)
        ops.call("_test_softplus", X)
    msgs = [str(w.message) for w in caught if issubclass(w.category, ops.FallbackWarning)]
    assert len(msgs) == 4 and len(caught) == 4
    assert (
        msgs[0] == "opstrata fallback: _test_neg on cpu (float32) -> device:ref: no _test_neg kernel on cpu"
    )
    assert caught[0].filename == __file__  # points at the caller, not the dispatcher
    assert issubclass(ops.FallbackWarning, UserWarning)


def test_default_policy_is_warn(ref_only, monkeypatch):
    monkeypatch.delenv("OPSTRATA_FALLBACK", raising=False)
    ops.set_fallback_policy(None)
    assert ops.get_fallback_policy() == "warn"
    with pytest.warns(ops.FallbackWarning):
        ops.call("_test_neg", X)


def test_error_policy_raises_with_audit_text_and_does_not_run(ref_only):
    ran = []
    ops.register("_test_neg", device="ref")(lambda x: ran.append(1))
    with ops.fallback_policy("error"), pytest.raises(ops.FallbackError) as info:
        ops.call("_test_neg", X)
    msg = str(info.value)
    assert "_test_neg on cpu (float32) -> device:ref: no _test_neg kernel on cpu" in msg
    assert "device='ref'" in msg and "fallback_policy('warn')" in msg
    assert info.value.record.path == "device:ref"
    assert ran == [] and ops.fallback_report().total == 0


def test_error_policy_on_decomposition(decomposed):
    with ops.fallback_policy("error"), pytest.raises(ops.FallbackError, match="-> decomposition"):
        ops.call("_test_softplus", X)


def test_policy_precedence_and_validation(monkeypatch):
    monkeypatch.setenv("OPSTRATA_FALLBACK", "allow")
    ops.set_fallback_policy(None)
    assert ops.get_fallback_policy() == "allow"
    ops.set_fallback_policy("warn")
    assert ops.get_fallback_policy() == "warn"
    with ops.fallback_policy("error"):
        assert ops.get_fallback_policy() == "error"
    assert ops.get_fallback_policy() == "warn"
    with pytest.raises(ValueError, match=r"must be one of allow, warn, error, got 'strict'"):
        ops.set_fallback_policy("strict")
    with pytest.raises(ValueError, match="fallback_policy"):
        ops.fallback_policy("nope").__enter__()


def test_env_policy_in_subprocess(run_python):
    code = (
        "import numpy as np, warnings, opstrata.ops as ops\n"
        "ops.register('_test_neg', device='ref')(lambda x: -x)\n"
        "warnings.simplefilter('error')\n"
        "try:\n"
        "    ops.call('_test_neg', np.ones(2))\n"
        "    print('ran', ops.fallback_report().total)\n"
        "except Exception as e:\n"
        "    print(type(e).__name__, e)\n"
    )
    assert run_python(code, env={"OPSTRATA_FALLBACK": "allow"}).stdout.strip() == "ran 1"
    out = run_python(code, env={"OPSTRATA_FALLBACK": "error"}).stdout
    assert out.startswith("FallbackError fallback refused (policy 'error'): _test_neg on cpu")
    assert run_python(code, env={"OPSTRATA_FALLBACK": "warn"}).stdout.startswith("FallbackWarning")
    out = run_python(code, env={"OPSTRATA_FALLBACK": "sometimes"}).stdout
    assert "environment variable OPSTRATA_FALLBACK" in out and "got 'sometimes'" in out


def test_report_table_and_reset(ref_only, decomposed):
    ops.set_fallback_policy("allow")
    ops.call("_test_neg", X)
    ops.call("_test_neg", X.astype(np.float64))
    ops.call("_test_softplus", X)
    report = ops.fallback_report()
    assert report.total == 3 and len(report) == 3
    text = str(report)
    assert text == report.table()
    lines = text.splitlines()
    assert lines[0] == "fallback report: 3 call(s) fell back, 3 kind(s)"
    assert lines[1].split() == ["op", "device", "dtype", "path", "count", "via", "reason"]
    assert any("float64" in ln and "device:ref" in ln for ln in lines[2:])
    assert report.as_dicts()[0].keys() >= {"op", "device", "path", "dtype", "reason", "count"}
    with pytest.raises(AttributeError):
        report.records[0].count = 9  # records are frozen
    ops.reset_fallback_report()
    assert ops.fallback_report().total == 0
    assert str(ops.fallback_report()) == "fallback report: no fallbacks recorded"


def test_custom_chain_and_no_kernel(ref_only):
    ops.set_fallback_chain("cpu", [])
    with pytest.raises(ops.NoKernelError, match=r"_test_neg: no kernel for device 'cpu' and dtype float32"):
        ops.call("_test_neg", X)
    with pytest.raises(ValueError, match="cannot fall back to itself"):
        ops.set_fallback_chain("cpu", ["cpu"])


def test_recursive_decomposition_does_not_loop():
    ops.register("_test_rec", device="ref")(lambda x, depth=0: x + 1)
    ops.register_decomposition("_test_rec", lambda x, depth=0: ops.call("_test_rec", x, depth=1))
    with ops.fallback_policy("allow"):
        assert ops.call("_test_rec", 1.0) == 2.0
    assert sorted(_records()) == [
        ("_test_rec", "cpu", "decomposition", "float64", 1, ""),
        ("_test_rec", "cpu", "device:ref", "float64", 1, "_test_rec"),
    ]


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(1, 6),
    dtype=st.sampled_from([np.float32, np.float64, ops.bfloat16, np.float16]),
    shape=st.lists(st.integers(0, 3), max_size=3),
)
def test_exactly_one_record_per_call(n, dtype, shape):
    with isolated_registry():
        ops.register("_test_neg", device="ref", dtypes=ops.FLOAT_DTYPES)(lambda x: -x)
        ops.register("_test_id", device="cpu")(lambda x: x)
        ops.register_decomposition("_test_dec", lambda x: ops.call("_test_id", x))
        x = np.zeros(shape, dtype)
        with ops.fallback_policy("allow"):
            for _ in range(n):
                ops.call("_test_neg", x)
                ops.call("_test_dec", x)
                ops.call("_test_id", x)
        report = ops.fallback_report()
        assert report.count("_test_neg", path="device:ref") == n
        assert report.count("_test_dec", path="decomposition") == n
        assert report.total == 2 * n
        assert {r.dtype for r in report} == {str(np.dtype(dtype))}
