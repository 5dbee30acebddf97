"""Per-op sample builders for ``conformance_ops``: valid arguments for ops the shape search cannot feed.

``SAMPLES[op]`` builds ``(args, kwargs)`` for one call of the op from a :class:`Gen` (the cell's dtype,
a seeded numpy Generator and the variant name), and lists the variants that make sense for the op.
Shapes are small (a whole matrix runs in seconds); index tensors are valid for the data they index;
the data tensor follows the variant: ``size-1 dim`` / ``empty dim`` shrink the leading (batch) dim,
``broadcast`` gives a lower-rank operand, ``nan/inf`` and ``extreme`` (floats) and ``full-range``
(ints) change the values. Variants that do not apply to a dtype (NaN on ints) are skipped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._tolerances import dtype_class

__all__ = ["RANDOM_OPS", "SAMPLES", "Gen", "OpSamples", "Sample", "applies", "values"]

Sample = tuple[tuple[Any, ...], dict[str, Any]]

BASIC = ("normal", "size-1 dim", "empty dim")
FLOAT_VALUES = ("nan/inf", "extreme")
FULL = (*BASIC, *FLOAT_VALUES)
MOVE = (*FULL, "full-range")  # data movement: every bit pattern must survive

#: Ops whose output is random by definition: listed unjudged, never compared.
RANDOM_OPS: frozenset[str] = frozenset(
    {"dropout", "random_normal", "random_uniform", "bernoulli", "multinomial"}
)


def values(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype, variant: str = "normal"
) -> np.ndarray:
    """Seeded values of ``dtype``: small ints, normal floats; ``nan/inf``, ``extreme``, ``full-range`` per variant."""
    kind = dtype_class(dtype)
    if kind == "bool":
        return rng.random(shape) < 0.5
    if kind == "int":
        if variant == "full-range":
            info = np.iinfo(dtype)
            return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)
        lo = 0 if (dtype.kind == "u" or "uint" in dtype.name) else -10
        return rng.integers(lo, lo + 20, shape).astype(dtype)
    x = rng.standard_normal(shape)
    if variant == "extreme":
        x = x * np.where(rng.random(shape) < 0.5, 1e3, 1e-3)
    x = x.astype(dtype)
    if variant == "nan/inf":
        flat = x.reshape(-1)
        for i, v in enumerate((np.nan, np.inf, -np.inf)[: flat.size]):
            flat[i] = v
    return x


def applies(variant: str, dtype: np.dtype) -> bool:
    """Whether ``variant`` means anything for ``dtype`` (NaN/inf and extreme only for floats, full-range for ints)."""
    kind = dtype_class(dtype)
    if variant in FLOAT_VALUES:
        return kind == "float"
    if variant == "full-range":
        return kind == "int"
    return True


@dataclass
class Gen:
    """What a builder needs: the cell dtype, a seeded generator and the variant being built."""

    dt: np.dtype
    rng: np.random.Generator
    variant: str = "normal"

    def n(self, k: int = 2) -> int:
        """The leading (batch) size: ``k``, 1 for ``size-1 dim``, 0 for ``empty dim``."""
        return {"size-1 dim": 1, "empty dim": 0}.get(self.variant, k)

    def x(self, *shape: int) -> np.ndarray:
        """A data tensor of the cell dtype with the variant's values."""
        return values(self.rng, shape, self.dt, self.variant)

    def plain(self, *shape: int, dtype: Any = None) -> np.ndarray:
        """Normal values (no NaN, no extremes) of ``dtype`` (default the cell dtype): weights, scales."""
        return values(self.rng, shape, np.dtype(dtype or self.dt))

    def pos(self, *shape: int, dtype: Any = None) -> np.ndarray:
        """Positive values in [0.5, 1.5) of ``dtype`` (default the cell dtype): variances, scales."""
        return (0.5 + self.rng.random(shape)).astype(dtype or self.dt)

    def idx(self, shape: tuple[int, ...], high: int, *, negative: bool = False) -> np.ndarray:
        """int64 indices valid for an axis of length ``high`` (also negative ones when allowed)."""
        lo = -high if negative and high else 0
        return self.rng.integers(lo, max(high, 1), shape).astype(np.int64)

    def scalar(self, v: float) -> np.ndarray:
        """A 0-d array of the cell dtype."""
        return np.asarray(v).astype(self.dt)


Builder = Callable[[Gen], Sample]


