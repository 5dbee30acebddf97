"""ops.bind: a zero-argument call with the kernel's checks done once; matmul / linear bind to the very
BLAS call the kernel makes (same bits), attention to one native call (the loop kernel for small problems,
the BLAS-backed one above it; within float32 tolerance of the numpy / reference kernels, every mask kind,
causal, GQA, strided (B, S, H, D) views, masked rows)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import native_status


def test_matmul_and_linear_bind_to_the_same_bits() -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 5, 8)).astype(np.float32)
    w = rng.standard_normal((8, 6)).astype(np.float32)
    b = rng.standard_normal(6).astype(np.float32)
    out = np.empty((2, 5, 6), np.float32)
    call = ops.bind("matmul", a, w, out=out)
    a[:] = rng.standard_normal(a.shape)  # the call reads the arrays as they are when it runs
    call()
    np.testing.assert_array_equal(out, ops.matmul(a, w))
    wt = np.ascontiguousarray(w.T)  # Linear's (out, in) weight
    lin = ops.bind("linear", a, wt, b, out=out)
    lin()
    np.testing.assert_array_equal(out, ops.linear(a, wt, b))


def test_bind_falls_back_to_the_kernel_with_its_checks() -> None:
    a = np.ones((3, 4), np.float32)
    out = np.empty((3, 5), np.float32)
    call = ops.bind("matmul", a, np.ones((5, 5), np.float32), out=out)  # K mismatch: the kernel raises
    assert call is not None
    with pytest.raises(ops.OpError, match="matmul"):
        call()
    assert ops.bind("log_softmax", a, out=np.empty_like(a)) is None  # its kernel writes no out=: not bindable


needs_native = pytest.mark.skipif(native_status(build=True).available is not True, reason="no native library")


@needs_native
@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 2), hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 2]), n=st.integers(1, 12),
    m=st.integers(1, 12), d=st.sampled_from([4, 8, 12]), dv=st.sampled_from([4, 8, 12]),
    mask=st.sampled_from([None, "add", "bool", "bool_rows_empty"]), causal=st.booleans(), bshd=st.booleans(),
    seed=st.integers(0, 999),
)  # fmt: skip
def test_small_attention_binds_one_native_call(b, hkv, group, n, m, d, dv, mask, causal, bshd, seed) -> None:
    rng = np.random.default_rng(seed)
    h = hkv * group

    def t(heads: int, length: int, width: int) -> np.ndarray:
        if bshd:  # a (B, S, H, D) tensor seen as (B, H, S, D): strided, no copy
            return rng.standard_normal((b, length, heads, width)).astype(np.float32).swapaxes(1, 2)
        return rng.standard_normal((b, heads, length, width)).astype(np.float32)

    q, k, v = t(h, n, d), t(hkv, m, d), t(hkv, m, dv)
    mk = None
    if mask == "add":
        mk = rng.standard_normal((1, 1, n, m)).astype(np.float32)
    elif mask == "bool":
        mk = rng.random((b, 1, 1, m)) > 0.3
    elif mask == "bool_rows_empty":
        mk = np.zeros((b, h, n, m), bool)
        mk[..., : n // 2, :] = True  # the other rows see no key at all: zeros
    want = ops.attention(q, k, v, causal=causal, mask=mk, scale=0.3)
    out = np.empty((b, n, h, dv), np.float32).swapaxes(1, 2) if bshd else np.empty((b, h, n, dv), np.float32)
    call = ops.bind("attention", q, k, v, out=out, causal=causal, mask=mk, scale=0.3)
    assert getattr(call, "name", "") == "opstrata_attention_f32"  # one packed native call
    assert call() is out
    np.testing.assert_allclose(out, want, rtol=2e-5, atol=2e-6)


@needs_native
def test_large_attention_binds_the_blas_kernel_or_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    from opstrata.ops.kernels import attention_single_tile as single

    q = np.ones((1, 8, 64, 64), np.float32)  # above the loop kernel's size
    call = ops.bind("attention", q, q, q, out=np.empty_like(q))
    if single.sgemm_ready(single.library()):
        assert getattr(call, "name", "") == "opstrata_attention_blas_f32"
    else:  # numpy's BLAS not reachable from C (e.g. the lowest numpy): the numpy path
        assert call is None
    monkeypatch.setattr(single, "sgemm_ready", lambda lib: False)
    assert ops.bind("attention", q, q, q, out=np.empty_like(q)) is None
    q16 = np.ones((1, 2, 4, 8), np.float16)
    assert ops.bind("attention", q16, q16, q16, out=np.empty_like(q16)) is None  # float32 only


def _blas_attention_ready() -> bool:
    from opstrata.ops.kernels import attention_single_tile as single

    lib = single.library()
    return lib is not None and hasattr(lib, "opstrata_attention_blas_f32") and single.sgemm_ready(lib)


@needs_native
@settings(max_examples=25, deadline=None)
@given(
    hkv=st.sampled_from([1, 2]), group=st.sampled_from([1, 3]), n=st.integers(70, 150), m=st.integers(70, 150),
    d=st.sampled_from([32, 64]), dv=st.sampled_from([32, 64]),
    mask=st.sampled_from([None, "add", "add_inf", "bool", "bool_rows_empty"]), causal=st.booleans(),
    bshd=st.booleans(), seed=st.integers(0, 999),
)  # fmt: skip
def test_large_attention_blas_kernel_matches_the_reference(
    hkv, group, n, m, d, dv, mask, causal, bshd, seed
) -> None:
    """Above the loop kernel's size the bound call multiplies through numpy's BLAS in 64-row blocks (a
    causal block only up to its last row's key); every mask kind, GQA, strided views, rows with no key
    (zeros, logsumexp -inf) and causal with fewer keys than queries, against the reference kernel."""
    if not _blas_attention_ready():
        pytest.skip("numpy's BLAS is not reachable from the native library")
    rng = np.random.default_rng(seed)
    h = hkv * group

    def t(heads: int, length: int, width: int) -> np.ndarray:
        if bshd:
            return rng.standard_normal((1, length, heads, width)).astype(np.float32).swapaxes(1, 2)
        return rng.standard_normal((1, heads, length, width)).astype(np.float32)

    q, k, v = t(h, n, d), t(hkv, m, d), t(hkv, m, dv)
    mk = None
    if mask == "add":
        mk = rng.standard_normal((1, 1, n, m)).astype(np.float32)
    elif mask == "add_inf":  # the exporters' causal mask: -inf (or -3.4e38) above the diagonal
        mk = np.where(np.tril(np.ones((n, m), bool)), 0.0, -np.inf).astype(np.float32)[None, None]
    elif mask == "bool":
        mk = rng.random((1, 1, 1, m)) > 0.3
    elif mask == "bool_rows_empty":
        mk = np.zeros((1, h, n, m), bool)
        mk[..., : n // 2, :] = True
    want, want_lse = ops.attention(q, k, v, causal=causal, mask=mk, scale=0.2, return_lse=True, device="ref")
    out = np.empty((1, n, h, dv), np.float32).swapaxes(1, 2) if bshd else np.empty((1, h, n, dv), np.float32)
    call = ops.bind("attention", q, k, v, out=out, causal=causal, mask=mk, scale=0.2)
    assert getattr(call, "name", "") == "opstrata_attention_blas_f32"
    assert call() is out
    np.testing.assert_allclose(out, want, rtol=1e-4, atol=2e-5)
    got, lse = ops.attention(q, k, v, causal=causal, mask=mk, scale=0.2, return_lse=True)  # eager: same call
    np.testing.assert_array_equal(got, out)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(want_lse))
    finite = np.isfinite(want_lse)
    np.testing.assert_allclose(lse[finite], want_lse[finite], rtol=1e-5, atol=1e-5)


@needs_native
@pytest.mark.parametrize("causal", [False, True])
def test_small_attention_eager_path_is_the_native_call_with_lse(causal: bool) -> None:
    """ops.attention on a small float32 problem runs the same native call (bound and eager results
    agree to the bit), logsumexp included; a fully masked row gives zeros and -inf."""
    rng = np.random.default_rng(3)
    q, k, v = (rng.standard_normal((2, 4, 6, 8)).astype(np.float32) for _ in range(3))
    mask = rng.random((2, 1, 6, 6)) > 0.2
    mask[:, :, 2] = False
    out, lse = ops.attention(q, k, v, causal=causal, mask=mask, return_lse=True)
    ref, ref_lse = ops.attention(q, k, v, causal=causal, mask=mask, return_lse=True, device="ref")
    np.testing.assert_allclose(out, ref, rtol=2e-5, atol=2e-6)
    finite = np.isfinite(ref_lse)
    np.testing.assert_allclose(lse[finite], ref_lse[finite], rtol=1e-5, atol=1e-5)
    assert (out[:, :, 2] == 0).all() and np.isneginf(lse[:, :, 2]).all()
    bound_out = np.empty_like(out)
    ops.bind("attention", q, k, v, out=bound_out, causal=causal, mask=mask)()
    np.testing.assert_array_equal(bound_out, out)


@needs_native
def test_norm_bias_act_and_rope_binders_give_the_kernels_bits() -> None:
    """layer_norm / rms_norm / bias_act / rope_rotate_half bind to their C call: the same bits as the
    eager kernel, on the values the arrays hold at call time; in place where the kernel allows it."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((3, 7, 64)).astype(np.float32)
    w, b = rng.standard_normal(64).astype(np.float32), rng.standard_normal(64).astype(np.float32)
    out = np.empty_like(x)
    cases = [
        (ops.bind("layer_norm", x, w, b, out=out, eps=1e-5), lambda: ops.layer_norm(x, w, b, eps=1e-5)),
        (ops.bind("rms_norm", x, w, out=out, eps=1e-6), lambda: ops.rms_norm(x, w, eps=1e-6)),
        (
            ops.bind("bias_act", x, b, None, out=out, act="gelu_tanh"),
            lambda: ops.bias_act(x, b, act="gelu_tanh"),
        ),
    ]
    for call, eager in cases:
        assert call is not None
        x[:] = rng.standard_normal(x.shape)
        call()
        np.testing.assert_array_equal(out, eager())
    np.testing.assert_allclose(ops.rms_norm(x, w), ops.rms_norm(x, w, device="ref"), rtol=2e-6, atol=1e-6)
    inplace = x.copy()
    ops.bind("rms_norm", inplace, w, out=inplace)()
    np.testing.assert_array_equal(inplace, ops.rms_norm(x, w))
    q = rng.standard_normal((2, 5, 4, 8)).astype(np.float32)  # (B, S, H, D), cos (B, S, 1, D)
    cos, sin = (rng.standard_normal((2, 5, 1, 8)).astype(np.float32) for _ in range(2))
    rot = np.empty_like(q)
    ops.bind("rope_rotate_half", q, cos, sin, out=rot)()
    np.testing.assert_array_equal(rot, ops.rope_rotate_half(q, cos, sin, device="ref"))
    bad = ops.bind("rms_norm", x, w[:32], out=out)  # a weight that does not fit: the kernel, which raises
    with pytest.raises(ops.OpError, match="rms_norm"):
        bad()


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(1, 2), cg=st.integers(1, 3), og=st.integers(1, 3), groups=st.sampled_from([1, 2]),
    hw=st.integers(3, 9), k=st.sampled_from([1, 2, 3]), stride=st.sampled_from([1, 2]), dil=st.sampled_from([1, 2]),
    pads=st.tuples(*(st.integers(0, 2) for _ in range(4))), bias=st.booleans(), seed=st.integers(0, 999),
)  # fmt: skip
def test_conv2d_binds_to_the_eager_kernels_bits(
    n, cg, og, groups, hw, k, stride, dil, pads, bias, seed
) -> None:
    """Grouped, strided, dilated, asymmetrically padded convolutions (and the 1x1 fast case): the bound
    call gives the eager kernel's bits on the values in x at call time."""
    rng = np.random.default_rng(seed)
    c, o = cg * groups, og * groups
    if dil * (k - 1) + 1 > hw + min(pads[0] + pads[2], pads[1] + pads[3]):
        return  # no output position
    x = rng.standard_normal((n, c, hw, hw)).astype(np.float32)
    w = rng.standard_normal((o, cg, k, k)).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32) if bias else None
    kw = {"stride": stride, "padding": pads, "dilation": dil, "groups": groups}
    out = np.empty_like(ops.conv2d(x, w, b, **kw))
    call = ops.bind("conv2d", x, w, b, out=out, **kw)
    assert call is not None
    x[:] = rng.standard_normal(x.shape)
    call()
    np.testing.assert_array_equal(out, ops.conv2d(x, w, b, **kw))


