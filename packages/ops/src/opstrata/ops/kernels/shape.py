"""Shape ops on ``ref`` and ``cpu``: concat, split, slice, transpose, reshape, expand (ONNX semantics).

Every dtype is accepted (floats, ints, bool). ``ref`` kernels always return fresh arrays; ``cpu``
kernels return numpy views where the layout allows (as numpy and torch do): ``transpose``,
``reshape``, ``slice`` and ``split`` results may share memory with ``x``, and ``expand`` returns a
read-only broadcast view. Copy a result (``.copy()``) before writing into it.
"""

from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._dtypes import TENSOR_DTYPES
from .._errors import OpError, check_ndim
from .._registry import call, register

__all__ = ["concat", "expand", "normalize_axis", "reshape", "slice", "split", "transpose"]


def normalize_axis(op: str, axis: Any, ndim: int, name: str = "axis") -> int:
    """``axis`` in ``[-ndim, ndim)`` as a non-negative int, else OpError."""
    if not isinstance(axis, (int, np.integer)) or not -ndim <= axis < ndim:
        raise OpError(op, name, f"an int in [{-ndim}, {ndim - 1}] (x has {ndim} dims)", repr(axis))
    return int(axis) % ndim


def _ints(op: str, name: str, values: Any) -> list[int]:
    """A sequence (or 1-D array) of ints as a list, else OpError."""
    try:
        arr = np.asarray(values)
    except (TypeError, ValueError):
        arr = np.asarray(None)
    if arr.ndim != 1 or (arr.size and arr.dtype.kind not in "iu"):
        raise OpError(op, name, "a 1-D sequence of ints", repr(values))
    return [int(v) for v in arr.tolist()]


# ---------------------------------------------------------------------------------------------
# concat
# ---------------------------------------------------------------------------------------------


def _check_concat(arrays: Any, axis: Any) -> tuple[list[np.ndarray], int]:
    if isinstance(arrays, np.ndarray) or not isinstance(arrays, Sequence):
        raise OpError("concat", "arrays", "a sequence (list or tuple) of arrays", type(arrays).__name__)
    arrs = [np.asarray(a) for a in arrays]
    if not arrs:
        raise OpError("concat", "arrays", "at least one array", "an empty sequence")
    first = arrs[0]
    check_ndim("concat", "arrays[0]", first, (1, None))
    ax = normalize_axis("concat", axis, first.ndim)
    for i, a in enumerate(arrs[1:], start=1):
        if a.dtype != first.dtype:
            raise OpError(
                "concat", f"arrays[{i}]", f"dtype {first.dtype} (the dtype of arrays[0])", str(a.dtype)
            )
        if (
            a.ndim != first.ndim
            or a.shape[:ax] + a.shape[ax + 1 :] != first.shape[:ax] + first.shape[ax + 1 :]
        ):
            raise OpError(
                "concat",
                f"arrays[{i}]",
                f"shape {first.shape} except along axis {ax} (arrays[0])",
                str(a.shape),
            )
    return arrs, ax


@register("concat", device="ref", dtypes=TENSOR_DTYPES)
def concat_ref(arrays: Sequence[Any], *, axis: int = 0) -> np.ndarray:
    arrs, ax = _check_concat(arrays, axis)
    shape = list(arrs[0].shape)
    shape[ax] = sum(a.shape[ax] for a in arrs)
    out = np.empty(shape, arrs[0].dtype)
    start = 0
    for a in arrs:  # copy each piece into its slot
        index = (builtins.slice(None),) * ax + (builtins.slice(start, start + a.shape[ax]),)
        out[index] = a
        start += a.shape[ax]
    return out


@register("concat", device="cpu", dtypes=TENSOR_DTYPES)
def concat_cpu(arrays: Sequence[Any], *, axis: int = 0) -> np.ndarray:
    arrs, ax = _check_concat(arrays, axis)
    return np.concatenate(arrs, axis=ax)