@dataclass(frozen=True)
class OpSamples:
    """How to call one op: its builder, the variants it makes sense for, which args it updates in place."""

    build: Builder
    variants: tuple[str, ...] = FULL
    inplace: tuple[int, ...] = ()  # positional args the op writes; compared as extra outputs
    call_op: bool = False  # call through ops.call (the op has no public function of its name)


SAMPLES: dict[str, OpSamples] = {}


def sample(name: str, variants: tuple[str, ...] = FULL, **kw: Any) -> Callable[[Builder], Builder]:
    """Register the decorated builder as the sample of op ``name``."""

    def deco(fn: Builder) -> Builder:
        SAMPLES[name] = OpSamples(fn, variants, **kw)
        return fn

    return deco


# ---- data movement and indexing -------------------------------------------------------------------


@sample("concat", MOVE)
def _concat(g: Gen) -> Sample:
    return ([g.x(g.n(), 3), g.x(g.n(), 2), g.x(g.n(), 1)],), {"axis": 1}


@sample("split", MOVE)
def _split(g: Gen) -> Sample:
    return (g.x(g.n(), 6), [2, 4]), {"axis": 1}


@sample("slice", (*MOVE, "negative step"))
def _slice(g: Gen) -> Sample:
    if g.variant == "negative step":
        return (g.x(3, 7),), {"starts": [-1, 5], "ends": [-10, 0], "axes": [0, 1], "steps": [-1, -2]}
    return (g.x(g.n(), 7),), {"starts": [1], "ends": [6], "axes": [1], "steps": [2]}


@sample("reshape", MOVE)
def _reshape(g: Gen) -> Sample:
    n = g.n()
    return (g.x(n, 6),), {"shape": [n, 3, 2]}


@sample("expand", (*MOVE, "broadcast"))
def _expand(g: Gen) -> Sample:
    n = g.n()
    shape = [2, n, 4, 3] if g.variant == "broadcast" else [n, 4, 3]
    return (g.x(n, 1, 3),), {"shape": shape}


@sample("tile", MOVE)
def _tile(g: Gen) -> Sample:
    return (g.x(g.n(), 3), [2, 3]), {}


@sample("pad", (*MOVE, "reflect", "edge", "negative pads"))
def _pad(g: Gen) -> Sample:
    if g.variant in ("reflect", "edge"):
        return (g.x(2, 4, 5), [0, 1, 2, 0, 2, 1]), {"mode": g.variant}
    if g.variant == "negative pads":
        return (g.x(2, 4, 5), [0, -1, 2, 0, 1, -2]), {}
    return (g.x(g.n(), 3, 4), [0, 1, 0, 0, 2, 3]), {"value": g.scalar(1)}


@sample("depth_to_space", (*MOVE, "CRD"))
def _depth_to_space(g: Gen) -> Sample:
    mode = "CRD" if g.variant == "CRD" else "DCR"
    return (g.x(g.n(), 8, 2, 3),), {"blocksize": 2, "mode": mode}


@sample("space_to_depth", MOVE)
def _space_to_depth(g: Gen) -> Sample:
    return (g.x(g.n(), 2, 4, 6),), {"blocksize": 2}


@sample("center_crop_pad", MOVE)
def _center_crop_pad(g: Gen) -> Sample:
    return (g.x(g.n(), 5, 4), [3, 7]), {"axes": [1, 2]}


@sample("where", (*MOVE, "broadcast"))
def _where(g: Gen) -> Sample:
    n = g.n()
    if g.variant == "broadcast":
        return (g.rng.random(4) < 0.5, g.x(n, 4), g.x(1)), {}
    return (g.rng.random((n, 4)) < 0.5, g.x(n, 4), g.x(n, 4)), {}


@sample("gather", (*MOVE, "negative indices", "axis 0"))
def _gather(g: Gen) -> Sample:
    if g.variant == "axis 0":
        return (g.x(5, 3), g.idx((2, 2), 5)), {"axis": 0}
    return (g.x(g.n(), 5), g.idx((2, 3), 5, negative=g.variant == "negative indices")), {"axis": 1}


@sample("gather_elements", (*MOVE, "negative indices"))
def _gather_elements(g: Gen) -> Sample:
    n = g.n()
    return (g.x(n, 5), g.idx((n, 3), 5, negative=g.variant == "negative indices")), {"axis": 1}


