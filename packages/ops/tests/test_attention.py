"""attention and rotary_embedding: ref against float64 per-row loops / complex rotation, cpu against ref."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops._dtypes import FLOAT_DTYPES
from opstrata.ops.kernels.flash_attention import attention_cpu
from opstrata.ops.testing import assert_close, tolerances

SETTINGS = settings(max_examples=25, deadline=None)
DTYPES = pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
DEVICES = pytest.mark.parametrize("device", ["ref", "cpu"])


def close(actual: np.ndarray, expected: np.ndarray) -> None:
    rtol, atol = tolerances(expected.dtype)
    if "float8" in expected.dtype.name:
        atol = max(atol, float(ml_dtypes.finfo(expected.dtype).smallest_subnormal))
    assert_close(actual, expected, rtol=rtol, atol=atol)


def attention_loops(q, k, v, *, causal=False, mask=None, scale=None) -> np.ndarray:
    """One query row at a time in float64: scores, mask, softmax, weighted sum; empty rows -> 0."""
    q, k, v = (t.astype(np.float64) for t in (q, k, v))
    b_, h_, n_, d = q.shape
    hkv, m_ = k.shape[1], k.shape[2]
    scale = 1 / math.sqrt(d) if scale is None else scale
    full = None if mask is None else np.broadcast_to(mask, (b_, h_, n_, m_))
    out = np.zeros((b_, h_, n_, v.shape[3]))
    for b in range(b_):
        for h in range(h_):
            kv = h // (h_ // hkv)
            for i in range(n_):
                scores = []
                for j in range(m_):
                    if causal and j > i + m_ - n_:
                        continue
                    s = float(q[b, h, i] @ k[b, kv, j]) * scale
                    if full is not None and full.dtype == bool:
                        if not full[b, h, i, j]:
                            continue
                    elif full is not None:
                        s += float(full[b, h, i, j])
                    if s != -math.inf:
                        scores.append((s, j))
                if scores:
                    top = max(s for s, _ in scores)
                    w = [(math.exp(s - top), j) for s, j in scores]
                    out[b, h, i] = sum(wj * v[b, kv, j] for wj, j in w) / sum(wj for wj, _ in w)
    return out


@st.composite
def attention_cases(draw: st.DrawFn) -> dict:
    b, hkv, group = draw(st.integers(1, 2)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    n, m, d, dv = (
        draw(st.integers(0, 6)),
        draw(st.integers(0, 7)),
        draw(st.integers(1, 5)),
        draw(st.integers(1, 4)),
    )
    full = (b, hkv * group, n, m)
    mask_kind = draw(st.sampled_from(["none", "bool", "float", "neg_inf"]))
    mask_shape = tuple(draw(st.sampled_from([s, 1])) for s in full)[
        draw(st.integers(0, 2)) :
    ]  # broadcastable
    return dict(
        q=(b, hkv * group, n, d),
        kv=(b, hkv, m, d),
        dv=dv,
        causal=draw(st.booleans()),
        mask_kind=mask_kind,
        mask_shape=mask_shape,
        scale=draw(st.sampled_from([None, 0.5])),
        block_q=draw(st.integers(1, 4)),  # N is often not a multiple of it
    )


def make(case: dict, dtype, seed: int):
    rng = np.random.default_rng(seed)
    q = rng.uniform(-1, 1, case["q"]).astype(dtype)
    k = rng.uniform(-1, 1, case["kv"]).astype(dtype)
    v = rng.uniform(-1, 1, (*case["kv"][:3], case["dv"])).astype(dtype)
    shape, kind = case["mask_shape"], case["mask_kind"]
    mask = {
        "none": None,
        "bool": rng.random(shape) > 0.3,
        "float": rng.uniform(-1, 1, shape).astype(dtype),  # a mask in q's dtype, cast per block
        "neg_inf": np.where(rng.random(shape) > 0.3, 0.0, -np.inf).astype(np.float32),  # e4m3fn has no inf
    }[kind]
    return q, k, v, dict(causal=case["causal"], mask=mask, scale=case["scale"])


@DTYPES
@SETTINGS
@given(case=attention_cases(), seed=st.integers(0, 2**16))
def test_attention_ref_matches_float64_loops(dtype, case, seed) -> None:
    q, k, v, kw = make(case, dtype, seed)
    close(ops.attention(q, k, v, device="ref", **kw), attention_loops(q, k, v, **kw).astype(dtype))


@DTYPES
@SETTINGS
@given(case=attention_cases(), seed=st.integers(0, 2**16))
def test_attention_cpu_blocks_match_ref(dtype, case, seed) -> None:
    q, k, v, kw = make(case, dtype, seed)
    ref = ops.attention(q, k, v, device="ref", **kw)
    cpu = ops.attention(q, k, v, device="cpu", **kw)
    assert cpu.dtype == ref.dtype == dtype and cpu.shape == (*q.shape[:3], v.shape[3])
    close(cpu, ref)
    close(attention_cpu(q, k, v, block_q=case["block_q"], **kw), ref)


@DEVICES
def test_fully_masked_rows_output_zeros(device) -> None:
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((1, 2, 3, 4)).astype(np.float32) for _ in range(3))
    keep = np.ones((3, 3), bool)
    keep[1] = False  # query 1 sees nothing
    out = ops.attention(q, k, v, mask=keep, device=device)
    assert np.all(out[:, :, 1] == 0) and np.isfinite(out).all()
    additive = np.where(keep, 0.0, -np.inf).astype(np.float32)
    assert_close(ops.attention(q, k, v, mask=additive, device=device), out)
    # causal with more queries than keys: the first N - M queries see no key at all
    out = ops.attention(q, k[:, :, :1], v[:, :, :1], causal=True, device=device)
    assert np.all(out[:, :, :2] == 0) and np.allclose(out[:, :, 2], v[:, :, 0])
    assert np.all(ops.attention(q, k[:, :, :0], v[:, :, :0], device=device) == 0)  # M == 0


@DEVICES
def test_causal_is_bottom_right_aligned_for_kv_cache_decoding(device) -> None:
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 1, 5, 4)).astype(np.float64) for _ in range(3))
    full = ops.attention(q, k, v, causal=True, device=device)
    # decoding the last 2 queries against all 5 keys (3 cached) gives the last 2 rows of the full pass
    assert_close(ops.attention(q[:, :, 3:], k, v, causal=True, device=device), full[:, :, 3:])
    # a single new query sees every cached key: causal changes nothing
    assert_close(
        ops.attention(q[:, :, 4:], k, v, causal=True, device=device),
        ops.attention(q[:, :, 4:], k, v, device=device),
    )


@DEVICES
def test_grouped_query_heads_share_kv(device) -> None:
    rng = np.random.default_rng(2)
    q = rng.standard_normal((2, 6, 3, 4))
    k, v = rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 5, 4))
    gqa = ops.attention(q, k, v, device=device)
    mha = ops.attention(q, np.repeat(k, 3, axis=1), np.repeat(v, 3, axis=1), device=device)
    assert_close(gqa, mha)


@DEVICES
def test_large_logits_and_low_precision(device) -> None:
    q = np.full((1, 1, 2, 4), 300.0, np.float32)  # scores 1.8e5: a naive exp overflows
    out = ops.attention(q, q, np.ones((1, 1, 2, 4), np.float32), device=device)
    assert np.isfinite(out).all()
    qb = np.ones((1, 1, 1, 8), ml_dtypes.bfloat16)
    vb = np.ones((1, 1, 4096, 8), ml_dtypes.bfloat16)  # 4096 equal weights: fp32 sums keep the mean at 1
    out = ops.attention(qb, np.ones((1, 1, 4096, 8), ml_dtypes.bfloat16), vb, device=device)
    assert out.dtype == ml_dtypes.bfloat16 and np.all(out.astype(np.float32) == 1.0)


@DEVICES
@pytest.mark.parametrize(
    ("shapes", "kw", "pattern"),
    [
        (
            ((1, 3, 2, 4), (1, 2, 2, 4)),
            {},
            r"attention: argument 'k' expected a head count dividing q's H = 3",
        ),
        (((1, 2, 2, 4), (1, 2, 2, 5)), {}, r"attention: argument 'k' expected shape \(1, Hkv, M, 4\)"),
        (((1, 2, 4), (1, 2, 2, 4)), {}, r"attention: argument 'q' expected 4 dims \(\[B, H, N, D\]\)"),
        (
            ((1, 2, 2, 4), (1, 2, 2, 4)),
            {"mask": np.ones((3, 2), bool)},
            r"attention: argument 'mask'.*\(1, 2, 2, 2\)",
        ),
        (
            ((1, 2, 2, 4), (1, 2, 2, 4)),
            {"mask": np.ones((2, 2), np.int32)},
            r"attention: argument 'mask'.*int32",
        ),
    ],
)
def test_attention_errors_name_op_and_argument(device, shapes, kw, pattern) -> None:
    q, k = (np.ones(s) for s in shapes)
    with pytest.raises(ops.OpError, match=pattern):
        ops.attention(q, k, k, device=device, **kw)


# ---------------------------------------------------------------------------------------------
# rotary embedding
# ---------------------------------------------------------------------------------------------


def rotary_complex(x, cos, sin, interleaved) -> np.ndarray:
    """Each channel pair as a complex number times e^{i theta}, in float64."""
    x = x.astype(np.float64)
    h = x.shape[-1] // 2
    a, b = (x[..., 0::2], x[..., 1::2]) if interleaved else (x[..., :h], x[..., h:])
    z = (a + 1j * b) * (cos.astype(np.float64) + 1j * sin.astype(np.float64))
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = z.real, z.imag
    else:
        out[..., :h], out[..., h:] = z.real, z.imag
    return out


@DTYPES
@SETTINGS
@given(
    shape=st.tuples(
        st.integers(0, 2), st.integers(1, 3), st.integers(0, 5), st.integers(0, 4).map(lambda d: 2 * d)
    ),
    interleaved=st.booleans(),
    seed=st.integers(0, 2**16),
)
def test_rotary_matches_complex_rotation_and_cpu_matches_ref(dtype, shape, interleaved, seed) -> None:
    rng = np.random.default_rng(seed)
    x = rng.uniform(-1, 1, shape).astype(dtype)
    theta = rng.uniform(-math.pi, math.pi, (shape[2], shape[3] // 2))
    cos, sin = np.cos(theta).astype(np.float32), np.sin(theta).astype(np.float32)
    ref = ops.rotary_embedding(x, cos, sin, interleaved=interleaved, device="ref")
    close(ref, rotary_complex(x, cos, sin, interleaved).astype(dtype))
    close(ops.rotary_embedding(x, cos, sin, interleaved=interleaved, device="cpu"), ref)


@DEVICES
def test_rotary_layouts_differ_only_by_channel_order(device) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((1, 2, 3, 8))
    theta = rng.standard_normal((3, 4))
    perm = np.array([0, 4, 1, 5, 2, 6, 3, 7])  # rotate-half order -> interleaved order
    half = ops.rotary_embedding(x, np.cos(theta), np.sin(theta), device=device)
    inter = ops.rotary_embedding(x[..., perm], np.cos(theta), np.sin(theta), interleaved=True, device=device)
    assert_close(inter, half[..., perm])


@DEVICES
@pytest.mark.parametrize(
    ("x_shape", "cs_shape", "pattern"),
    [
        ((1, 1, 3, 5), (3, 2), r"rotary_embedding: argument 'x' expected an even head dim"),
        ((1, 1, 3, 4), (3, 4), r"rotary_embedding: argument 'cos' expected shape \(3, 2\)"),
        ((1, 3, 4), (3, 2), r"rotary_embedding: argument 'x' expected 4 dims"),
    ],
)
def test_rotary_errors(device, x_shape, cs_shape, pattern) -> None:
    with pytest.raises(ops.OpError, match=pattern):
        ops.rotary_embedding(np.ones(x_shape), np.ones(cs_shape), np.ones(cs_shape), device=device)