@settings(max_examples=40, deadline=None)
@given(
    shape=st.lists(st.integers(1, 6), min_size=1, max_size=4), data=st.data(), keepdims=st.booleans(),
    dtype=st.sampled_from([np.float32, np.float64]), seed=st.integers(0, 999),
)  # fmt: skip
def test_mean_binds_to_the_eager_kernels_bits(shape, data, keepdims, dtype, seed) -> None:
    axes = data.draw(st.none() | st.lists(st.integers(0, len(shape) - 1), min_size=1, unique=True).map(tuple))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape).astype(dtype)
    out = np.empty_like(ops.mean(x, axis=axes, keepdims=keepdims))
    call = ops.bind("mean", x, out=out, axis=axes, keepdims=keepdims)
    assert call is not None
    x[...] = rng.standard_normal(shape)
    call()
    np.testing.assert_array_equal(out, ops.mean(x, axis=axes, keepdims=keepdims))


def test_mean_and_max_pool_binders_refuse_what_they_do_not_cover() -> None:
    x16 = np.ones((2, 3), np.float16)  # accumulates in float32: the eager kernel
    assert ops.bind("mean", x16, out=np.empty(2, np.float16), axis=1) is None
    xi = np.ones((2, 3), np.int32)  # integer mean truncates: the eager kernel
    assert ops.bind("mean", xi, out=np.empty(2, np.int32), axis=1) is None
    x = np.ones((2, 3), np.float32)
    assert ops.bind("mean", x, out=np.empty(3, np.float32), axis=1) is None  # wrong out shape
    assert ops.bind("mean", x, out=np.empty((2, 0), np.float32)[:, :0].reshape(2, 0), axis=(0, 1)) is None
    img = np.ones((1, 2, 4, 4), np.float32)
    bad_out = np.empty((1, 2, 3, 3), np.float32)  # kernel 2 stride 2 gives 2x2
    if ops.native_status().available:
        assert ops.bind("max_pool2d", img, out=bad_out, kernel_size=2) is None
        good = np.empty((1, 2, 2, 2), np.float32)
        call = ops.bind("max_pool2d", img, out=good, kernel_size=2)
        assert call is not None
        img[...] = np.arange(32, dtype=np.float32).reshape(img.shape)
        call()
        np.testing.assert_array_equal(good, ops.max_pool2d(img, kernel_size=2))