@sample("gather_nd", (*MOVE, "batch_dims 0"))
def _gather_nd(g: Gen) -> Sample:
    if g.variant == "batch_dims 0":
        return (g.x(3, 4, 2), np.stack([g.idx((5,), 3), g.idx((5,), 4)], axis=-1)), {}
    n = g.n()
    return (g.x(n, 4, 3), g.idx((n, 2, 1), 4)), {"batch_dims": 1}


def _unique_cols(g: Gen, rows: int, k: int, high: int) -> np.ndarray:
    """(rows, k) int64 indices, distinct within each row (so scatter order cannot matter)."""
    out = [g.rng.permutation(high)[:k] for _ in range(rows)]
    return np.array(out, np.int64).reshape(rows, k)


@sample("scatter_elements", (*MOVE, "add"))
def _scatter_elements(g: Gen) -> Sample:
    n = g.n()
    if g.variant == "add":  # duplicates allowed: the reduction makes the order irrelevant for ints
        return (g.x(n, 5), g.idx((n, 4), 5), g.x(n, 4)), {"axis": 1, "reduction": "add"}
    return (g.x(n, 5), _unique_cols(g, n, 3, 5), g.x(n, 3)), {"axis": 1}


@sample("scatter_nd", (*MOVE, "max"))
def _scatter_nd(g: Gen) -> Sample:
    k = g.n(3)
    idx = g.rng.permutation(6)[:k].astype(np.int64).reshape(k, 1)
    kw = {"reduction": "max"} if g.variant == "max" else {}
    return (g.x(6, 3), idx, g.x(k, 3)), kw


@sample("compress", MOVE)
def _compress(g: Gen) -> Sample:
    return (g.x(g.n(), 5), np.array([True, False, True, True, False])), {"axis": 1}


@sample("reverse_sequence", MOVE)
def _reverse_sequence(g: Gen) -> Sample:
    n = g.n()
    return (g.x(4, n, 3), g.rng.integers(1, 5, n).astype(np.int64)), {"time_axis": 0, "batch_axis": 1}


@sample("one_hot", BASIC)
def _one_hot(g: Gen) -> Sample:
    return (g.idx((g.n(), 3), 4), 4, np.array([0, 1]).astype(g.dt)), {}


@sample("embedding", MOVE)
def _embedding(g: Gen) -> Sample:
    return (g.idx((g.n(), 3), 6), g.x(6, 4)), {}


@sample("clip", (*FULL, "full-range", "broadcast", "min only"))
def _clip(g: Gen) -> Sample:
    lo, hi = (-0.5, 0.5) if dtype_class(g.dt) == "float" else (2, 7)
    if g.variant == "min only":
        return (g.x(g.n(), 5),), {"min": g.scalar(lo)}
    return (g.x(g.n(), 5),), {"min": g.scalar(lo), "max": g.scalar(hi)}


_CAST_TO = {"normal": "float32", "to float16": "float16", "to int32": "int32", "to bool": "bool",
            "to bfloat16": "bfloat16", "nan/inf": "float64", "extreme": "float16", "full-range": "int64"}  # fmt: skip


@sample("cast", (*FULL, "full-range", "to float16", "to int32", "to bool", "to bfloat16"))
def _cast(g: Gen) -> Sample:
    return (g.x(g.n(), 4),), {"dtype": ops.as_dtype(_CAST_TO.get(g.variant, "float32"))}


# ---- scans, sorting, bit ops ----------------------------------------------------------------------


@sample("cumsum", (*FULL, "exclusive reverse"))
def _cumsum(g: Gen) -> Sample:
    both = g.variant == "exclusive reverse"
    return (g.x(g.n(), 5),), {"axis": 1, "exclusive": both, "reverse": both}


@sample("cumprod", (*FULL, "exclusive reverse"))
def _cumprod(g: Gen) -> Sample:
    both = g.variant == "exclusive reverse"
    x = g.x(g.n(), 5)
    if dtype_class(g.dt) == "int":
        x = (np.abs(x.astype(np.int64)) % 3).astype(g.dt)  # small, so products stay in range
    return (x,), {"axis": 1, "exclusive": both, "reverse": both}


@sample("top_k", (*FULL, "smallest"))
def _top_k(g: Gen) -> Sample:
    n = g.n()
    # distinct values, exactly representable in every dtype: no ties, so the indices are unambiguous
    x = np.array([g.rng.permutation(8) for _ in range(n)], np.int64).reshape(n, 8).astype(g.dt)
    if g.variant in FLOAT_VALUES:
        x = g.x(n, 8)
    return (x,), {"k": 3, "largest": g.variant != "smallest"}