# ---------------------------------------------------------------------------------------------
# split
# ---------------------------------------------------------------------------------------------


def _split_sizes(x: np.ndarray, sections: Any, axis: Any) -> tuple[list[int], int]:
    check_ndim("split", "x", x, (1, None))
    ax = normalize_axis("split", axis, x.ndim)
    dim = x.shape[ax]
    if isinstance(sections, (int, np.integer)) and not isinstance(sections, bool):
        if sections < 1:
            raise OpError("split", "sections", "a chunk size >= 1 or a list of sizes", repr(sections))
        sizes = [int(sections)] * (dim // sections) + ([dim % sections] if dim % sections else [])
        return sizes or [0], ax
    sizes = _ints("split", "sections", sections)
    if any(s < 0 for s in sizes) or sum(sizes) != dim:
        raise OpError("split", "sections", f"sizes >= 0 summing to {dim} (x.shape[{ax}])", repr(sections))
    return sizes, ax


@register("split", device="ref", dtypes=TENSOR_DTYPES)
def split_ref(x: Any, sections: Any, *, axis: int = 0) -> list[np.ndarray]:
    x = np.asarray(x)
    sizes, ax = _split_sizes(x, sections, axis)
    starts = np.cumsum([0, *sizes])
    return [np.take(x, np.arange(starts[i], starts[i + 1]), axis=ax) for i in range(len(sizes))]


@register("split", device="cpu", dtypes=TENSOR_DTYPES)
def split_cpu(x: Any, sections: Any, *, axis: int = 0) -> list[np.ndarray]:
    x = np.asarray(x)
    sizes, ax = _split_sizes(x, sections, axis)
    return np.split(x, np.cumsum(sizes)[:-1], axis=ax)  # views


# ---------------------------------------------------------------------------------------------
# slice (ONNX Slice: negative starts/ends count from the end, clamped; negative steps walk back)
# ---------------------------------------------------------------------------------------------


def _slice_params(
    x: np.ndarray, starts: Any, ends: Any, axes: Any, steps: Any
) -> list[tuple[int, int, int, int]]:
    """``(axis, start, end, step)`` per sliced axis after ONNX's normalization and clamping."""
    st, en = _ints("slice", "starts", starts), _ints("slice", "ends", ends)
    ax = list(range(len(st))) if axes is None else _ints("slice", "axes", axes)
    sp = [1] * len(st) if steps is None else _ints("slice", "steps", steps)
    for name, vals in (("ends", en), ("axes", ax), ("steps", sp)):
        if len(vals) != len(st):
            raise OpError("slice", name, f"{len(st)} entries (as many as 'starts')", f"{len(vals)}: {vals}")
    ax = [normalize_axis("slice", a, x.ndim, "axes") for a in ax]
    if len(set(ax)) != len(ax):
        raise OpError("slice", "axes", "distinct axes", repr(ax))
    out = []
    for a, s, e, step in zip(ax, st, en, sp, strict=True):
        if step == 0:
            raise OpError("slice", "steps", "non-zero steps", repr(sp))
        dim = x.shape[a]
        s, e = s + dim if s < 0 else s, e + dim if e < 0 else e
        if step > 0:
            s, e = min(max(s, 0), dim), min(max(e, 0), dim)
        else:
            s, e = min(max(s, 0), dim - 1), min(max(e, -1), dim - 1)
        out.append((a, s, e, step))
    return out


@register("slice", device="ref", dtypes=TENSOR_DTYPES)
def slice_ref(x: Any, *, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> np.ndarray:
    x = np.asarray(x)
    out = x.copy()
    for a, s, e, step in _slice_params(x, starts, ends, axes, steps):
        out = np.take(out, np.arange(s, e, step, dtype=np.int64), axis=a)  # the ONNX index list, literally
    return out


@register("slice", device="cpu", dtypes=TENSOR_DTYPES)
def slice_cpu(x: Any, *, starts: Any, ends: Any, axes: Any = None, steps: Any = None) -> np.ndarray:
    x = np.asarray(x)
    index = [builtins.slice(None)] * x.ndim
    for a, s, e, step in _slice_params(x, starts, ends, axes, steps):
        index[a] = builtins.slice(s, None if e < 0 else e, step)  # e == -1: walk back through index 0
    return x[tuple(index)]


# ---------------------------------------------------------------------------------------------
# transpose, reshape, expand
# ---------------------------------------------------------------------------------------------


def _perm(x: np.ndarray, perm: Any) -> list[int]:
    if perm is None:
        return list(range(x.ndim))[::-1]
    p = _ints("transpose", "perm", perm)
    if sorted(p) != list(range(x.ndim)):
        raise OpError(
            "transpose", "perm", f"a permutation of range({x.ndim}) (x has shape {x.shape})", repr(p)
        )
    return p


@register("transpose", device="ref", dtypes=TENSOR_DTYPES)
def transpose_ref(x: Any, *, perm: Any = None) -> np.ndarray:
    x = np.asarray(x)
    p = _perm(x, perm)
    out = np.empty([x.shape[i] for i in p], x.dtype)
    for idx in np.ndindex(*x.shape):  # out[idx[perm]] = x[idx]
        out[tuple(idx[i] for i in p)] = x[idx]
    return out


@register("transpose", device="cpu", dtypes=TENSOR_DTYPES)
def transpose_cpu(x: Any, *, perm: Any = None) -> np.ndarray:
    x = np.asarray(x)
    return np.transpose(x, _perm(x, perm))


def _target_shape(x: np.ndarray, shape: Any) -> tuple[int, ...]:
    """``shape`` with its single -1 resolved; OpError on a size mismatch."""
    dims = _ints("reshape", "shape", shape)
    if sum(d == -1 for d in dims) > 1 or any(d < -1 for d in dims):
        raise OpError("reshape", "shape", "dims >= 0 with at most one -1", repr(dims))
    known = int(np.prod([d for d in dims if d != -1], dtype=np.int64))
    if -1 in dims:
        if known == 0 or x.size % known:
            raise OpError(
                "reshape", "shape", f"a shape whose -1 can be inferred for {x.size} elements (x.shape {x.shape})",
                repr(tuple(dims)),
            )  # fmt: skip
        dims[dims.index(-1)] = x.size // known
    elif known != x.size:
        raise OpError(
            "reshape",
            "shape",
            f"{x.size} elements (x.shape {x.shape})",
            f"{tuple(dims)} with {known} elements",
        )
    return tuple(dims)


@register("reshape", device="ref", dtypes=TENSOR_DTYPES)
def reshape_ref(x: Any, *, shape: Any) -> np.ndarray:
    x = np.asarray(x)
    target = _target_shape(x, shape)
    return np.array(x.ravel(order="C")).reshape(target)


@register("reshape", device="cpu", dtypes=TENSOR_DTYPES)
def reshape_cpu(x: Any, *, shape: Any) -> np.ndarray:
    x = np.asarray(x)
    return x.reshape(_target_shape(x, shape))


def _expand_shape(x: np.ndarray, shape: Any) -> tuple[int, ...]:
    dims = _ints("expand", "shape", shape)
    try:
        return tuple(np.broadcast_shapes(x.shape, tuple(dims)))
    except ValueError:
        raise OpError(
            "expand", "shape", f"a shape broadcastable with x.shape {x.shape}", repr(tuple(dims))
        ) from None


@register("expand", device="ref", dtypes=TENSOR_DTYPES)
def expand_ref(x: Any, *, shape: Any) -> np.ndarray:
    x = np.asarray(x)
    target = _expand_shape(x, shape)
    xx = x.reshape((1,) * (len(target) - x.ndim) + x.shape)  # align trailing dims
    index = tuple(np.arange(t) % d if d else np.arange(t) for t, d in zip(target, xx.shape, strict=True))
    return xx[np.ix_(*index)] if target else xx.copy()


@register("expand", device="cpu", dtypes=TENSOR_DTYPES)
def expand_cpu(x: Any, *, shape: Any) -> np.ndarray:
    x = np.asarray(x)
    return np.broadcast_to(x, _expand_shape(x, shape))  # read-only view


# ---------------------------------------------------------------------------------------------
# public ops
# ---------------------------------------------------------------------------------------------


def concat(arrays: Sequence[Any], *, axis: int = 0, device: str | None = None) -> np.ndarray:
    """Join arrays of one dtype along ``axis`` (ONNX Concat); other dims must match.

    >>> concat([np.zeros((1, 2)), np.ones((2, 2))], axis=0).shape
    (3, 2)
    """
    if isinstance(arrays, Sequence) and not isinstance(arrays, np.ndarray) and not arrays:
        # an empty list has no dtype to dispatch on: say what is wrong instead of "no kernel for None"
        raise OpError("concat", "arrays", "at least one array", "an empty sequence")
    return call("concat", arrays, axis=axis, device=device)


def split(
    x: Any, sections: int | Sequence[int], *, axis: int = 0, device: str | None = None
) -> list[np.ndarray]:
    """Split ``x`` along ``axis``: ``sections`` int = chunk size (last chunk smaller, as torch.split), list = sizes.

    On ``cpu`` the pieces are views of ``x``.

    >>> [p.shape for p in split(np.arange(5), 2)]
    [(2,), (2,), (1,)]
    """
    return call("split", x, sections, axis=axis, device=device)


def slice(  # the ONNX op name; kernels above use builtins.slice
    x: Any,
    *,
    starts: Sequence[int],
    ends: Sequence[int],
    axes: Sequence[int] | None = None,
    steps: Sequence[int] | None = None,
    device: str | None = None,
) -> np.ndarray:
    """ONNX Slice: per axis, ``starts``/``ends`` (negative counts from the end, out-of-range clamped), ``steps``.

    ``axes`` defaults to ``0..len(starts)-1`` and ``steps`` to 1; a negative step walks backwards
    (``starts=[-1], ends=[-sys.maxsize], steps=[-1]`` reverses). Clamping follows the spec text
    (as onnxruntime): with a negative step, a start before the first element clamps to 0 and so
    includes it, where numpy slicing would return nothing. On ``cpu`` the result is a view.

    >>> slice(np.arange(6), starts=[-1], ends=[0], steps=[-2]).tolist()
    [5, 3, 1]
    """
    return call("slice", x, starts=starts, ends=ends, axes=axes, steps=steps, device=device)


def transpose(x: Any, *, perm: Sequence[int] | None = None, device: str | None = None) -> np.ndarray:
    """Permute dims: ``out.shape[i] == x.shape[perm[i]]``; ``perm`` None reverses them (ONNX Transpose).

    On ``cpu`` the result is a view.

    >>> transpose(np.zeros((2, 3, 4)), perm=[2, 0, 1]).shape
    (4, 2, 3)
    """
    return call("transpose", x, perm=perm, device=device)


def reshape(x: Any, *, shape: Sequence[int], device: str | None = None) -> np.ndarray:
    """Same elements in C order, new ``shape``; one dim may be -1 (inferred); 0 is a literal empty dim.

    (ONNX Reshape's ``0`` = "copy this dim" is resolved by the graph importer, as torch does.) On
    ``cpu`` the result is a view when the layout allows.

    >>> reshape(np.arange(6), shape=[2, -1]).shape
    (2, 3)
    """
    return call("reshape", x, shape=shape, device=device)


def expand(x: Any, *, shape: Sequence[int], device: str | None = None) -> np.ndarray:
    """Broadcast ``x`` with ``shape`` (ONNX Expand: the result shape is ``broadcast(x.shape, shape)``).

    On ``cpu`` the result is a read-only broadcast view.

    >>> expand(np.ones((3, 1)), shape=[2, 1, 4]).shape
    (2, 3, 4)
    """
    return call("expand", x, shape=shape, device=device)
