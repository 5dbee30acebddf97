"""The fused AdamW step: params and both moments updated in place, chunk by chunk, on ``ref`` and ``cpu``.

Semantics are ``torch.optim.AdamW`` (Loshchilov & Hutter 2019, decoupled weight decay; Kingma & Ba
2015 bias correction), ``amsgrad=False, maximize=False``::

    param    *= 1 - lr * weight_decay
    exp_avg   = beta1 * exp_avg + (1 - beta1) * grad
    exp_avg_sq = beta2 * exp_avg_sq + (1 - beta2) * grad^2
    param    -= lr / (1 - beta1^step) * exp_avg / (sqrt(exp_avg_sq) / sqrt(1 - beta2^step) + eps)

Dtypes: ``param``, ``exp_avg`` and ``exp_avg_sq`` are the fp32 master copies (float32, or float64),
all of one dtype and shape, C-contiguous and writeable (they are updated in place); ``grad`` has
their shape and any float dtype (bfloat16/float16 gradients are upcast per chunk, never as a whole).
The ``cpu`` kernel streams cache-sized chunks with two reused scratch buffers, the fused optimizer
update the apex/torch ``fused=True`` AdamW perform on GPU.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._dtypes import float32, float64
from .._errors import OpError
from .._registry import call, register, register_decomposition
from . import chunking as _chunking
from .elementwise import FLOATS, checked, const, ieee, nd

MASTER_DTYPES: tuple[np.dtype, ...] = (float32, float64)


def _check_state(name: str, a: Any, like: np.ndarray | None) -> np.ndarray:
    if not isinstance(a, np.ndarray):
        raise OpError("adamw_step", name, "a writeable numpy array (updated in place)", type(a).__name__)
    if a.dtype not in MASTER_DTYPES:
        raise OpError("adamw_step", name, "float32 or float64 (fp32 master state)", str(a.dtype))
    if not a.flags.c_contiguous or not a.flags.writeable:
        raise OpError(
            "adamw_step", name, "a C-contiguous writeable array", "a non-contiguous or read-only view"
        )
    if like is not None and (a.shape != like.shape or a.dtype != like.dtype):
        got = f"shape {a.shape}, dtype {a.dtype}"
        raise OpError("adamw_step", name, f"param's shape {like.shape} and dtype {like.dtype}", got)
    return a


def _check_hparams(lr: Any, beta1: Any, beta2: Any, eps: Any, weight_decay: Any, step: Any) -> None:
    for name, v, lo, hi in (("lr", lr, 0.0, math.inf), ("eps", eps, 0.0, math.inf),
                            ("weight_decay", weight_decay, 0.0, math.inf),
                            ("beta1", beta1, 0.0, 1.0), ("beta2", beta2, 0.0, 1.0)):  # fmt: skip
        ok = not isinstance(v, bool) and isinstance(v, (int, float, np.floating)) and lo <= v and (v < hi)
        if not ok or not math.isfinite(v):
            rng = f"[{lo}, {hi})" if math.isfinite(hi) else f">= {lo}"
            raise OpError("adamw_step", name, f"a finite number in {rng}", repr(v))
    if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 1:
        raise OpError("adamw_step", "step", "an int >= 1 (the step number after this update)", repr(step))


def adamw_step(
    param: np.ndarray,
    grad: Any,
    exp_avg: np.ndarray,
    exp_avg_sq: np.ndarray,
    *,
    lr: float,
    beta1: float = 0.9,
    beta2: float = 0.999,
    eps: float = 1e-8,
    weight_decay: float = 0.01,
    step: int,
    device: str | None = None,
) -> None:
    """One AdamW update of ``param``, ``exp_avg``, ``exp_avg_sq`` in place (torch.optim.AdamW semantics).

    ``step`` counts from 1 (the value torch's state holds after incrementing). Returns None; the three
    arrays passed in are the ones updated. See the module docstring for dtypes.

    >>> p, m, v = np.ones(2, np.float32), np.zeros(2, np.float32), np.zeros(2, np.float32)
    >>> adamw_step(p, np.ones(2, np.float32), m, v, lr=0.1, weight_decay=0.0, step=1)
    >>> p.round(4)
    array([0.9, 0.9], dtype=float32)
    """
    param = _check_state("param", param, None)
    exp_avg = _check_state("exp_avg", exp_avg, param)
    exp_avg_sq = _check_state("exp_avg_sq", exp_avg_sq, param)
    grad = checked("adamw_step", "grad", grad, FLOATS)
    if grad.shape != param.shape:
        raise OpError("adamw_step", "grad", f"param's shape {param.shape}", str(grad.shape))
    _check_hparams(lr, beta1, beta2, eps, weight_decay, step)
    if len({id(param), id(exp_avg), id(exp_avg_sq)}) < 3 or np.shares_memory(exp_avg, exp_avg_sq):
        raise OpError(
            "adamw_step", "exp_avg", "three distinct arrays (param, exp_avg, exp_avg_sq)", "aliases"
        )
    hp = {"lr": float(lr), "beta1": float(beta1), "beta2": float(beta2), "eps": float(eps)}
    call("adamw_step", param, grad, exp_avg, exp_avg_sq, **hp, weight_decay=float(weight_decay),
         step=int(step), device=device)  # fmt: skip


def _corrections(lr: float, beta1: float, beta2: float, step: int) -> tuple[float, float]:
    """(step_size, 1 / sqrt(bias_correction2)) as torch computes them."""
    return lr / (1.0 - beta1**step), 1.0 / math.sqrt(1.0 - beta2**step)


@register("adamw_step", device="ref", dtypes=MASTER_DTYPES)
@ieee
def adamw_step_ref(
    param: np.ndarray, grad: Any, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
    lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
    weight_decay: float = 0.01, step: int,
) -> None:  # fmt: skip
    g = nd(grad).astype(param.dtype)
    step_size, inv_bc2 = _corrections(lr, beta1, beta2, step)
    param *= 1.0 - lr * weight_decay
    exp_avg[...] = beta1 * exp_avg + (1.0 - beta1) * g
    exp_avg_sq[...] = beta2 * exp_avg_sq + (1.0 - beta2) * g * g
    param -= step_size * exp_avg / (np.sqrt(exp_avg_sq) * inv_bc2 + eps)


@register_decomposition("adamw_step", dtypes=MASTER_DTYPES)
def adamw_step_decomposition(
    param: np.ndarray, grad: Any, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
    lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
    weight_decay: float = 0.01, step: int,
) -> None:  # fmt: skip
    """adamw_step in mul/add/sqrt/div, results copied back into the three state arrays."""
    dt = param.dtype
    c = lambda v: const(v, dt)  # noqa: E731
    g = nd(grad).astype(dt, copy=False)
    step_size, inv_bc2 = _corrections(lr, beta1, beta2, step)
    m = call("add", call("mul", exp_avg, c(beta1)), call("mul", g, c(1.0 - beta1)))
    v = call("add", call("mul", exp_avg_sq, c(beta2)), call("mul", call("mul", g, g), c(1.0 - beta2)))
    denom = call("add", call("mul", call("sqrt", v), c(inv_bc2)), c(eps))
    p = call(
        "sub",
        call("mul", param, c(1.0 - lr * weight_decay)),
        call("mul", call("div", m, denom), c(step_size)),
    )
    np.copyto(exp_avg, m)
    np.copyto(exp_avg_sq, v)
    np.copyto(param, p)


@register("adamw_step", device="cpu", dtypes=MASTER_DTYPES)
@ieee
def adamw_step_cpu(
    param: np.ndarray, grad: Any, exp_avg: np.ndarray, exp_avg_sq: np.ndarray, *,
    lr: float, beta1: float = 0.9, beta2: float = 0.999, eps: float = 1e-8,
    weight_decay: float = 0.01, step: int,
) -> None:  # fmt: skip
    step_size, inv_bc2 = _corrections(lr, beta1, beta2, step)
    decay, c1, c2 = 1.0 - lr * weight_decay, 1.0 - beta1, 1.0 - beta2
    p, m, v = param.reshape(-1), exp_avg.reshape(-1), exp_avg_sq.reshape(-1)  # views: contiguous
    g = np.reshape(nd(grad), -1)
    n, dt = p.size, p.dtype
    chunk = max(1, min(n, _chunking.BLOCK_ELEMS))
    t_buf, u_buf = np.empty(chunk, dt), np.empty(chunk, dt)
    mul, add, sqrt, div = np.multiply, np.add, np.sqrt, np.divide
    for i in range(0, n, chunk):
        j = min(i + chunk, n)
        pc, mc, vc, gc = p[i:j], m[i:j], v[i:j], g[i:j]
        t, u = (t_buf, u_buf) if j - i == chunk else (t_buf[: j - i], u_buf[: j - i])
        mul(gc, c1, t, dtype=dt)  # (1 - b1) g
        mul(mc, beta1, mc)
        add(mc, t, mc)
        mul(gc, gc, u, dtype=dt)  # g^2
        mul(u, c2, u)
        mul(vc, beta2, vc)
        add(vc, u, vc)
        sqrt(vc, u)
        mul(u, inv_bc2, u)
        add(u, eps, u)  # denom
        div(mc, u, u)
        mul(u, step_size, u)
        mul(pc, decay, pc)
        np.subtract(pc, u, pc)
