"""Linear attention (ONNX operator specification ``LinearAttention``, opset 27) on ``ref`` and ``cpu``.

The recurrent form of the spec, token by token over (B, H_kv, d_k, d_v) states::

    linear:       S_t = S_{t-1} + k_t v_t^T
    gated:        S_t = exp(g_t) S_{t-1} + k_t v_t^T
    delta:        S_t = S_{t-1} + k_t (beta_t (v_t - S_{t-1}^T k_t))^T
    gated_delta:  S_t = exp(g_t) S_{t-1} + k_t (beta_t (v_t - exp(g_t) S_{t-1}^T k_t))^T
    o_t = scale q_t^T S_t            (grouped-query: query head h reads KV head h // (H_q / H_kv))

q/k/v/decay/beta are packed (B, T, H*D); the state accumulates in float32 (float64 for float64 inputs)
and is rounded once, like the spec's reference. The chunk-parallel form is a tuning choice of the spec
that does not change results, so one recurrent implementation serves both devices.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._errors import OpError, check_dtype
from .._registry import call, register

__all__ = ["LINEAR_ATTENTION_RULES", "linear_attention"]

#: The spec's update rules.
LINEAR_ATTENTION_RULES: tuple[str, ...] = ("linear", "gated", "delta", "gated_delta")
_FLOATS = (np.float16, np.float32, np.float64)
_OP = "linear_attention"


def _heads(x: np.ndarray, name: str, heads: int) -> np.ndarray:
    """(B, T, H*D) -> (B, H, T, D)."""
    if x.ndim != 3 or x.shape[2] % heads:
        raise OpError(
            _OP, name, f"a 3-D (B, T, H*D) array whose last dim divides by {heads} heads", str(x.shape)
        )
    b, t, hd = x.shape
    return x.reshape(b, t, heads, hd // heads).transpose(0, 2, 1, 3)


def _check(
    q: np.ndarray, k: np.ndarray, v: np.ndarray, decay: Any, beta: Any, rule: str, hq: int, hkv: int
) -> None:
    if rule not in LINEAR_ATTENTION_RULES:
        raise OpError(_OP, "update_rule", f"one of {LINEAR_ATTENTION_RULES}", repr(rule))
    if hq <= 0 or hkv <= 0 or hq % hkv:
        raise OpError(_OP, "q_num_heads", f"a positive multiple of kv_num_heads={hkv}", str(hq))
    for name, x in (("query", q), ("key", k), ("value", v)):
        check_dtype(_OP, name, x, _FLOATS)
    if k.shape[:2] != q.shape[:2] or v.shape[:2] != q.shape[:2]:
        raise OpError(_OP, "key", f"(B, T) = {q.shape[:2]} like query", f"key {k.shape}, value {v.shape}")
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    for name, arr, needed in (("decay", decay, gated), ("beta", beta, delta)):
        if needed and arr is None:
            raise OpError(_OP, name, f"an array (update_rule {rule!r} needs it)", "None", f"pass {name}")
        if not needed and arr is not None:
            raise OpError(
                _OP, name, f"None (update_rule {rule!r} does not use it)", "an array", f"drop {name}"
            )


def _per_head(x: np.ndarray, name: str, b: int, t: int, hkv: int, widths: tuple[int, ...]) -> np.ndarray:
    """decay/beta (B, T, W) -> (B, H_kv or 1, T, W // H_kv or 1) broadcastable over the state."""
    if x.ndim != 3 or x.shape[:2] != (b, t) or x.shape[2] not in widths:
        raise OpError(_OP, name, f"shape ({b}, {t}, one of {sorted(set(widths))})", str(x.shape))
    heads = hkv if x.shape[2] % hkv == 0 else 1
    return x.reshape(b, t, heads, x.shape[2] // heads).transpose(0, 2, 1, 3)


@register(_OP, device="ref", dtypes=_FLOATS)
@register(_OP, device="cpu", dtypes=_FLOATS)
def linear_attention_ref(
    query: Any,
    key: Any,
    value: Any,
    past_state: Any = None,
    decay: Any = None,
    beta: Any = None,
    *,
    q_num_heads: int,
    kv_num_heads: int,
    update_rule: str = "gated_delta",
    scale: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    q, k, v = np.asarray(query), np.asarray(key), np.asarray(value)
    hq, hkv = int(q_num_heads), int(kv_num_heads)
    _check(q, k, v, decay, beta, update_rule, hq, hkv)
    acc = np.float64 if q.dtype == np.float64 else np.float32
    q4, k4, v4 = (
        _heads(x, n, h).astype(acc) for x, n, h in ((q, "query", hq), (k, "key", hkv), (v, "value", hkv))
    )
    b, _, t, dk = q4.shape
    dv = v4.shape[3]
    if k4.shape[3] != dk:
        raise OpError(_OP, "key", f"head size d_k={dk} like query", f"{k4.shape[3]}")
    g = (
        None
        if decay is None
        else _per_head(np.asarray(decay), "decay", b, t, hkv, (hkv, hkv * dk)).astype(acc)
    )
    bt = None if beta is None else _per_head(np.asarray(beta), "beta", b, t, hkv, (hkv, 1)).astype(acc)
    if past_state is None:
        state, state_dtype = np.zeros((b, hkv, dk, dv), acc), q.dtype
    else:
        past = np.asarray(past_state)
        if past.shape != (b, hkv, dk, dv):
            raise OpError(_OP, "past_state", f"shape {(b, hkv, dk, dv)}", str(past.shape))
        state, state_dtype = past.astype(acc), past.dtype
    s = 1.0 / math.sqrt(dk) if not scale else float(scale)
    out = np.empty((b, hq, t, dv), acc)
    group = hq // hkv
    for i in range(t):
        if g is not None:
            state = state * np.exp(g[:, :, i, :])[..., None]
        vt = v4[:, :, i, :]
        if bt is not None:
            vt = bt[:, :, i, :] * (vt - np.einsum("bhdm,bhd->bhm", state, k4[:, :, i, :]))
        state = state + k4[:, :, i, :, None] * vt[..., None, :]
        read = state if group == 1 else np.repeat(state, group, axis=1)
        out[:, :, i, :] = s * np.einsum("bhd,bhdm->bhm", q4[:, :, i, :], read)
    y = out.transpose(0, 2, 1, 3).reshape(b, t, hq * dv).astype(q.dtype)
    return y, state.astype(state_dtype)


def linear_attention(
    query: Any,
    key: Any,
    value: Any,
    past_state: Any = None,
    decay: Any = None,
    beta: Any = None,
    *,
    q_num_heads: int,
    kv_num_heads: int,
    update_rule: str = "gated_delta",
    scale: float = 0.0,
    device: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """ONNX LinearAttention: (output (B, T, H_q*d_v), present_state (B, H_kv, d_k, d_v)); scale 0 -> 1/sqrt(d_k).

    >>> q = np.ones((1, 2, 2), np.float32)
    >>> y, s = linear_attention(q, q, q, q_num_heads=1, kv_num_heads=1, update_rule="linear", scale=1.0)
    >>> y[0, :, 0].tolist(), s.shape
    ([2.0, 4.0], (1, 1, 2, 2))
    """
    check_dtype(_OP, "query", query, _FLOATS)
    return call(
        _OP, query, key, value, past_state, decay, beta, q_num_heads=q_num_heads, kv_num_heads=kv_num_heads,
        update_rule=update_rule, scale=scale, device=device,
    )  # fmt: skip
