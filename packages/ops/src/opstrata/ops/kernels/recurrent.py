"""Recurrent layers — RNN, GRU, LSTM — on ``ref`` and ``cpu`` (one implementation, step by step).

Semantics follow the ONNX operator specification (RNN-22, GRU-22, LSTM-22): ``x`` is ``(S, B, I)``
(``layout=1``: ``(B, S, I)``); weights ``w`` ``(D, G*H, I)``, ``r`` ``(D, G*H, H)``, biases ``b``
``(D, 2*G*H)`` (input then recurrence), gate orders ``zrh`` (GRU) and ``iofc`` (LSTM), LSTM peepholes
``p`` ``(D, 3H)`` in ``iof`` order. ``direction`` is forward, reverse or bidirectional (D = 2);
``sequence_lens`` ``(B,)`` stops each batch row early: its later outputs are zero and its final state
is the one after its last valid step (reverse runs start at that row's last valid step). ``clip``
bounds every gate's pre-activation. Activations take their alpha/beta from ``activation_alpha`` /
``activation_beta`` in order, one per activation that uses one (onnxruntime's rule). Results are
``(Y, Y_h, Y_c)`` with ``Y`` ``(S, D, B, H)`` (``layout=1``: ``(B, S, D, H)``); low precision
computes in float32.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._dtypes import FLOAT_DTYPES, accumulation_dtype
from .._errors import OpError, check_dtype
from .._registry import call, register

__all__ = ["gru", "lstm", "rnn"]

DIRECTIONS = ("forward", "reverse", "bidirectional")
#: activation name (lower case) -> (uses alpha, uses beta, default alpha, default beta)
ACTIVATIONS: dict[str, tuple[bool, bool, float, float]] = {
    "relu": (False, False, 0.0, 0.0),
    "tanh": (False, False, 0.0, 0.0),
    "sigmoid": (False, False, 0.0, 0.0),
    "softsign": (False, False, 0.0, 0.0),
    "softplus": (False, False, 0.0, 0.0),
    "affine": (True, True, 1.0, 0.0),
    "leakyrelu": (True, False, 0.01, 0.0),
    "thresholdedrelu": (True, False, 1.0, 0.0),
    "scaledtanh": (True, True, 1.0, 1.0),
    "hardsigmoid": (True, True, 0.2, 0.5),
    "elu": (True, False, 1.0, 0.0),
}
#: per kind: number of gates, default activations (per direction)
_KINDS = {"rnn": (1, ("Tanh",)), "gru": (3, ("Sigmoid", "Tanh")), "lstm": (4, ("Sigmoid", "Tanh", "Tanh"))}

Act = Callable[[np.ndarray], np.ndarray]


def _act(name: str, a: float, b: float) -> Act:
    n = name.lower()
    table: dict[str, Act] = {
        "relu": lambda x: np.maximum(x, 0),
        "tanh": np.tanh,
        "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x)),
        "softsign": lambda x: x / (1 + np.abs(x)),
        "softplus": lambda x: np.logaddexp(0, x),
        "affine": lambda x: a * x + b,
        "leakyrelu": lambda x: np.where(x >= 0, x, a * x),
        "thresholdedrelu": lambda x: np.where(x > a, x, 0),
        "scaledtanh": lambda x: a * np.tanh(b * x),
        "hardsigmoid": lambda x: np.clip(a * x + b, 0, 1),
        "elu": lambda x: np.where(x >= 0, x, a * (np.exp(np.minimum(x, 0)) - 1)),
    }
    return table[n]


def _activations(
    op: str,
    kind: str,
    names: Sequence[str] | None,
    alphas: Sequence[float],
    betas: Sequence[float],
    dirs: int,
) -> list[list[Act]]:
    """Per direction, the activation functions of ``kind`` (alpha/beta consumed in order)."""
    per = len(_KINDS[kind][1])
    names = list(names) if names else list(_KINDS[kind][1]) * dirs
    if len(names) != per * dirs:
        raise OpError(op, "activations", f"{per * dirs} names ({per} per direction)", str(names))
    ai, bi, fns = iter(alphas), iter(betas), []
    for nm in names:
        if nm.lower() not in ACTIVATIONS:
            raise OpError(op, "activations", f"names from {sorted(ACTIVATIONS)}", repr(nm))
        ua, ub, da, db = ACTIVATIONS[nm.lower()]
        a = float(next(ai, da)) if ua else da
        b = float(next(bi, db)) if ub else db
        fns.append(_act(nm, a, b))
    return [fns[d * per : (d + 1) * per] for d in range(dirs)]


def _check(op: str, x: np.ndarray, w: np.ndarray, r: np.ndarray, gates: int, layout: int) -> tuple[int, ...]:
    check_dtype(op, "x", x, FLOAT_DTYPES)
    if x.ndim != 3 or w.ndim != 3 or r.ndim != 3:
        raise OpError(op, "x", "3-D x, w and r", f"x {x.shape}, w {w.shape}, r {r.shape}")
    h = r.shape[2]
    s, bsz = (x.shape[1], x.shape[0]) if layout else (x.shape[0], x.shape[1])
    if w.shape[1] != gates * h or r.shape[1] != gates * h or w.shape[2] != x.shape[2]:
        raise OpError(
            op, "w", f"w (D, {gates}*H, I={x.shape[2]}) and r (D, {gates}*H, H) with H={h}",
            f"w {w.shape}, r {r.shape}",
        )  # fmt: skip
    return s, bsz, h


def _cell(
    kind: str, fns: list[Act], xw: np.ndarray, hp: np.ndarray, cp: np.ndarray, r: np.ndarray, rb: np.ndarray,
    p: np.ndarray, clip: float | None, lbr: bool, input_forget: bool,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """One time step: ``xw`` = x W^T + Wb (B, G*H); returns the new (h, c)."""
    h = hp.shape[1]

    def cl(v: np.ndarray) -> np.ndarray:
        return np.clip(v, -clip, clip) if clip is not None else v

    if kind == "rnn":
        return fns[0](cl(xw + hp @ r.T + rb)), cp
    if kind == "gru":
        f, g = fns
        hr = hp @ r.T  # (B, 3H)
        z = f(cl(xw[:, :h] + hr[:, :h] + rb[:h]))
        rr = f(cl(xw[:, h : 2 * h] + hr[:, h : 2 * h] + rb[h : 2 * h]))
        if lbr:
            hh = g(cl(xw[:, 2 * h :] + rr * (hr[:, 2 * h :] + rb[2 * h :])))
        else:
            hh = g(cl(xw[:, 2 * h :] + (rr * hp) @ r[2 * h :].T + rb[2 * h :]))
        return (1 - z) * hh + z * hp, cp
    f, g, hf = fns
    pre = xw + hp @ r.T + rb  # (B, 4H) in iofc order
    i = f(cl(pre[:, :h] + p[:h] * cp))
    fg = 1 - i if input_forget else f(cl(pre[:, 2 * h : 3 * h] + p[2 * h :] * cp))
    c = fg * cp + i * g(cl(pre[:, 3 * h :]))
    o = f(cl(pre[:, h : 2 * h] + p[h : 2 * h] * c))
    return o * hf(c), c


@register("recurrent", device="ref", dtypes=FLOAT_DTYPES)
@register("recurrent", device="cpu", dtypes=FLOAT_DTYPES)
def recurrent_ref(
    x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None, initial_h: Any = None,
    initial_c: Any = None, p: Any = None, *, kind: str = "rnn", direction: str = "forward",
    activations: Sequence[str] | None = None, alphas: Sequence[float] = (), betas: Sequence[float] = (),
    clip: float | None = None, linear_before_reset: bool = False, input_forget: bool = False, layout: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    op = kind
    x, w, r = np.asarray(x), np.asarray(w), np.asarray(r)
    gates = _KINDS[kind][0]
    s, bsz, h = _check(op, x, w, r, gates, layout)
    if direction not in DIRECTIONS:
        raise OpError(op, "direction", f"one of {DIRECTIONS}", repr(direction))
    dirs = 2 if direction == "bidirectional" else 1
    if w.shape[0] != dirs or r.shape[0] != dirs:
        raise OpError(op, "w", f"{dirs} direction(s) on axis 0 for direction={direction!r}", str(w.shape))
    fns = _activations(op, kind, activations, alphas, betas, dirs)
    adt = accumulation_dtype(x.dtype)
    xs = (x.transpose(1, 0, 2) if layout else x).astype(adt)  # (S, B, I)
    bias = np.zeros((dirs, 2 * gates * h), adt) if b is None else np.asarray(b).astype(adt)
    lens = np.full(bsz, s, np.int64) if sequence_lens is None else np.asarray(sequence_lens).astype(np.int64)

    def state(v: Any) -> np.ndarray:
        if v is None:
            return np.zeros((dirs, bsz, h), adt)
        v = np.asarray(v).astype(adt)
        return v.transpose(1, 0, 2) if layout else v

    h0, c0 = state(initial_h), state(initial_c)
    peep = np.zeros((dirs, 3 * h), adt) if p is None else np.asarray(p).astype(adt)
    y = np.zeros((s, dirs, bsz, h), adt)
    yh, yc = np.zeros((dirs, bsz, h), adt), np.zeros((dirs, bsz, h), adt)
    for d in range(dirs):
        rev = direction == "reverse" or d == 1
        wd, rd = w[d].astype(adt), r[d].astype(adt)
        wb, rb = bias[d, : gates * h], bias[d, gates * h :]
        hp, cp = h0[d].copy(), c0[d].copy()
        for step in range(s):
            t = np.where(lens - 1 - step >= 0, lens - 1 - step, 0) if rev else np.full(bsz, step)
            live = (step < lens)[:, None]
            xt = xs[t, np.arange(bsz)]  # (B, I): each row's own time index
            hn, cn = _cell(
                kind, fns[d], xt @ wd.T + wb, hp, cp, rd, rb, peep[d], clip, linear_before_reset, input_forget
            )
            hp, cp = np.where(live, hn, hp), np.where(live, cn, cp)
            rows = np.nonzero(live[:, 0])[0]
            y[t[rows], d, rows] = hp[rows]
        yh[d], yc[d] = hp, cp
    dt = x.dtype
    if layout:
        return (
            y.transpose(2, 0, 1, 3).astype(dt),
            yh.transpose(1, 0, 2).astype(dt),
            yc.transpose(1, 0, 2).astype(dt),
        )
    return y.astype(dt), yh.astype(dt), yc.astype(dt)


def _run(kind: str, args: tuple[Any, ...], device: str | None, **kw: Any) -> tuple[np.ndarray, ...]:
    check_dtype(kind, "x", np.asarray(args[0]), FLOAT_DTYPES)
    clip = kw.get("clip")
    if clip is not None and not clip > 0:
        raise OpError(kind, "clip", "a positive bound (or None for no clipping)", str(clip))
    return call("recurrent", *args, kind=kind, device=device, **kw)


def rnn(
    x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None, initial_h: Any = None, *,
    direction: str = "forward", activations: Sequence[str] | None = None, alphas: Sequence[float] = (),
    betas: Sequence[float] = (), clip: float | None = None, layout: int = 0, device: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """ONNX RNN: ``H_t = f(X_t W^T + H_{t-1} R^T + Wb + Rb)``; returns ``(Y, Y_h)``.

    >>> y, yh = rnn(np.ones((2, 1, 1), np.float32), np.ones((1, 1, 1)), np.zeros((1, 1, 1)))
    >>> y.shape, round(float(yh[0, 0, 0]), 4)
    ((2, 1, 1, 1), 0.7616)
    """
    y, yh, _ = _run(
        "rnn", (x, w, r, b, sequence_lens, initial_h), device, direction=direction, activations=activations,
        alphas=alphas, betas=betas, clip=clip, layout=layout,
    )  # fmt: skip
    return y, yh


def gru(
    x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None, initial_h: Any = None, *,
    direction: str = "forward", activations: Sequence[str] | None = None, alphas: Sequence[float] = (),
    betas: Sequence[float] = (), clip: float | None = None, linear_before_reset: bool = False,
    layout: int = 0, device: str | None = None,
) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """ONNX GRU (gates z, r, h); ``linear_before_reset`` applies r after the recurrence matmul. ``(Y, Y_h)``."""
    y, yh, _ = _run(
        "gru", (x, w, r, b, sequence_lens, initial_h), device, direction=direction, activations=activations,
        alphas=alphas, betas=betas, clip=clip, linear_before_reset=linear_before_reset, layout=layout,
    )  # fmt: skip
    return y, yh


def lstm(
    x: Any, w: Any, r: Any, b: Any = None, sequence_lens: Any = None, initial_h: Any = None,
    initial_c: Any = None, p: Any = None, *, direction: str = "forward",
    activations: Sequence[str] | None = None, alphas: Sequence[float] = (), betas: Sequence[float] = (),
    clip: float | None = None, input_forget: bool = False, layout: int = 0, device: str | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """ONNX LSTM (gates i, o, f, c; peepholes ``p``; ``input_forget`` couples f = 1 - i). ``(Y, Y_h, Y_c)``."""
    return _run(
        "lstm", (x, w, r, b, sequence_lens, initial_h, initial_c, p), device, direction=direction,
        activations=activations, alphas=alphas, betas=betas, clip=clip, input_forget=input_forget, layout=layout,
    )  # fmt: skip