def _bits(g: Gen, *shape: int) -> np.ndarray:
    return values(g.rng, shape, g.dt, "full-range" if g.variant == "full-range" else "normal")


for _name in ("bitwise_and", "bitwise_or", "bitwise_xor"):

    @sample(_name, (*BASIC, "broadcast", "full-range"))
    def _bitwise(g: Gen) -> Sample:
        n = g.n()
        return (_bits(g, n, 4), _bits(g, 4) if g.variant == "broadcast" else _bits(g, n, 4)), {}


@sample("bitwise_not", (*BASIC, "full-range"))
def _bitwise_not(g: Gen) -> Sample:
    return (_bits(g, g.n(), 4),), {}


@sample("bit_shift", (*BASIC, "full-range", "right", "broadcast"))
def _bit_shift(g: Gen) -> Sample:
    n, width = g.n(), g.dt.itemsize * 8
    shift = g.rng.integers(0, width - (1 if g.dt.kind == "i" else 0), (n, 4)).astype(g.dt)
    if g.variant == "broadcast":
        shift = shift[:1] if n else np.ones((1, 4), g.dt)
    return (_bits(g, n, 4), shift), {"direction": "RIGHT" if g.variant == "right" else "LEFT"}


# ---- normalization, losses, backward --------------------------------------------------------------


@sample("batch_norm")
def _batch_norm(g: Gen) -> Sample:
    return (g.x(g.n(), 3, 4, 4), g.plain(3), g.pos(3), g.plain(3), g.plain(3)), {"eps": 1e-5}


@sample("group_norm")
def _group_norm(g: Gen) -> Sample:
    return (g.x(g.n(), 4, 3, 3), g.plain(4), g.plain(4)), {"num_groups": 2}


@sample("lrn")
def _lrn(g: Gen) -> Sample:
    return (g.x(g.n(), 4, 3, 3),), {"size": 3, "alpha": 0.1, "bias": 2.0}


@sample("layer_norm_backward")
def _layer_norm_backward(g: Gen) -> Sample:
    n = g.n()
    return (g.x(n, 6), g.plain(6), g.plain(n, 6)), {}


@sample("rms_norm_backward")
def _rms_norm_backward(g: Gen) -> Sample:
    n = g.n()
    return (g.x(n, 6), g.plain(6), g.plain(n, 6)), {}


@sample("matmul_backward")
def _matmul_backward(g: Gen) -> Sample:
    n = g.n()
    return (g.x(n, 4), g.plain(4, 3), g.plain(n, 3)), {}


@sample("linear_backward")
def _linear_backward(g: Gen) -> Sample:
    n = g.n()
    return (g.x(n, 4), g.plain(3, 4), g.plain(n, 3)), {}


@sample("cross_entropy", (*FULL, "label smoothing"))
def _cross_entropy(g: Gen) -> Sample:
    n = g.n(3)
    kw = {"label_smoothing": 0.1} if g.variant == "label smoothing" else {}
    return (g.x(n, 5), g.idx((n,), 5)), kw


@sample("cross_entropy_backward")
def _cross_entropy_backward(g: Gen) -> Sample:
    n = g.n(3)
    return (g.x(n, 5), g.idx((n,), 5)), {}


@sample("nll_loss", (*FULL, "weighted sum"))
def _nll_loss(g: Gen) -> Sample:
    n = g.n(3)
    if g.variant == "weighted sum":
        return (g.x(n, 5), g.idx((n,), 5), g.pos(5)), {"reduction": "sum"}
    return (g.x(n, 5), g.idx((n,), 5)), {}


@sample("embedding_backward", BASIC)
def _embedding_backward(g: Gen) -> Sample:
    n = g.n()
    return (g.idx((n, 3), 6), g.x(n, 3, 4), 6), {}


@sample("adamw_step", BASIC, inplace=(0, 2, 3))
def _adamw_step(g: Gen) -> Sample:
    n = g.n(5)
    args = (g.x(n), g.plain(n), g.plain(n), g.pos(n))
    return args, {"lr": 1e-2, "weight_decay": 0.1, "step": 3}


# ---- pooling and convolution ----------------------------------------------------------------------


