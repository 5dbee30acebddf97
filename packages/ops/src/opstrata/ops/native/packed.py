"""Bound native calls packed for the library's two-argument entry point, and runs of them as one call.

ctypes converts each argument of a call (~0.2 us each), so a kernel with a dozen arguments costs more to
call than a small tile takes to compute. A :class:`NativeCall` stores its arguments once as an int64
block (pointers as addresses, floats as the bits of a double) and calls ``opstrata_call_packed(id,
block)``; :class:`NativeBatch` runs consecutive bound calls with one ``opstrata_call_batch`` (the
runtime merges its bound native steps this way: a native loop over prebuilt calls with their arena
pointers). Ids match the switch in ``kernels.c``.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np

from .library import library

__all__ = [
    "PACKED_IDS",
    "BoundSteps",
    "NativeBatch",
    "NativeBatchError",
    "NativeCall",
    "flatten",
    "foreign_call",
    "native_pool_address",
    "pack_args",
]

#: exported function -> its id in ``opstrata_call_packed``
PACKED_IDS = {
    "opstrata_ew_run_f32": 1,
    "opstrata_depthwise_conv2d_f32": 2,
    "opstrata_im2col_f32": 3,
    "opstrata_max_pool2d_f32": 4,
    "opstrata_layer_norm_f32": 5,
    "opstrata_rms_norm_f32": 6,
    "opstrata_rope_half_f32": 7,
    "opstrata_attention_f32": 8,
    "opstrata_bias_act_f32": 9,
    "batched_sgemm": 10,
    "row_bias_add": 11,
    "col_bias_add": 12,
    "binary_f32": 13,
    "strided_copy": 14,
    "gather_rows": 15,
    "mean_rows": 16,
    "batched_sgemv": 17,
    "opstrata_sgemm_fma_f32": 18,
    "opstrata_sgemm_fma_epi_f32": 19,
    "row_binary_f32": 20,
    "opstrata_softmax_rows_f32": 21,
    "opstrata_attention_blas_f32": 22,
    "opstrata_conv_direct_f32": 23,
    "opstrata_sgemm_lanes_f32": 24,
    "opstrata_conv_gather_f32": 25,
    "opstrata_depthwise_lanes_f32": 26,
    "opstrata_linear_packed_f32": 27,
    "opstrata_call_foreign": 28,
    "relu_f32": 29,
    "opstrata_avg_pool2d_f32": 30,
}


def pack_args(args: Sequence[Any]) -> np.ndarray:
    """Arguments as the int64 block the packed entry point reads: None -> 0, ints (and bools) as they
    are, floats as the bits of a double (the C side rounds to float where the kernel takes one)."""
    out = np.empty(len(args), np.int64)
    for i, a in enumerate(args):
        if a is None:
            out[i] = 0
        elif isinstance(a, (float, np.floating)):
            out[i] = struct.unpack("<q", struct.pack("<d", float(a)))[0]
        else:
            out[i] = int(a)
    return out


class NativeCall:
    """One bound native kernel call: ``call()`` runs it (raising ``error(code)`` on a non-zero code) and
    returns ``result``; ``keep`` holds the arrays its pointers point into."""

    __slots__ = ("_fn", "_ptr", "block", "code", "error", "keep", "lib", "name", "result")

    def __init__(
        self,
        lib: Any,
        name: str,
        args: Sequence[Any],
        keep: Any,
        error: Callable[[int], Exception] | None = None,
        result: Any = None,
    ) -> None:
        self.name, self.code = name, PACKED_IDS[name]
        self.block = pack_args(args)
        self._ptr = self.block.ctypes.data
        self.lib, self._fn = lib, lib.opstrata_call_packed
        self.keep, self.error, self.result = keep, error, result

    def __call__(self) -> Any:
        rc = self._fn(self.code, self._ptr)
        if rc != 0:
            raise self.failure(rc)
        return self.result

    def failure(self, rc: int) -> Exception:
        """The exception for return code ``rc``."""
        if self.error is not None:
            return self.error(rc)
        return RuntimeError(f"{self.name}: native call failed with code {rc}")


def foreign_call(
    address: int,
    args: Sequence[Any],
    keep: Any,
    error: Callable[[int], Exception] | None = None,
    result: Any = None,
    name: str = "opstrata_call_foreign",
) -> NativeCall | None:
    """A :class:`NativeCall` of another native library's packed entry point ``int fn(const int64_t
    *args)`` at ``address``, with ``args`` packed as :func:`pack_args` does: it merges into a
    :class:`NativeBatch` with ops' own calls, so a run alternating kernels of two libraries stays one C
    loop (the upper layers register such kernels: opstrata.quant's int8 convolution). None without ops'
    native library. ``keep`` must hold every array the pointers point into for as long as the call lives.
    """
    lib = library()
    if lib is None or not address:
        return None
    call = NativeCall(lib, "opstrata_call_foreign", [int(address), *args], keep, error, result)
    call.name = name  # the foreign kernel's name, for error messages
    return call


def native_pool_address() -> int:
    """The address of ``void opstrata_pool_run(void (*fn)(void *, int64_t), void *ctx, int64_t ntasks, int
    nthreads)``: ops' persistent worker pool, for another native library to split its kernels' work over
    (opstrata.quant's int8 kernels) -- one pool per process, no thread started per call. 0 without ops'
    native library."""
    lib = library()
    return 0 if lib is None else int(ctypes.cast(lib.opstrata_pool_run, ctypes.c_void_p).value or 0)


class NativeBatchError(RuntimeError):
    """A call inside a :class:`NativeBatch` failed: ``index`` is its position, ``__cause__`` its error."""

    def __init__(self, index: int, exc: Exception) -> None:
        super().__init__(f"call {index} of a native batch failed: {exc}")
        self.index = index


class NativeBatch:
    """Consecutive :class:`NativeCall`\\ s run by one ``opstrata_call_batch`` call, in order."""

    __slots__ = ("_cmds", "_failed", "_fn", "calls")

    def __init__(self, lib: Any, calls: Sequence[NativeCall]) -> None:
        self.calls = list(calls)
        self._cmds = np.array([v for c in self.calls for v in (c.code, c._ptr)], np.int64)
        self._failed = np.zeros(1, np.int64)
        self._fn = lib.opstrata_call_batch

    def __call__(self) -> None:
        rc = self._fn(self._cmds.ctypes.data, len(self.calls), self._failed.ctypes.data)
        if rc != 0:
            i = int(self._failed[0])
            exc = self.calls[i].failure(rc)
            raise NativeBatchError(i, exc) from exc


class BoundSteps:
    """A binder's several zero-argument calls run in order as one; ``steps`` lets a runner merge the
    native ones with their neighbours' (:func:`flatten`)."""

    __slots__ = ("steps",)

    def __init__(self, steps: Sequence[Callable[[], Any]]) -> None:
        self.steps = list(steps)

    def __call__(self) -> None:
        for step in self.steps:
            step()


def flatten(call: Callable[[], Any]) -> list[Callable[[], Any]]:
    """The plain calls a bound call is made of (a :class:`BoundSteps` opened up, recursively)."""
    if isinstance(call, BoundSteps):
        return [c for s in call.steps for c in flatten(s)]
    return [call]


def merge_bound_calls(
    calls: Sequence[Callable[[], Any]],
) -> tuple[list[Callable[[], Any]], list[list[int]]]:
    """``calls`` (zero-argument bound calls, run in order) with every run of consecutive native calls --
    :class:`BoundSteps` opened up -- as one :class:`NativeBatch`. Returns ``(runner, owners)``: running
    ``runner`` in order does what ``calls`` did; ``owners[k][j]`` is the position in ``calls`` of the j-th
    call inside ``runner[k]`` (one entry for a plain call), for naming a failure (NativeBatchError.index)."""
    runner: list[Callable[[], Any]] = []
    owners: list[list[int]] = []
    pending: list[NativeCall] = []
    pending_owner: list[int] = []

    def flush() -> None:
        if len(pending) > 1:
            runner.append(NativeBatch(pending[0].lib, pending))
        elif pending:
            runner.append(pending[0])
        if pending:
            owners.append(list(pending_owner))
        pending.clear()
        pending_owner.clear()

    for pos, call in enumerate(calls):
        for part in flatten(call):
            if isinstance(part, NativeCall):
                if pending and part.lib is not pending[0].lib:
                    flush()  # a batch runs in one library: its ids are that library's
                pending.append(part)
                pending_owner.append(pos)
            else:
                flush()
                runner.append(part)
                owners.append([pos])
    flush()
    return runner, owners


def bind_copy(dst: np.ndarray, src: np.ndarray) -> Callable[[], Any]:
    """``np.copyto(dst, src)`` for same-shape, same-dtype views (up to 6 dims, any strides, not
    overlapping) as one packed native call (bytes moved, nothing computed: the same result); else the
    numpy call."""
    ok = (
        type(dst) is np.ndarray and type(src) is np.ndarray and dst.dtype == src.dtype and dst.shape == src.shape
        and dst.flags.writeable and 0 < src.ndim <= 6 and src.size > 0 and not np.may_share_memory(dst, src)
        and dst.dtype.kind in "biuf"
    )  # fmt: skip
    lib = library() if ok else None
    if lib is None:
        return partial(np.copyto, dst, src)
    shape, sst = np.array(src.shape, np.int64), np.array(src.strides, np.int64)
    dst_strides = None if dst.flags.c_contiguous else np.array(dst.strides, np.int64)
    args = (src.ctypes.data, dst.ctypes.data, src.itemsize, src.ndim, shape.ctypes.data, sst.ctypes.data,
            None if dst_strides is None else dst_strides.ctypes.data)  # fmt: skip
    return NativeCall(lib, "strided_copy", args, (src, dst, shape, sst, dst_strides))


def bind_concat(pieces: Sequence[np.ndarray], axis: int, out: np.ndarray) -> Callable[[], Any]:
    """``np.concatenate(pieces, axis=axis, out=out)`` as one copy per piece into its slice of ``out``
    (packed native copies where :func:`bind_copy` takes them); the numpy call when the shapes do not
    line up (its own error then says why)."""
    numpy_call = partial(np.concatenate, list(pieces), axis=axis, out=out)
    if type(out) is not np.ndarray or not pieces or out.ndim == 0:
        return numpy_call
    ax = axis % out.ndim
    if any(type(p) is not np.ndarray or p.ndim != out.ndim or p.dtype != out.dtype for p in pieces):
        return numpy_call
    if sum(p.shape[ax] for p in pieces) != out.shape[ax] or any(
        p.shape[:ax] + p.shape[ax + 1 :] != out.shape[:ax] + out.shape[ax + 1 :] for p in pieces
    ):
        return numpy_call
    copies, start = [], 0
    for p in pieces:
        view = out[(slice(None),) * ax + (slice(start, start + p.shape[ax]),)]
        start += p.shape[ax]
        if p.size:
            copies.append(bind_copy(view, p))
    return BoundSteps(copies)


def bind_take(table: np.ndarray, indices: np.ndarray, axis: int, out: np.ndarray) -> Callable[[], Any]:
    """``np.take(table, indices, axis=axis, out=out)`` (an embedding lookup, Gather) as one packed native
    call for a C-contiguous table and out and int64 indices; an index out of range raises IndexError as
    numpy does. Else the numpy call."""
    numpy_call = partial(np.take, table, indices, axis=axis, out=out)
    ok = (
        type(table) is np.ndarray and type(indices) is np.ndarray and type(out) is np.ndarray
        and indices.dtype == np.int64 and table.dtype == out.dtype and table.dtype.kind in "biuf"
        and table.flags.c_contiguous and out.flags.c_contiguous and indices.flags.c_contiguous
        and out.flags.writeable and table.ndim >= 1 and not np.may_share_memory(out, table)
        and not np.may_share_memory(out, indices)
    )  # fmt: skip
    if not ok:
        return numpy_call
    ax = axis % table.ndim
    want = (*table.shape[:ax], *indices.shape, *table.shape[ax + 1 :])
    lib = library() if out.shape == want and table.shape[ax] > 0 else None
    if lib is None:
        return numpy_call
    outer = int(np.prod(table.shape[:ax], dtype=np.int64))
    inner = int(np.prod(table.shape[ax + 1 :], dtype=np.int64)) * table.itemsize
    n = table.shape[ax]
    args = (table.ctypes.data, indices.ctypes.data, out.ctypes.data, outer, n, inner, indices.size)
    return NativeCall(lib, "gather_rows", args, (table, indices, out), lambda rc: IndexError(
        f"index out of bounds for axis {ax} with size {n} (indices {indices.min()}..{indices.max()})"))  # fmt: skip
