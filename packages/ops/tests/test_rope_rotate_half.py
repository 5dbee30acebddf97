"""rope_rotate_half: the exported RoPE expression against its literal numpy form, every broadcast layout
of cos / sin, both devices, low precision, out=, and the errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.ops as ops
from opstrata.ops import OpError
from opstrata.ops._dtypes import bfloat16, float16


def _literal(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    h = x.shape[-1] // 2
    return x * cos + np.concatenate([-x[..., h:], x[..., :h]], axis=-1) * sin


@settings(max_examples=60, deadline=None)
@given(
    b=st.integers(1, 3), h=st.integers(1, 4), n=st.integers(1, 9), half=st.integers(1, 12),
    layout=st.sampled_from(["full", "per_position", "per_batch", "scalar_last"]), seed=st.integers(0, 999),
    device=st.sampled_from(["cpu", "ref"]),
)  # fmt: skip
def test_matches_the_exported_expression_bit_for_bit(b, h, n, half, layout, seed, device) -> None:
    rng = np.random.default_rng(seed)
    d = 2 * half
    x = rng.standard_normal((b, h, n, d)).astype(np.float32)
    shape = {"full": (b, h, n, d), "per_position": (1, 1, n, d), "per_batch": (b, 1, n, d),
             "scalar_last": (n, 1)}[layout]  # fmt: skip
    cos, sin = (rng.standard_normal(shape).astype(np.float32) for _ in range(2))
    got = ops.rope_rotate_half(x, cos, sin, device=device)
    assert got.dtype == np.float32 and got.shape == x.shape
    np.testing.assert_array_equal(got, _literal(x, cos, sin))  # the same float32 operations


def test_out_and_low_precision() -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    cos, sin = np.cos(x[:1, :1]), np.sin(x[:1, :1])
    out = np.empty_like(x)
    assert ops.rope_rotate_half(x, cos, sin, out=out) is out
    np.testing.assert_array_equal(out, _literal(x, cos, sin))
    for dt in (float16, bfloat16):
        got = ops.rope_rotate_half(x.astype(dt), cos.astype(dt), sin.astype(dt))
        assert got.dtype == dt
        want = _literal(*(a.astype(dt).astype(np.float32) for a in (x, cos, sin))).astype(dt)
        np.testing.assert_array_equal(got.astype(np.float32), want.astype(np.float32))


@pytest.mark.parametrize("device", ["cpu", "ref"])
def test_errors_name_the_argument(device: str) -> None:
    x = np.ones((1, 2, 3, 4), np.float32)
    with pytest.raises(OpError, match=r"x.*even last dim"):
        ops.rope_rotate_half(np.ones((1, 2, 3, 5), np.float32), x[..., :1], x[..., :1], device=device)
    with pytest.raises(OpError, match=r"cos.*broadcasting to x's \(1, 2, 3, 4\)"):
        ops.rope_rotate_half(x, np.ones((2, 2, 3, 4), np.float32), x, device=device)
    with pytest.raises(OpError, match="sin"):
        ops.rope_rotate_half(x, x, np.ones((1, 2, 3, 2), np.float32), device=device)
    with pytest.raises(OpError, match="out"):
        ops.rope_rotate_half(x, x, x, out=np.empty((1, 2, 3, 4), np.float64), device=device)