@sample("avg_pool2d", (*FULL, "ceil, no pad count"))
def _avg_pool2d(g: Gen) -> Sample:
    kw: dict[str, Any] = {"kernel_size": 3, "stride": 2, "padding": 1}
    if g.variant == "ceil, no pad count":
        kw |= {"ceil_mode": True, "count_include_pad": False}
    return (g.x(g.n(), 2, 6, 6),), kw


@sample("max_pool2d", (*FULL, "dilated ceil"))
def _max_pool2d(g: Gen) -> Sample:
    kw: dict[str, Any] = {"kernel_size": 3, "stride": 2, "padding": 1}
    if g.variant == "dilated ceil":
        kw |= {"dilation": 2, "ceil_mode": True}
    return (g.x(g.n(), 2, 7, 7),), kw


_POOL_ND = {"kernel_size": (3, 3), "stride": (2, 2), "pads": (1, 1, 1, 1)}


@sample("avg_pool_nd", (*FULL, "1-d count pad"))
def _avg_pool_nd(g: Gen) -> Sample:
    if g.variant == "1-d count pad":
        return (g.x(2, 2, 9),), {
            "kernel_size": (3,),
            "stride": (2,),
            "pads": (1, 1),
            "count_include_pad": True,
        }
    return (g.x(g.n(), 2, 6, 6),), dict(_POOL_ND)


@sample("max_pool_nd", (*FULL, "indices", "dilated"))
def _max_pool_nd(g: Gen) -> Sample:
    kw: dict[str, Any] = dict(_POOL_ND)
    if g.variant == "indices":
        kw["return_indices"] = True
    if g.variant == "dilated":
        kw["dilation"] = (2, 2)
    x = g.x(g.n(), 2, 6, 6)
    if g.variant == "indices" and dtype_class(g.dt) != "bool":  # distinct values: argmax is unambiguous
        x = g.rng.permutation(x.size).reshape(x.shape).astype(g.dt) if g.dt.itemsize > 1 else x
    return (x,), kw


@sample("lp_pool_nd", (*FULL, "p=1"))
def _lp_pool_nd(g: Gen) -> Sample:
    return (g.x(g.n(), 2, 6, 6),), {**_POOL_ND, "p": 1 if g.variant == "p=1" else 2}


@sample("max_unpool_nd", ("normal", "size-1 dim"))
def _max_unpool_nd(g: Gen) -> Sample:
    n = g.n()
    src = g.rng.permutation(n * 2 * 16).reshape(n, 2, 4, 4).astype(np.float64)
    _, idx = ops.max_pool_nd(src, kernel_size=(2, 2), stride=(2, 2), return_indices=True, device="ref")
    return (g.x(n, 2, 2, 2), idx), {"output_size": (4, 4)}


@sample("conv_transpose_nd", (*FULL, "groups"))
def _conv_transpose_nd(g: Gen) -> Sample:
    if g.variant == "groups":
        return (g.x(2, 4, 3, 3), g.plain(4, 1, 2, 2), g.plain(2)), {"stride": 2, "groups": 2}
    kw = {"stride": 2, "pads": 1, "output_padding": 1}
    return (g.x(g.n(), 2, 4, 4), g.plain(2, 3, 3, 3), g.plain(3)), kw


@sample("deform_conv")
def _deform_conv(g: Gen) -> Sample:
    n = g.n()
    offset = (0.5 * g.plain(n, 8, 3, 3)).astype(g.dt)
    return (g.x(n, 2, 4, 4), g.plain(3, 2, 2, 2), offset, g.plain(3), g.pos(n, 4, 3, 3)), {}


@sample("col2im")
def _col2im(g: Gen) -> Sample:
    return (g.x(g.n(), 8, 9), [4, 4], [2, 2]), {}


@sample("causal_conv_with_state", (*FULL, "silu with state"))
def _causal_conv(g: Gen) -> Sample:
    n = g.n()
    if g.variant == "silu with state":
        return (g.x(n, 3, 5), g.plain(3, 1, 3), g.plain(3), g.plain(n, 3, 2)), {"activation": "silu"}
    return (g.x(n, 3, 5), g.plain(3, 1, 3)), {}


# ---- attention and position encodings -------------------------------------------------------------


@sample("attention", (*FULL, "causal", "mask", "lse"))
def _attention(g: Gen) -> Sample:
    n = g.n()
    q, k, v = g.x(n, 2, 4, 8), g.plain(n, 2, 5, 8), g.plain(n, 2, 5, 8)
    if g.variant == "mask":
        return (q, k, v), {"mask": g.rng.random((4, 5)) < 0.8}
    return (q, k, v), {"causal": g.variant == "causal", "return_lse": g.variant == "lse"}


