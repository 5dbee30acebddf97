"""The native elementwise VM behind float32 generated kernels: every op against numpy in float64 over
ordinary and extreme values, broadcasting / strides / dtype conversion, random trees against the numpy
generator, the fall-back cases and a rejected program."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opstrata.ops import codegen as cg, native_status, reset_native_stats
from opstrata.ops.codegen import compile_expr, var
from opstrata.ops.codegen.vm import MAX_INPUTS, VMProgram, vm_program, vm_run

pytestmark = pytest.mark.skipif(
    native_status(build=True).available is not True, reason="native library not built (no C compiler)"
)

x, y, z = var("x"), var("y"), var("z")
_SPECIAL = np.array([0.0, -0.0, 1e-30, -1e-30, 1e-6, -1e-6, 0.3, -0.3, 0.7, -0.7, 3.0, -3.0, 10.0, -10.0,
                     50.0, -50.0, 87.0, 88.5, 88.8, -87.5, -100.0, -104.5, 1e30, -1e30, np.inf, -np.inf,
                     np.nan], np.float32)  # fmt: skip


def _values() -> np.ndarray:
    rng = np.random.default_rng(0)
    return np.concatenate([_SPECIAL, (rng.standard_normal(2000) * 4).astype(np.float32)])


def _erf64(a: np.ndarray) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(a)


def _sig64(a: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-a))


#: op -> (expression, float64 reference, max error in float32 ulps of the reference, abs floor per |x|:
#: GELU's 1 + erf(x / sqrt 2) cancels for x < -2, as in every float32 implementation of this formula)
UNARY = {
    "neg": (-x, np.negative, 0, 0.0),
    "abs": (abs(x), np.abs, 0, 0.0),
    "exp": (cg.exp(x), np.exp, 2, 0.0),
    "log": (cg.log(x), np.log, 1, 0.0),
    "sqrt": (cg.sqrt(x), np.sqrt, 1, 0.0),
    "rsqrt": (cg.rsqrt(x), lambda a: 1 / np.sqrt(a), 2, 0.0),
    "tanh": (cg.tanh(x), np.tanh, 4, 0.0),
    "erf": (cg.erf(x), _erf64, 4, 1e-7),
    "sigmoid": (cg.sigmoid(x), _sig64, 4, 1e-37),  # below -88 exp(-x) overflows: 0, not a denormal
    "relu": (cg.relu(x), lambda a: np.maximum(a, 0), 0, 0.0),
    "silu": (cg.silu(x), lambda a: a * _sig64(a), 4, 1e-37),
    "gelu": (cg.gelu(x), lambda a: 0.5 * a * (1 + _erf64(a / math.sqrt(2))), 8, 5e-7),
    "gelu_tanh": (cg.gelu_tanh(x),
                  lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a * a * a))),
                  8, 5e-7),
}  # fmt: skip


def _check_ulps(got: np.ndarray, want64: np.ndarray, ulps: int, floor: float, what: str) -> None:
    with np.errstate(over="ignore"):
        want = want64.astype(np.float32)
    nan_ok = np.isnan(got) == np.isnan(want)
    assert nan_ok.all(), f"{what}: NaN at {np.flatnonzero(~nan_ok)[:5]}"
    fin = np.isfinite(want)
    assert (got[~fin & ~np.isnan(want)] == want[~fin & ~np.isnan(want)]).all(), f"{what}: infinities differ"
    spacing = np.abs(np.spacing(want[fin])).astype(np.float64)
    err = np.abs(got[fin].astype(np.float64) - want64[fin])
    scale = np.clip(np.abs(_values()[fin].astype(np.float64)), 1.0, 1e30)
    bad = err > np.maximum(ulps * spacing + spacing / 2, floor * scale)
    assert not bad.any(), f"{what}: {int(bad.sum())} values off, e.g. x={_values()[fin][bad][:3]}"


@pytest.mark.parametrize("op", sorted(UNARY))
def test_unary_ops_within_ulps_of_float64(op: str) -> None:
    expr, ref, ulps, floor = UNARY[op]
    k = compile_expr(expr, "float32")
    assert k.program is not None
    a = _values()
    with np.errstate(all="ignore"):
        want = ref(a.astype(np.float64))
        got = k(x=a)
    _check_ulps(got, want, ulps, floor, op)


@pytest.mark.parametrize(
    "expr, ref",
    [
        (x + y, np.add), (x - y, np.subtract), (x * y, np.multiply), (x / y, np.true_divide),
        (cg.maximum(x, y), np.maximum), (cg.minimum(x, y), np.minimum),
    ],
)  # fmt: skip
def test_binary_ops_match_numpy_including_nan_and_inf(expr: cg.Expr, ref) -> None:
    a = _values()[:, None]
    b = _SPECIAL[None, :]
    with np.errstate(all="ignore"):
        want = ref(a, b)
        got = compile_expr(expr, "float32")(x=a, y=b)
    np.testing.assert_array_equal(got, want)  # correctly rounded in both (pow: libm powf and numpy's)


def test_pow_within_an_ulp_of_float64() -> None:
    a, b = np.abs(_values()[:, None]), _SPECIAL[None, :]
    with np.errstate(all="ignore"):
        want = np.power(a.astype(np.float64), b.astype(np.float64))
        got = compile_expr(x**y, "float32")(x=a, y=b)
    with np.errstate(over="ignore", under="ignore"):
        want32 = want.astype(np.float32)
    assert (np.isnan(got) == np.isnan(want32)).all()
    fin = np.isfinite(want32) & (np.abs(want32) > np.finfo(np.float32).tiny)
    np.testing.assert_array_equal(got[~fin & ~np.isnan(want32) & np.isinf(want32)], want32[np.isinf(want32)])
    err = np.abs(got[fin] - want[fin]) / np.spacing(want32[fin]).astype(np.float64)
    assert err.max() <= 1.0


@pytest.mark.parametrize("cmp", ["lt", "le", "gt", "ge", "eq", "ne"])
def test_comparisons_give_bool_and_drive_where(cmp: str) -> None:
    a, b = _values()[:, None], _SPECIAL[None, :]
    ref = getattr(np, {"lt": "less", "le": "less_equal", "gt": "greater", "ge": "greater_equal",
                       "eq": "equal", "ne": "not_equal"}[cmp])  # fmt: skip
    c = cg.apply(cmp, x, y)
    got = compile_expr(c, "float32")(x=a, y=b)
    assert got.dtype == np.bool_
    np.testing.assert_array_equal(got, ref(a, b))
    chosen = compile_expr(cg.where(c, x, y * 2.0), "float32")(x=a, y=b)
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(chosen, np.where(ref(a, b), a, b * np.float32(2)))
    as_number = compile_expr(c * 3.0 + x, "float32")(x=a, y=b)  # to_float: the mask as 0 / 1
    with np.errstate(all="ignore"):
        np.testing.assert_array_equal(as_number, ref(a, b) * np.float32(3) + a)


@pytest.mark.parametrize(
    "shape_y",
    [(6, 37), (37,), (6, 1), (), (1, 37), (2, 3, 1)],
)
def test_broadcast_patterns(shape_y: tuple[int, ...]) -> None:
    rng = np.random.default_rng(1)
    a = rng.standard_normal((2, 3, 37) if len(shape_y) == 3 else (6, 37)).astype(np.float32)
    b = rng.standard_normal(shape_y).astype(np.float32)
    got = compile_expr(cg.silu(x) * y + x, "float32")(x=a, y=b)
    want = a / (1 + np.exp(-a.astype(np.float64))) * b + a
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_strided_and_converted_inputs() -> None:
    rng = np.random.default_rng(2)
    a = rng.standard_normal((40, 30)).astype(np.float32).T  # column stride 40: copied once
    b = rng.integers(-3, 4, (30, 40))  # int64: converted
    c = rng.standard_normal((30, 80))[:, ::2]  # float64, strided
    got = compile_expr(x * y + cg.tanh(z), "float32")(x=a, y=b, z=c)
    want = a.astype(np.float64) * b + np.tanh(c)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.integers(1, 9), cols=st.integers(1, 700), seed=st.integers(0, 2**16),
    pattern=st.tuples(st.sampled_from(["full", "row", "col", "scalar"]), st.sampled_from(["full", "row", "col", "scalar"])),
)  # fmt: skip
def test_vm_equals_numpy_generator(rows: int, cols: int, seed: int, pattern: tuple[str, str]) -> None:
    """Tiles of 256 with a ragged last tile, every broadcast pattern: the VM and the numpy kernel agree."""
    rng = np.random.default_rng(seed)
    shapes = {"full": (rows, cols), "row": (cols,), "col": (rows, 1), "scalar": ()}
    a = rng.standard_normal(shapes[pattern[0]]).astype(np.float32) * 3
    b = rng.standard_normal(shapes[pattern[1]]).astype(np.float32) * 3
    e = cg.where(x > 0.5, cg.gelu(x) * y, cg.sigmoid(y) - cg.minimum(x, 1.0)) + cg.sqrt(abs(y)) / (
        1.0 + x * x
    )
    k = compile_expr(e, "float32")
    got = np.broadcast_to(k(x=a, y=b), (rows, cols))
    views = [np.broadcast_to(v, (rows, cols)) for v in (a, b)]
    want = np.empty((rows, cols), np.float32)
    k._run(views, want, rows, cols)  # the numpy generator's kernel on the same inputs
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_native_calls_are_counted() -> None:
    reset_native_stats()
    compile_expr(cg.exp(x) + 1.0, "float32")(x=np.ones((4, 4), np.float32))
    assert native_status().calls["codegen"]["native"] == 1


def test_beyond_the_vm_runs_the_numpy_kernel() -> None:
    names = [var(f"v{i}") for i in range(MAX_INPUTS + 1)]
    total = names[0]
    for v in names[1:]:
        total = total + v
    k = compile_expr(total, "float32")
    assert k.program is None  # too many inputs for one program
    got = k(**{f"v{i}": np.full(3, i, np.float32) for i in range(MAX_INPUTS + 1)})
    np.testing.assert_array_equal(got, np.full(3, sum(range(MAX_INPUTS + 1)), np.float32))
    assert compile_expr(x * 2.0, "float64").program is None  # only float32 runs on the VM
    assert compile_expr(cg.reduce_sum(x * 2.0), "float32").program is None


def test_program_listing_and_rejected_program() -> None:
    prog = vm_program(cg.simplify(cg.exp(x) * y), ["x", "y"])
    assert prog is not None and "exp(x)" in prog.listing()
    bad = VMProgram(np.array([[99, 0, -1, 0, 0]], np.int32), np.zeros(0, np.float32), 1, ("x",), False)
    with pytest.raises(RuntimeError, match="rejected"):
        vm_run(bad, [np.ones((2, 2), np.float32)], np.empty((2, 2), np.float32))


@pytest.mark.parametrize(
    "sx, sy",
    [
        ((1, 4, 32, 16), (1, 1, 32, 16)),  # rotary: cos / sin shared over heads
        ((2, 3, 5, 7), (2, 1, 5, 1)),
        ((2, 3, 4, 5, 6, 7), (1, 3, 1, 5, 1, 7)),  # more row dims than the VM walks: laid out afresh
        ((3, 1, 7), (1, 5, 1)),  # both broadcast
    ],
)
def test_nd_broadcasting(sx: tuple[int, ...], sy: tuple[int, ...]) -> None:
    rng = np.random.default_rng(3)
    a = rng.standard_normal(sx).astype(np.float32)
    b = rng.standard_normal(sy).astype(np.float32)
    got = compile_expr(x * y + cg.tanh(x - y), "float32")(x=a, y=b)
    want = a.astype(np.float64) * b + np.tanh(a.astype(np.float64) - b)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=1e-6)


def test_into_in_place_and_errors() -> None:
    rng = np.random.default_rng(4)
    a = rng.standard_normal((6, 40)).astype(np.float32)
    b = rng.standard_normal(40).astype(np.float32)
    want = np.tanh(a.astype(np.float64)) * b
    k = compile_expr(cg.tanh(x) * y, "float32")
    assert k.into(a, {"x": a, "y": b}) is a  # in place over its own input
    np.testing.assert_allclose(a, want, rtol=2e-6, atol=1e-7)
    with pytest.raises(cg.CodegenError, match=r"'out' expected a float32\[6, 40\]"):
        k.into(np.empty((6, 41), np.float32), {"x": a, "y": b})
    strided = np.empty((6, 80), np.float32)[:, ::2]
    k.into(strided, {"x": a, "y": b})  # not contiguous: computed, then copied in
    np.testing.assert_allclose(strided, np.tanh(a) * b, rtol=1e-6)


def test_bound_call_reads_current_values() -> None:
    """A bound call resolves pointers once and sees what is in the arrays at each call; an input that
    must be converted is not frozen into the call (it converts per call instead)."""
    a = np.ones((4, 300), np.float32)
    b = np.full(300, 2.0, np.float32)
    c = np.ones((4, 300), np.int64)
    out = np.empty((4, 300), np.float32)
    k = compile_expr(x * y + z, "float32")
    call = k.bind(out, {"x": a, "y": b, "z": c})
    call()
    np.testing.assert_array_equal(out, np.full((4, 300), 3.0, np.float32))
    a[:] = 5.0
    c[:] = 7
    call()
    np.testing.assert_array_equal(out, np.full((4, 300), 17.0, np.float32))
    prebound = compile_expr(x * y, "float32").bind(out, {"x": a, "y": b})
    a[:] = -1.0
    prebound()
    np.testing.assert_array_equal(out, np.full((4, 300), -2.0, np.float32))


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 600), cols=st.integers(1, 64), seed=st.integers(0, 2**16))
def test_short_rows_in_shared_tiles_give_the_row_by_row_bits(rows: int, cols: int, seed: int) -> None:
    """An SE block's per-channel scale on short rows: dense inputs run several rows per tile; the same
    values in a padded (non-dense) layout run row by row; the bits are the same, and numpy's within tol."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rows, cols)).astype(np.float32) * 3
    s = rng.standard_normal((rows, 1)).astype(np.float32)
    padded = np.zeros((rows, cols + 5), np.float32)
    padded[:, :cols] = a
    k = compile_expr(cg.sigmoid(y) * x + cg.maximum(x, 0.0) * y, "float32")
    dense = k(x=a, y=s)
    np.testing.assert_array_equal(dense, k(x=padded[:, :cols], y=s))
    want = (1.0 / (1.0 + np.exp(-s.astype(np.float64)))) * a + np.maximum(a, 0.0) * s
    np.testing.assert_allclose(dense, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize(
    "shape_x, shape_y", [((512, 300), (512, 1)), ((3000, 20), (3000, 1)), ((64, 4096), (4096,))]
)
def test_rows_split_over_threads_give_the_same_bits(shape_x, shape_y) -> None:
    """The VM splits rows (and short-row tiles) over the session's threads: 1, 2 and 4 give the same bits."""
    from opstrata.ops import intra_op_threads

    rng = np.random.default_rng(7)
    a = rng.standard_normal(shape_x).astype(np.float32)
    b = rng.standard_normal(shape_y).astype(np.float32)
    k = compile_expr(cg.tanh(x) * y + cg.sigmoid(x - y), "float32")
    with intra_op_threads(1):
        one = k(x=a, y=b)
    for threads in (2, 4):
        with intra_op_threads(threads):
            np.testing.assert_array_equal(k(x=a, y=b), one)
