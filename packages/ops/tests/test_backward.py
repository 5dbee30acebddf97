"""Backward kernels: central finite differences in float64 (through the ref forward), cpu vs ref parity.

The oracle for a backward is the forward itself: ``L = sum(forward(x) * G)`` has gradient
``backward(x, G)``; we check it against ``(L(x + h) - L(x - h)) / 2h`` element by element.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops.testing import tolerances

RNG = np.random.default_rng(0)
LOW = ["float32", "bfloat16", "float16"]


def numgrad(f: Callable[[np.ndarray], float], x: np.ndarray, h: float = 1e-6) -> np.ndarray:
    """Central differences of scalar ``f`` at float64 ``x`` (x is restored)."""
    g = np.zeros_like(x)
    flat, gflat = x.reshape(-1), g.reshape(-1)
    for i in range(flat.size):
        old = flat[i]
        flat[i] = old + h
        up = f(x)
        flat[i] = old - h
        down = f(x)
        flat[i] = old
        gflat[i] = (up - down) / (2 * h)
    return g


def fd_close(analytic: np.ndarray, numeric: np.ndarray) -> None:
    np.testing.assert_allclose(analytic, numeric, rtol=1e-5, atol=1e-6)


def rand(*shape: int) -> np.ndarray:
    return RNG.standard_normal(shape)


def parity(cpu: np.ndarray | None, ref: np.ndarray | None, dtype: str) -> None:
    """cpu and ref agree to the dtype's tolerance, relative to the result's scale."""
    if ref is None:
        assert cpu is None
        return
    assert cpu.dtype == ref.dtype == np.dtype(ops.as_dtype(dtype)), (cpu.dtype, ref.dtype)
    assert cpu.shape == ref.shape
    rtol, _ = tolerances(ref.dtype)
    rtol = max(rtol, 4e-6) * (4 if dtype != "float32" else 1)  # one rounding each side
    scale = max(1.0, float(np.abs(ref.astype(np.float64)).max(initial=0)))
    np.testing.assert_allclose(cpu.astype(np.float64), ref.astype(np.float64), rtol=rtol, atol=rtol * scale)


# --------------------------------------------------------------------------- matmul / linear

MATMUL_SHAPES = [
    ((3, 4), (4, 2)),
    ((2, 3, 4), (4, 5)),
    ((4,), (4, 3)),
    ((3, 4), (4,)),
    ((4,), (4,)),
    ((2, 1, 3, 4), (3, 4, 2)),
    ((3, 4), (2, 4, 5)),
    ((4,), (2, 4, 3)),
]


@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES)
@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_matmul_backward_finite_differences(sa: tuple, sb: tuple, device: str) -> None:
    a, b = rand(*sa), rand(*sb)
    g = rand(*np.matmul(a, b).shape)
    da, db = ops.matmul_backward(a, b, g, device=device)
    assert da.shape == a.shape and db.shape == b.shape
    fd_close(da, numgrad(lambda t: float((ops.matmul(t, b, device="ref") * g).sum()), a))
    fd_close(db, numgrad(lambda t: float((ops.matmul(a, t, device="ref") * g).sum()), b))


@pytest.mark.parametrize("xshape", [(5, 3), (2, 4, 3), (3,)])
@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_linear_backward_finite_differences(xshape: tuple, device: str) -> None:
    x, w, bias = rand(*xshape), rand(4, 3), rand(4)
    g = rand(*xshape[:-1], 4)

    def loss(xx: np.ndarray, ww: np.ndarray, bb: np.ndarray) -> float:
        return float((ops.linear(xx, ww, bb, device="ref") * g).sum())

    dx, dw, db = ops.linear_backward(x, w, g, device=device)
    fd_close(dx, numgrad(lambda t: loss(t, w, bias), x))
    fd_close(dw, numgrad(lambda t: loss(x, t, bias), w))
    fd_close(db, numgrad(lambda t: loss(x, w, t), bias))
    assert ops.linear_backward(x, w, g, has_bias=False, device=device)[2] is None


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize(("sa", "sb"), MATMUL_SHAPES[:3] + MATMUL_SHAPES[5:])
def test_matmul_linear_backward_cpu_matches_ref(dtype: str, sa: tuple, sb: tuple) -> None:
    dt = ops.as_dtype(dtype)
    a, b = rand(*sa).astype(dt), rand(*sb).astype(dt)
    g = rand(*np.matmul(a.astype(np.float32), b.astype(np.float32)).shape).astype(dt)
    for c, r in zip(
        ops.matmul_backward(a, b, g, device="cpu"), ops.matmul_backward(a, b, g, device="ref"), strict=True
    ):
        parity(c, r, dtype)
    x, w, gl = rand(2, 5, 3).astype(dt), rand(4, 3).astype(dt), rand(2, 5, 4).astype(dt)
    for c, r in zip(
        ops.linear_backward(x, w, gl, device="cpu"), ops.linear_backward(x, w, gl, device="ref"), strict=True
    ):
        parity(c, r, dtype)


@st.composite
def _matmul_shapes(draw: st.DrawFn) -> tuple[tuple[int, ...], tuple[int, ...]]:
    m, k, n = (draw(st.integers(1, 4)) for _ in range(3))
    batch = draw(st.lists(st.integers(1, 3), max_size=2))
    ba = [d if draw(st.booleans()) else 1 for d in batch]
    bb = [d if draw(st.booleans()) else 1 for d in batch]
    ba = ba[draw(st.integers(0, len(ba))) :]
    bb = bb[draw(st.integers(0, len(bb))) :]
    sa = (k,) if draw(st.integers(0, 5)) == 0 else (*ba, m, k)
    sb = (k,) if draw(st.integers(0, 5)) == 0 else (*bb, k, n)
    return sa, sb


@settings(max_examples=40, deadline=None)
@given(_matmul_shapes())
def test_matmul_backward_hypothesis_cpu_vs_ref(shapes: tuple) -> None:
    sa, sb = shapes
    a, b = rand(*sa), rand(*sb)
    g = rand(*np.matmul(a, b).shape)
    for c, r in zip(
        ops.matmul_backward(a, b, g, device="cpu"), ops.matmul_backward(a, b, g, device="ref"), strict=True
    ):
        np.testing.assert_allclose(c, r, rtol=1e-10, atol=1e-10)


# --------------------------------------------------------------------------- softmax family


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_softmax_log_softmax_backward_finite_differences(axis: int, device: str) -> None:
    x, g = rand(3, 4, 2), rand(3, 4, 2)
    y = ops.softmax(x, axis=axis, device="ref")
    dx = ops.softmax_backward(y, g, axis=axis, device=device)
    fd_close(dx, numgrad(lambda t: float((ops.softmax(t, axis=axis, device="ref") * g).sum()), x))
    ly = ops.log_softmax(x, axis=axis, device="ref")
    dlx = ops.log_softmax_backward(ly, g, axis=axis, device=device)
    fd_close(dlx, numgrad(lambda t: float((ops.log_softmax(t, axis=axis, device="ref") * g).sum()), x))


CE_CASES = [
    ((4, 5), "mean", 0.0),
    ((4, 5), "sum", 0.1),
    ((4, 5), "none", 0.0),
    ((3, 4, 2), "mean", 0.2),
    ((3, 4, 2), "none", 0.1),
    ((5,), "none", 0.1),
    ((5,), "mean", 0.0),
]


def _ce_inputs(shape: tuple) -> tuple[np.ndarray, np.ndarray]:
    x = rand(*shape)
    tshape = () if len(shape) == 1 else (shape[0], *shape[2:])
    t = RNG.integers(0, shape[0 if len(shape) == 1 else 1], size=tshape)
    if t.ndim:
        t.reshape(-1)[0] = -100  # one ignored position
    return x, t


@pytest.mark.parametrize(("shape", "reduction", "eps"), CE_CASES)
@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_cross_entropy_backward_finite_differences(
    shape: tuple, reduction: str, eps: float, device: str
) -> None:
    x, t = _ce_inputs(shape)
    kw = {"reduction": reduction, "label_smoothing": eps}
    g = rand(*t.shape) if reduction == "none" else np.asarray(1.7)

    def loss(xx: np.ndarray) -> float:
        return float((ops.cross_entropy(xx, t, device="ref", **kw) * g).sum())

    dx = ops.cross_entropy_backward(x, t, g, device=device, **kw)
    assert dx.shape == x.shape
    fd_close(dx, numgrad(loss, x))


def test_cross_entropy_backward_all_ignored_is_zero() -> None:
    x, t = rand(3, 4), np.full(3, -100)
    for device in ("ref", "cpu"):
        assert not ops.cross_entropy_backward(x, t, device=device).any()


@pytest.mark.parametrize("dtype", LOW)
def test_softmax_family_cpu_matches_ref(dtype: str) -> None:
    dt = ops.as_dtype(dtype)
    x, g = rand(6, 7).astype(dt), rand(6, 7).astype(dt)
    for axis in (0, -1):
        y = ops.softmax(x, axis=axis)
        parity(
            ops.softmax_backward(y, g, axis=axis), ops.softmax_backward(y, g, axis=axis, device="ref"), dtype
        )
        ly = ops.log_softmax(x, axis=axis)
        parity(
            ops.log_softmax_backward(ly, g, axis=axis),
            ops.log_softmax_backward(ly, g, axis=axis, device="ref"),
            dtype,
        )
    for shape, reduction, eps in CE_CASES:
        xx, t = _ce_inputs(shape)
        gg = rand(*t.shape).astype(dt) if reduction == "none" else 1.0
        kw = {"reduction": reduction, "label_smoothing": eps}
        xx = xx.astype(dt)
        parity(
            ops.cross_entropy_backward(xx, t, gg, **kw),
            ops.cross_entropy_backward(xx, t, gg, device="ref", **kw),
            dtype,
        )


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_softmax_backward_hypothesis_cpu_vs_ref(shape: list, data: st.DataObject) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x, g = rand(*shape), rand(*shape)
    y = ops.softmax(x, axis=axis)
    np.testing.assert_allclose(
        ops.softmax_backward(y, g, axis=axis), ops.softmax_backward(y, g, axis=axis, device="ref"), atol=1e-12
    )


# --------------------------------------------------------------------------- norms


@pytest.mark.parametrize("axis", [-1, -2])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_layer_norm_backward_finite_differences(axis: int, affine: bool, device: str) -> None:
    x = rand(2, 3, 4)
    norm = x.shape[axis:]
    w, b = (rand(*norm), rand(*norm)) if affine else (None, None)
    g = rand(*x.shape)

    def loss(xx: np.ndarray, ww: np.ndarray | None, bb: np.ndarray | None) -> float:
        return float((ops.layer_norm(xx, ww, bb, axis=axis, device="ref") * g).sum())

    dx, dw, db = ops.layer_norm_backward(x, w, g, axis=axis, device=device)
    fd_close(dx, numgrad(lambda t: loss(t, w, b), x))
    fd_close(db, numgrad(lambda t: loss(x, w, t), np.zeros(norm)))
    if affine:
        fd_close(dw, numgrad(lambda t: loss(x, t, b), w))
    else:
        assert dw is None


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_rms_norm_backward_finite_differences(affine: bool, device: str) -> None:
    x, g = rand(3, 5), rand(3, 5)
    w = rand(5) if affine else None
    dx, dw = ops.rms_norm_backward(x, w, g, device=device)
    fd_close(dx, numgrad(lambda t: float((ops.rms_norm(t, w, device="ref") * g).sum()), x))
    if affine:
        fd_close(dw, numgrad(lambda t: float((ops.rms_norm(x, t, device="ref") * g).sum()), w))


def test_norm_backward_saved_statistics_match_recomputed() -> None:
    x, w, g = rand(4, 6), rand(6), rand(4, 6)
    mean = x.mean(axis=1)
    rstd = 1 / np.sqrt(x.var(axis=1) + 1e-5)
    ms_rstd = 1 / np.sqrt((x * x).mean(axis=1, keepdims=True) + 1e-6)
    for device in ("ref", "cpu"):
        for got, want in zip(
            ops.layer_norm_backward(x, w, g, mean=mean, rstd=rstd, device=device),
            ops.layer_norm_backward(x, w, g, device=device),
            strict=True,
        ):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
        for got, want in zip(
            ops.rms_norm_backward(x, w, g, rstd=ms_rstd, device=device),
            ops.rms_norm_backward(x, w, g, device=device),
            strict=True,
        ):
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("block_rows", [None, 1, 3, 64])
def test_norm_backward_cpu_matches_ref_any_chunking(dtype: str, block_rows: int | None) -> None:
    from opstrata.ops.grad.norm import layer_norm_backward_cpu, rms_norm_backward_cpu

    dt = ops.as_dtype(dtype)
    x, w, g = (rand(7, 3, 8) * 3 + 1).astype(dt), rand(8).astype(dt), rand(7, 3, 8).astype(dt)
    ref = ops.layer_norm_backward(x, w, g, device="ref")
    for c, r in zip(layer_norm_backward_cpu(x, w, g, block_rows=block_rows), ref, strict=True):
        parity(c, r, dtype)
    ref = ops.rms_norm_backward(x, w, g, device="ref")
    for c, r in zip(rms_norm_backward_cpu(x, w, g, block_rows=block_rows), ref, strict=True):
        parity(c, r, dtype)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.integers(1, 5), min_size=1, max_size=3), st.data())
def test_layer_norm_backward_hypothesis_cpu_vs_ref(shape: list, data: st.DataObject) -> None:
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x, g = rand(*shape), rand(*shape)
    w = rand(*shape[axis:]) if data.draw(st.booleans()) else None
    for c, r in zip(
        ops.layer_norm_backward(x, w, g, axis=axis),
        ops.layer_norm_backward(x, w, g, axis=axis, device="ref"),
        strict=True,
    ):
        if r is None:
            assert c is None
        else:
            np.testing.assert_allclose(c, r, rtol=1e-9, atol=1e-9)


# --------------------------------------------------------------------------- activations, embedding


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_activation_backward_finite_differences(device: str) -> None:
    x = np.concatenate([rand(20) * 3, [0.0, -6.0, 6.0, 30.0, -30.0]])
    g = rand(x.size)
    for approx in ("none", "tanh"):
        dx = ops.gelu_backward(x, g, approximate=approx, device=device)
        fd_close(
            dx, numgrad(lambda t, a=approx: float((ops.gelu(t, approximate=a, device="ref") * g).sum()), x)
        )
    fd_close(
        ops.silu_backward(x, g, device=device),
        numgrad(lambda t: float((ops.silu(t, device="ref") * g).sum()), x),
    )


@pytest.mark.parametrize("dtype", LOW)
def test_activation_backward_cpu_matches_ref(dtype: str) -> None:
    dt = ops.as_dtype(dtype)
    x, g = (rand(9, 11) * 4).astype(dt), rand(9, 11).astype(dt)
    for approx in ("none", "tanh"):
        parity(
            ops.gelu_backward(x, g, approximate=approx),
            ops.gelu_backward(x, g, approximate=approx, device="ref"),
            dtype,
        )
    parity(ops.silu_backward(x, g), ops.silu_backward(x, g, device="ref"), dtype)


@pytest.mark.parametrize("device", ["ref", "cpu"])
def test_embedding_backward_finite_differences(device: str) -> None:
    idx = np.array([[0, 3, 3], [1, 3, 0]])
    w, g = rand(5, 2), rand(2, 3, 2)
    dw = ops.embedding_backward(idx, g, 5, device=device)
    fd_close(dw, numgrad(lambda t: float((ops.embedding(idx, t, device="ref") * g).sum()), w))


@pytest.mark.parametrize("dtype", LOW)
def test_embedding_backward_cpu_matches_ref(dtype: str) -> None:
    dt = ops.as_dtype(dtype)
    idx = RNG.integers(0, 50, size=(8, 40)).astype(np.int32)
    g = rand(8, 40, 16).astype(dt)
    want = ops.embedding_backward(idx, g, 64, device="ref")
    for method in (None, "auto", "bincount", "sort", "add_at"):
        parity(ops.call("embedding_backward", idx, g, 64, method=method), want, dtype)
    parity(
        ops.embedding_backward(idx[:1, :3], g[:1, :3], 64),
        ops.embedding_backward(idx[:1, :3], g[:1, :3], 64, device="ref"),
        dtype,
    )
    empty = ops.embedding_backward(np.zeros((0,), np.int64), np.zeros((0, 4), dt), 3)
    assert empty.shape == (3, 4) and not empty.astype(np.float32).any()


# --------------------------------------------------------------------------- errors


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (
            lambda: ops.matmul_backward(np.ones((2, 3)), np.ones((3, 4)), np.ones((2, 5))),
            r"matmul_backward.*'grad'.*\(2, 4\)",
        ),
        (
            lambda: ops.matmul_backward(np.ones((2, 3)), np.ones((3, 4)), np.ones((2, 4), np.float32)),
            r"'grad' expected dtype float64",
        ),
        (
            lambda: ops.matmul_backward(np.ones((2, 3)), np.ones((2, 4)), np.ones((2, 4))),
            r"inner dims must match",
        ),
        (
            lambda: ops.linear_backward(np.ones((2, 3)), np.ones((4, 3)), np.ones((2, 3))),
            r"linear_backward.*grad",
        ),
        (
            lambda: ops.softmax_backward(np.ones((2, 3)), np.ones((3, 2))),
            r"softmax_backward.*'grad'.*\(2, 3\)",
        ),
        (lambda: ops.softmax_backward(np.ones((2, 3)), np.ones((2, 3)), axis=2), r"softmax_backward.*'axis'"),
        (lambda: ops.softmax_backward(np.ones((2, 3), np.int32), np.ones((2, 3))), r"'y' expected"),
        (
            lambda: ops.cross_entropy_backward(np.ones((2, 3)), np.array([0, 1]), np.ones(2)),
            r"cross_entropy_backward.*'grad'.*a scalar",
        ),
        (
            lambda: ops.cross_entropy_backward(
                np.ones((2, 3)), np.array([0, 1]), np.ones(3), reduction="none"
            ),
            r"'grad' expected shape \(2,\)",
        ),
        (
            lambda: ops.cross_entropy_backward(np.ones((2, 3)), np.array([0, 5])),
            r"cross_entropy_backward: argument 'target'.*class indices in \[0, 3\)",
        ),
        (
            lambda: ops.layer_norm_backward(np.ones((2, 3)), np.ones(4), np.ones((2, 3))),
            r"'weight' expected shape",
        ),
        (
            lambda: ops.layer_norm_backward(np.ones((2, 3)), None, np.ones((2, 3)), mean=np.ones(3)),
            r"layer_norm_backward.*'mean'.*\(2,\)",
        ),
        (lambda: ops.rms_norm_backward(np.ones((2, 3)), None, np.ones((2, 3)), eps=-1.0), r"'eps'"),
        (
            lambda: ops.call("layer_norm_backward", np.ones((2, 3)), None, np.ones((2, 3)), block_rows=0),
            r"layer_norm_backward.*'block_rows'",
        ),
        (lambda: ops.gelu_backward(np.ones(3), np.ones(3), approximate="erf"), r"'approximate'"),
        (lambda: ops.silu_backward(np.ones(3), np.ones(4)), r"silu_backward.*'grad'"),
        (lambda: ops.embedding_backward(np.array([0, 7]), np.ones((2, 4)), 5), r"7 at position \(1,\)"),
        (lambda: ops.embedding_backward(np.array([0, 1]), np.ones((3, 4)), 5), r"'grad' expected shape"),
        (lambda: ops.embedding_backward(np.array([0.0]), np.ones((1, 4)), 5), r"'indices'"),
        (lambda: ops.embedding_backward(np.array([0]), np.ones((1, 4)), -1), r"'num_embeddings'"),
        (
            lambda: ops.call("embedding_backward", np.array([0]), np.ones((1, 4)), 2, method="fast"),
            r"'method'",
        ),
    ],
)
def test_backward_errors(call: Callable[[], object], match: str) -> None:
    with pytest.raises(ops.OpError, match=match):
        call()


def test_backward_ops_are_registered_on_ref_and_cpu() -> None:
    for op in (
        "matmul_backward",
        "linear_backward",
        "softmax_backward",
        "log_softmax_backward",
        "cross_entropy_backward",
        "layer_norm_backward",
        "rms_norm_backward",
        "gelu_backward",
        "silu_backward",
        "embedding_backward",
    ):
        assert {e.device for e in ops.kernels(op)} == {"ref", "cpu"}, op
        assert ops.dispatch_path(op, "cpu", "bfloat16") == "native"