@sample("attention_backward", (*FULL, "causal"))
def _attention_backward(g: Gen) -> Sample:
    n, causal = g.n(), g.variant == "causal"
    q, k, v = g.x(n, 2, 4, 8), g.plain(n, 2, 4, 8), g.plain(n, 2, 4, 8)
    out, lse = ops.attention(q, k, v, causal=causal, return_lse=True, device="ref")  # the forward it follows
    return (q, k, v, out, g.plain(n, 2, 4, 8), lse), {"causal": causal}


@sample("attention_onnx", (*FULL, "causal gqa", "past kv"))
def _attention_onnx(g: Gen) -> Sample:
    n = g.n()
    if g.variant == "causal gqa":
        return (g.x(n, 4, 3, 8), g.plain(n, 2, 3, 8), g.plain(n, 2, 3, 8)), {"causal": True}
    if g.variant == "past kv":
        q, k, v = g.x(n, 2, 1, 8), g.plain(n, 2, 1, 8), g.plain(n, 2, 1, 8)
        return (q, k, v, None, g.plain(n, 2, 3, 8), g.plain(n, 2, 3, 8)), {}
    return (g.x(n, 2, 4, 8), g.plain(n, 2, 5, 8), g.plain(n, 2, 5, 8)), {}


@sample("linear_attention", (*FULL, "linear", "gqa state"))
def _linear_attention(g: Gen) -> Sample:
    n = g.n()
    if g.variant == "linear":
        q, k, v = g.x(n, 3, 8), g.plain(n, 3, 8), g.plain(n, 3, 8)
        return (q, k, v), {"q_num_heads": 2, "kv_num_heads": 2, "update_rule": "linear", "scale": 0.5}
    hq = 4 if g.variant == "gqa state" else 2
    q, k, v = g.x(n, 3, 4 * hq), (0.5 * g.plain(n, 3, 8)).astype(g.dt), g.plain(n, 3, 8)
    decay, beta = (-g.pos(n, 3, 2)).astype(g.dt), (0.5 * g.pos(n, 3, 2)).astype(g.dt)
    state = g.plain(n, 2, 4, 4) if g.variant == "gqa state" else None
    return (q, k, v, state, decay, beta), {"q_num_heads": hq, "kv_num_heads": 2}


def _cos_sin(g: Gen, *shape: int) -> tuple[np.ndarray, np.ndarray]:
    theta = g.rng.uniform(-3, 3, shape)
    return np.cos(theta).astype(g.dt), np.sin(theta).astype(g.dt)


@sample("rotary_embedding", (*FULL, "interleaved"))
def _rotary_embedding(g: Gen) -> Sample:
    return (g.x(g.n(), 2, 4, 8), *_cos_sin(g, 4, 4)), {"interleaved": g.variant == "interleaved"}


@sample("rope_rotate_half", (*FULL, "per batch"))
def _rope_rotate_half(g: Gen) -> Sample:
    n = g.n()
    cos, sin = _cos_sin(g, n if g.variant == "per batch" else 1, 1, 4, 8)
    return (g.x(n, 2, 4, 8), cos, sin), {}


@sample("rotary_embedding_onnx", (*FULL, "interleaved", "position ids"))
def _rotary_embedding_onnx(g: Gen) -> Sample:
    n = g.n()
    if g.variant == "position ids":
        cos, sin = _cos_sin(g, 6, 4)
        return (g.x(n, 2, 4, 8), cos, sin, g.idx((n, 4), 6)), {}
    cos, sin = _cos_sin(g, n, 4, 4)
    return (g.x(n, 2, 4, 8), cos, sin), {"interleaved": g.variant == "interleaved"}


# ---- sampling, resizing ---------------------------------------------------------------------------


@sample("resize", (*FULL, "linear", "cubic", "sizes"))
def _resize(g: Gen) -> Sample:
    x = g.x(g.n(), 2, 3, 4)
    if g.variant == "sizes":
        return (x,), {"sizes": [5, 3], "axes": [2, 3], "mode": "linear"}
    mode = g.variant if g.variant in ("linear", "cubic") else "nearest"
    return (x,), {"scales": [1.0, 1.0, 2.0, 1.5], "mode": mode}


