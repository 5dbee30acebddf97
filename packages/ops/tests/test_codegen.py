"""Generated elementwise kernels: random expression trees (hypothesis) against direct numpy evaluation of
the same tree, simplification visible in the source, the structural cache, reductions and errors."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from opstrata.ops import codegen as cg
from opstrata.ops._dtypes import bfloat16, float16, float32, float64
from opstrata.ops.codegen import CodegenError, Expr, compile_expr, var
from opstrata.ops.kernels import chunking as _chunking

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = ("x", "y", "z")
# Input shapes that broadcast to (5, 37): full, a row, a column, a scalar.
SHAPES = ((5, 37), (37,), (5, 1), ())


@pytest.fixture(autouse=True)
def small_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """64-element tiles, so every case runs several tiles and partial edge tiles."""
    monkeypatch.setattr(_chunking, "BLOCK_ELEMS", 64)


# --------------------------------------------------------------------------- the oracle


def _sig(a: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-a))


def _erf(a: Any) -> np.ndarray:
    return np.vectorize(math.erf, otypes=[np.float64])(a).astype(np.asarray(a).dtype)


NUMPY: dict[str, Callable[..., Any]] = {
    "add": np.add, "sub": np.subtract, "mul": np.multiply, "div": np.true_divide, "pow": np.power,
    "maximum": np.maximum, "minimum": np.minimum, "neg": np.negative, "abs": np.abs, "exp": np.exp,
    "log": np.log, "sqrt": np.sqrt, "rsqrt": lambda a: 1 / np.sqrt(a), "tanh": np.tanh, "erf": _erf,
    "sigmoid": _sig, "relu": lambda a: np.maximum(a, 0), "silu": lambda a: a * _sig(a),
    "gelu": lambda a: 0.5 * a * (1 + _erf(a / math.sqrt(2))),
    "gelu_tanh": lambda a: 0.5 * a * (1 + np.tanh(math.sqrt(2 / math.pi) * (a + 0.044715 * a**3))),
    "lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal, "eq": np.equal,
    "ne": np.not_equal, "where": np.where,
}  # fmt: skip


def evaluate(e: Expr, env: dict[str, np.ndarray], dt: Any) -> Any:
    """Direct, unfused numpy evaluation of the *original* tree (no simplification), in ``dt``."""
    if e.op == "var":
        return env[e.attr].astype(dt)
    if e.op == "const":
        return dt(e.value)
    args = [evaluate(a, env, dt) for a in e.args]
    if e.op.startswith("reduce_"):
        fn = {"reduce_sum": np.sum, "reduce_mean": np.mean, "reduce_max": np.max}[e.op]
        return fn(args[0], axis=e.attr)
    out = NUMPY[e.op](*args)
    return out.astype(dt) if np.asarray(out).dtype.kind == "f" else out


# --------------------------------------------------------------------------- random trees

UNARY_SAFE: tuple[Callable[[Expr], Expr], ...] = (
    lambda a: -a, abs, cg.tanh, cg.sigmoid, cg.relu, cg.silu, cg.gelu, cg.gelu_tanh, cg.erf,
    lambda a: cg.log(abs(a) + 1.0), lambda a: cg.sqrt(abs(a)), lambda a: cg.rsqrt(abs(a) + 1.0),
    lambda a: cg.exp(cg.tanh(a)), lambda a: a**2, lambda a: a**3, lambda a: a / 4.0,
    lambda a: (abs(a) + 1.0) ** -1,
)  # fmt: skip
BINARY_SAFE: tuple[Callable[[Expr, Expr], Expr], ...] = (
    lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b, cg.maximum, cg.minimum,
    lambda a, b: a / (abs(b) + 1.0), lambda a, b: cg.where(a > b, a, b * 0.5),
    lambda a, b: cg.where(cg.le(a, 0.25), cg.tanh(b), a), lambda a, b: cg.tanh(a) * cg.tanh(b),
)  # fmt: skip


def trees(n_vars: int) -> st.SearchStrategy[Expr]:
    leaves = st.one_of(
        st.sampled_from([var(n) for n in NAMES[:n_vars]]),
        st.sampled_from([-1.5, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0]).map(cg.const),
    )

    def extend(children: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        un = st.tuples(st.sampled_from(UNARY_SAFE), children).map(lambda t: t[0](t[1]))
        bi = st.tuples(st.sampled_from(BINARY_SAFE), children, children).map(lambda t: t[0](t[1], t[2]))
        return st.one_of(un, bi)

    return st.recursive(leaves, extend, max_leaves=12).filter(lambda e: depth(e) <= 5)


def depth(e: Expr) -> int:
    return 0 if not e.args else 1 + max(depth(a) for a in e.args)


def scale_tol(ref: np.ndarray, rel: float) -> float:
    finite = np.abs(ref[np.isfinite(ref)]) if ref.dtype.kind == "f" else np.zeros(1)
    return rel * max(1.0, float(finite.max()) if finite.size else 1.0)


def check_tree(e: Expr, n_vars: int, shapes: tuple[int, ...], seed: int, dtype: Any, rel: float) -> None:
    rng = np.random.default_rng(seed)
    names = cg_variables(e)
    env = {n: (rng.standard_normal(SHAPES[shapes[NAMES.index(n)]]) * 1.5) for n in names}
    env = {n: np.asarray(a, dtype=np.float64 if dtype == float64 else np.float32) for n, a in env.items()}
    k = compile_expr(e, dtype)
    got = k(**env)
    dt = np.float64 if dtype == float64 else np.float32
    with np.errstate(all="ignore"):
        want = np.broadcast_to(evaluate(e, env, dt), np.broadcast_shapes(*(a.shape for a in env.values())))
    if want.dtype == np.bool_:
        assert got.dtype == np.bool_
        # a comparison of values equal up to rounding may flip: allow a few
        assert np.mean(got != want) <= 0.05
        return
    assert got.dtype == dtype and got.shape == want.shape
    want = np.asarray(want)
    tol = scale_tol(want, rel)
    np.testing.assert_allclose(
        got.astype(np.float64), want.astype(np.float64), rtol=rel, atol=tol, equal_nan=True
    )


def cg_variables(e: Expr) -> list[str]:
    from opstrata.ops.codegen.ir import variables

    return variables(e)


@SETTINGS
@given(tree=trees(3), shapes=st.tuples(*(st.integers(0, 3) for _ in range(3))), seed=st.integers(0, 2**16))
def test_random_trees_float64(tree: Expr, shapes: tuple[int, ...], seed: int) -> None:
    check_tree(tree, 3, shapes, seed, float64, 1e-9)


@SETTINGS
@given(tree=trees(2), shapes=st.tuples(*(st.integers(0, 3) for _ in range(3))), seed=st.integers(0, 2**16))
def test_random_trees_float32(tree: Expr, shapes: tuple[int, ...], seed: int) -> None:
    check_tree(tree, 2, shapes, seed, float32, 2e-3)


@settings(max_examples=80, deadline=None)
@given(tree=trees(2), seed=st.integers(0, 2**16), axis=st.sampled_from([0, 1, -1, None]),
       red=st.sampled_from(["reduce_sum", "reduce_mean", "reduce_max"]))  # fmt: skip
def test_random_trees_with_final_reduction(tree: Expr, seed: int, axis: Any, red: str) -> None:
    e = getattr(cg, red)(tree, axis=axis)
    rng = np.random.default_rng(seed)
    env = {n: rng.standard_normal((5, 37)) for n in cg_variables(e)}
    if not env:
        env = {}
    want = evaluate(e, env, np.float64) if env else None
    if want is None:
        return  # a constant tree has no shape to reduce over
    got = compile_expr(e, "float64")(**env)
    assert got.shape == np.shape(want)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=scale_tol(np.asarray(want, np.float64), 1e-9) * 37)


@pytest.mark.parametrize("dtype", [bfloat16, float16], ids=str)
def test_low_precision_computes_in_float32_and_rounds_once(dtype: Any) -> None:
    x, y = var("x"), var("y")
    e = cg.gelu_tanh(x * 0.5 + y) - cg.sigmoid(x) * y**2
    rng = np.random.default_rng(0)
    xa, ya = rng.standard_normal((7, 45)).astype(dtype), rng.standard_normal(45).astype(dtype)
    got = compile_expr(e, dtype)(x=xa, y=ya)
    want = evaluate(e, {"x": xa.astype(np.float32), "y": ya.astype(np.float32)}, np.float32).astype(dtype)
    assert got.dtype == dtype
    assert np.array_equal(got.astype(np.float32), want.astype(np.float32)) or np.allclose(
        got.astype(np.float32), want.astype(np.float32), rtol=1e-2, atol=1e-2
    )
    # rounding once: at most one ulp of dtype away from the float32 result rounded
    f32 = compile_expr(e, float32)(x=xa, y=ya)
    assert np.allclose(got.astype(np.float32), f32.astype(dtype).astype(np.float32), rtol=0, atol=0)


# --------------------------------------------------------------------------- simplification


def test_integer_powers_become_multiplications() -> None:
    x = var("x")
    src = compile_expr(x**3 + x**2 + x**4, float32).source
    assert "power" not in src
    assert src.count("np.multiply") <= 5  # x*x shared by x**2, x**3, x**4
    assert "np.sqrt" in compile_expr(x**0.5, float32).source
    assert "np.power" in compile_expr(x**2.5, float32).source
    xa = np.array([-2.0, -0.5, 0.0, 3.0], np.float32)
    with np.errstate(divide="ignore"):
        want = xa.astype(np.float64) ** -2.0
    np.testing.assert_allclose(compile_expr(x**-2, float32)(x=xa), want, rtol=1e-6)


def test_constant_folding_division_and_cse() -> None:
    x, y = var("x"), var("y")
    e = x / 4.0 + (cg.const(2.0) * 3.0 + cg.exp(cg.const(0.0)))
    simple = cg.simplify(e)
    assert repr(simple) == "add(mul(x, 0.25), 7.0)"
    src = compile_expr(cg.tanh(x + y) * cg.tanh(y + x), float32).source
    assert src.count("np.tanh") == 1 and src.count("np.add") == 1  # commuted subexpression computed once
    assert repr(cg.simplify(cg.apply("neg", -x) * 1.0 + 0.0)) == "x"


def test_structural_cache_hit() -> None:
    cg.cache_clear()
    a = compile_expr(cg.gelu(var("x") + var("b")) * 2.0, "float32")
    b = compile_expr(cg.gelu(var("x") + var("b")) * 2.0, np.float32)
    assert a is b
    assert cg.cache_info()["hits"] == 1 and cg.cache_info()["misses"] == 1
    assert compile_expr(cg.gelu(var("x") + var("b")) * 2.0, "float64") is not a
    assert compile_expr(cg.gelu(var("x") + var("b")) * 3.0, "float32") is not a
    assert cg.const(0.0) != cg.const(-0.0)  # different bits, different kernels


def test_source_is_inspectable_and_blocked() -> None:
    k = compile_expr(cg.silu(var("x")) + var("y"), "float32")
    assert k.source.startswith("def kernel(") and "for r0 in range(0, R, rb)" in k.source
    assert k.inputs == ["x", "y"] and "out=" in k.source
    assert "ElementwiseKernel" in repr(k)


def test_broadcasting_and_dtype_conversion() -> None:
    k = compile_expr(var("x") * var("y") + 1.0, "float32")
    x = np.arange(12, dtype=np.int32).reshape(3, 4)
    y = np.array([[1.0], [2.0], [3.0]], np.float64)
    np.testing.assert_array_equal(k(x=x, y=y), (x * y + 1).astype(np.float32))
    assert k(x=np.float32(2.0), y=np.float32(3.0)).shape == ()
    assert k(x=np.zeros((0, 4)), y=np.zeros(4)).shape == (0, 4)
    # a broadcast strides cannot flatten: materialized, still right
    a, b = np.ones((2, 1, 3)), np.arange(12.0).reshape(2, 2, 3)
    np.testing.assert_array_equal(k(x=a, y=b), (a * b + 1).astype(np.float32))


def test_comparison_root_is_bool_and_where() -> None:
    x, y = var("x"), var("y")
    xa, ya = np.array([1.0, -1.0, 2.0]), np.array([0.0, 0.0, 5.0])
    assert compile_expr(cg.ge(x, y), "float32")(x=xa, y=ya).tolist() == [True, False, False]
    got = compile_expr(cg.where(cg.ne(x, 1.0), x * 2.0, y) + (x > 0), "float32")(x=xa, y=ya)
    assert got.tolist() == [1.0, -2.0, 5.0]


def test_reductions() -> None:
    x = var("x")
    xa = np.random.default_rng(0).standard_normal((9, 70)).astype(np.float32)
    np.testing.assert_allclose(
        compile_expr(cg.reduce_sum(x * x, axis=-1))(x=xa), (xa * xa).sum(-1), rtol=1e-5
    )
    np.testing.assert_allclose(
        compile_expr(cg.reduce_mean(cg.exp(x), axis=0))(x=xa), np.exp(xa).mean(0), rtol=1e-5
    )
    np.testing.assert_allclose(compile_expr(cg.reduce_max(x, axis=None))(x=xa), xa.max())
    assert compile_expr(cg.reduce_sum(x, axis=1))(x=np.zeros((3, 0))).tolist() == [0.0, 0.0, 0.0]


# --------------------------------------------------------------------------- errors


def test_errors() -> None:
    x, y = var("x"), var("y")
    with pytest.raises(CodegenError, match="unknown op 'frobnicate'; known ops: abs, add"):
        cg.apply("frobnicate", x)
    with pytest.raises(CodegenError, match="add: expected 2 argument"):
        cg.apply("add", x)
    with pytest.raises(CodegenError, match="where: argument 'cond' expected a comparison"):
        cg.where(x, x, y)
    with pytest.raises(CodegenError, match="a reduction may only be the final op"):
        cg.reduce_sum(x) + 1.0
    with pytest.raises(CodegenError, match="var: argument 'name' expected a Python identifier"):
        var("not a name")
    with pytest.raises(CodegenError, match="const: argument 'value' expected a real scalar"):
        x + "1"
    with pytest.raises(TypeError, match="no truth value"):
        bool(x < y)
    k = compile_expr(x + y, "float32")
    with pytest.raises(
        CodegenError, match=r"inputs expected shapes that broadcast together, got x: \(2, 3\), y: \(4,\)"
    ):
        k(x=np.zeros((2, 3)), y=np.zeros(4))
    with pytest.raises(CodegenError, match=r"expected inputs \(x, y\), got \(x\); missing \['y'\]"):
        k(x=np.zeros(3))
    with pytest.raises(CodegenError, match=r"unexpected \['z'\]"):
        k(x=np.zeros(3), y=np.zeros(3), z=np.zeros(3))
    with pytest.raises(CodegenError, match="input 'x' expected a numeric or bool dtype, got <U1"):
        k(x=np.array(["a"]), y=np.zeros(1))
    with pytest.raises(CodegenError, match="compile_expr: argument 'dtype' expected a float dtype"):
        compile_expr(x, "int32")
    with pytest.raises(CodegenError, match="compile_expr: argument 'expr' expected an Expr"):
        compile_expr("x + 1")  # type: ignore[arg-type]
    with pytest.raises(CodegenError, match="reduce_sum: argument 'axis' expected an axis in"):
        compile_expr(cg.reduce_sum(x, axis=3))(x=np.zeros((2, 2)))
    with pytest.raises(CodegenError, match="reduce_max: expected a non-empty reduction"):
        compile_expr(cg.reduce_max(x, axis=0))(x=np.zeros((0, 2)))


def test_generated_source_is_the_same_in_every_process(run_python) -> None:
    code = (
        "from opstrata.ops import codegen as cg; x, y = cg.var('x'), cg.var('y');"
        "print(cg.compile_expr(cg.tanh(x + y) * (y * x) + cg.maximum(x, y)).source)"
    )
    outs = {run_python(code, env={"PYTHONHASHSEED": seed}).stdout for seed in ("1", "2")}
    assert len(outs) == 1 and "def kernel(" in outs.pop()


def test_long_chains_compile_without_recursion_limits() -> None:
    x, y = var("x"), var("y")
    e = x
    for i in range(3000):  # a chain far deeper than Python's recursion limit
        e = cg.tanh(e) * 0.5 + y if i % 2 else e * 0.999 - 0.001
    k = compile_expr(e, "float64")
    assert "<" in k.source.splitlines()[1]  # summarized, not a 3000-level repr
    xa, ya = np.linspace(-1, 1, 50), np.float64(0.1)
    want = xa
    for i in range(3000):
        want = np.tanh(want) * 0.5 + ya if i % 2 else want * 0.999 - 0.001
    np.testing.assert_allclose(k(x=xa, y=ya), want, rtol=1e-12)