@sample("grid_sample", (*FULL, "nearest border", "align corners"))
def _grid_sample(g: Gen) -> Sample:
    n = g.n()
    grid = g.rng.uniform(-1.1, 1.1, (n, 3, 3, 2)).astype(g.dt)
    kw: dict[str, Any] = {}
    if g.variant == "nearest border":
        kw = {"mode": "nearest", "padding_mode": "border"}
    if g.variant == "align corners":
        kw = {"align_corners": True}
    return (g.x(n, 2, 4, 4), grid), kw


@sample("affine_grid", (*FULL, "align corners"))
def _affine_grid(g: Gen) -> Sample:
    n = g.n()
    return (g.x(n, 2, 3), [n, 1, 3, 4]), {"align_corners": g.variant == "align corners"}


@sample("roi_align", (*FULL, "max"))
def _roi_align(g: Gen) -> Sample:
    n = g.n(3)
    lo = g.rng.uniform(0, 3, (n, 2))
    rois = np.concatenate([lo, lo + g.rng.uniform(1, 3, (n, 2))], axis=1).astype(g.dt)
    kw = {
        "output_height": 2,
        "output_width": 2,
        "sampling_ratio": 2,
        "mode": "max" if g.variant == "max" else "avg",
    }
    return (g.x(2, 2, 6, 6), rois, g.idx((n,), 2)), kw


# ---- quantization and integer GEMMs ---------------------------------------------------------------


def _float(dt: np.dtype) -> bool:
    return dtype_class(dt) == "float"


@sample("quantize_linear", (*FULL, "per-axis", "blocked", "int8 zero point"))
def _quantize_linear(g: Gen) -> Sample:
    sdt = g.dt if _float(g.dt) else np.float32
    x = g.x(g.n(), 4, 3)
    if g.variant == "per-axis":
        return (x, g.pos(4, dtype=sdt) / 20, g.rng.integers(0, 255, 4).astype(np.uint8)), {"axis": 1}
    if g.variant == "blocked":
        return (x, g.pos(x.shape[0], 2, 3, dtype=sdt) / 20, np.zeros((x.shape[0], 2, 3), np.int8)), {
            "axis": 1,
            "block_size": 2,
        }
    zp = np.int8(-3) if g.variant == "int8 zero point" else np.uint8(128)
    return (x, np.asarray(0.05, sdt), np.asarray(zp)), {}


@sample("dequantize_linear", (*BASIC, "full-range", "per-axis"))
def _dequantize_linear(g: Gen) -> Sample:
    x = values(g.rng, (g.n(), 4, 3), g.dt, "full-range" if g.variant == "full-range" else "normal")
    zp = lambda *s: g.plain(*s) if dtype_class(g.dt) == "int" else None  # noqa: E731
    if g.variant == "per-axis":
        return (x, g.pos(4, dtype=np.float32) / 20, zp(4)), {"axis": 1}
    return (x, np.asarray(0.05, np.float32), zp()), {}


@sample("matmul_integer", (*BASIC, "full-range", "zero points"))
def _matmul_integer(g: Gen) -> Sample:
    n = g.n()
    a, b = _bits(g, n, 4), _bits(g, 4, 3)
    if g.variant == "zero points":
        return (a, b, g.plain(), g.plain(3)), {}
    return (a, b), {}


@sample("conv_integer", (*BASIC, "full-range", "zero points"))
def _conv_integer(g: Gen) -> Sample:
    x, w = _bits(g, g.n(), 2, 5, 5), _bits(g, 3, 2, 3, 3)
    if g.variant == "zero points":
        return (x, w, g.plain(), g.plain()), {"pads": 1}
    return (x, w), {}


def _qparams(g: Gen) -> tuple[np.ndarray, np.ndarray]:
    return np.asarray(g.rng.uniform(0.01, 0.05), np.float32), np.asarray(g.plain())


@sample("qlinear_matmul", (*BASIC, "full-range"))
def _qlinear_matmul(g: Gen) -> Sample:
    a, b = _bits(g, g.n(), 4), _bits(g, 4, 3)
    (sa, za), (sb, zb), (sy, zy) = _qparams(g), _qparams(g), _qparams(g)
    return (a, sa, za, b, sb, zb, sy, zy), {}


@sample("qlinear_conv", (*BASIC, "full-range"))
def _qlinear_conv(g: Gen) -> Sample:
    x, w = _bits(g, g.n(), 2, 5, 5), _bits(g, 3, 2, 3, 3)
    (sx, zx), (sw, zw), (sy, zy) = _qparams(g), _qparams(g), _qparams(g)
    return (x, sx, zx, w, sw, zw, sy, zy), {"pads": 1}


@sample("qconv", (*BASIC, "full-range", "depthwise", "per-channel"))
def _qconv(g: Gen) -> Sample:
    x = _bits(g, g.n(), 4, 6, 6)
    f32 = np.float32
    if g.variant == "depthwise":
        w = _bits(g, 4, 1, 3, 3)
        return (x, g.plain(), w, g.plain(), g.pos(4, dtype=f32) / 50, g.plain(4, dtype=f32)), {
            "pads": 1,
            "groups": 4,
        }
    w = _bits(g, 3, 4, 3, 3)
    if g.variant == "per-channel":
        return (x, g.plain(), w, g.plain(3), g.pos(3, dtype=f32) / 50), {"pads": [1, 0, 1, 1], "stride": 2}
    return (x, g.plain(), w, g.plain(), np.asarray(0.02, f32)), {"pads": 1}


@sample("dequant_matmul", (*FULL, "int4 blocks", "per column"))
def _dequant_matmul(g: Gen) -> Sample:
    x = g.x(g.n(), 8)
    if g.variant == "int4 blocks":
        w4 = g.rng.integers(-8, 8, (8, 3)).astype("int4")  # ml_dtypes' int4, registered by opstrata.ops
        return (x, w4, g.pos(2, 3, dtype=np.float32) / 20), {"axis": 0, "block_size": 4}
    w = g.rng.integers(-128, 128, (8, 3)).astype(np.int8)
    if g.variant == "per column":
        return (x, w, g.pos(3, dtype=np.float32) / 20, g.rng.integers(-3, 3, 3).astype(np.int8)), {"axis": 1}
    return (x, w, np.asarray(0.02, np.float32)), {}


@sample("dynamic_qmatmul", (*FULL, "per token", "zero points"))
def _dynamic_qmatmul(g: Gen) -> Sample:
    x, w = g.x(g.n(), 3, 8), g.rng.integers(-128, 128, (8, 5)).astype(np.int8)
    scale, bias = g.pos(5, dtype=np.float32) / 50, g.plain(5, dtype=np.float32)
    if g.variant == "per token":
        return (x, w, scale, None, bias), {"per_token": True}
    zp = g.rng.integers(-3, 3, 5).astype(np.int8) if g.variant == "zero points" else None
    return (x, w, scale, zp, bias), {}


# ---- signal ---------------------------------------------------------------------------------------


@sample("dft", (*FULL, "inverse", "onesided"))
def _dft(g: Gen) -> Sample:
    x = g.x(g.n(), 8, 1)
    if g.variant == "inverse":
        return (g.x(2, 8, 2),), {"axis": 1, "inverse": True}
    return (x,), {"axis": 1, "onesided": g.variant == "onesided"}


@sample("stft", (*FULL, "no window"))
def _stft(g: Gen) -> Sample:
    x = g.x(g.n(), 16, 1)
    if g.variant == "no window":
        return (x, np.int64(4), None, np.int64(8)), {"onesided": False}
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(8) / 8)).astype(g.dt)
    return (x, np.int64(4), window), {}


for _name in ("hann_window", "hamming_window", "blackman_window"):

    @sample(_name, ("normal", "symmetric", "size 1"))
    def _window(g: Gen) -> Sample:
        size = 1 if g.variant == "size 1" else 10
        return (np.asarray(size).astype(g.dt),), {"periodic": g.variant != "symmetric"}


@sample("mel_weight_matrix", ("normal",))
def _mel_weight_matrix(g: Gen) -> Sample:
    return (np.asarray(8).astype(g.dt), np.int64(32), np.int64(8000), 0.0, 4000.0), {}


# ---- recurrent (no public function of its own: rnn / gru / lstm call it) ------------------------------

_GATES = {"normal": ("rnn", 1), "gru": ("gru", 3), "lstm": ("lstm", 4)}


@sample("recurrent", ("normal", "gru", "lstm", "size-1 dim", "nan/inf", "extreme"), call_op=True)
def _recurrent(g: Gen) -> Sample:
    kind, gates = _GATES.get(g.variant, ("rnn", 1))
    x, h = g.x(3, g.n(), 4), 3
    w, r, b = g.plain(1, gates * h, 4), g.plain(1, gates * h, h), g.plain(1, 2 * gates * h)
    return (x, w, r, b), {"kind": kind}
