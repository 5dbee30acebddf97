"""Native kernels: ``native/kernels.c`` compiled once per machine by the system C compiler, loaded by ctypes.

numpy stays the compute backend; a handful of float32 kernels where numpy needs many passes over memory
(GELU in both forms, bias + ReLU / SiLU, layer norm, row softmax) run as one fused C loop instead, as
torch's and onnxruntime's CPU kernels do.
The library is built on first use into ``$OPSTRATA_CACHE_DIR/native`` (default ``~/.cache/opstrata``),
keyed by the source, compiler and CPU, written atomically (temp file + rename) and reused afterwards.

``OPSTRATA_NATIVE`` chooses: ``auto`` (default: use when it builds, otherwise warn once with the
compiler's message and run the numpy kernels), ``on`` (a failed build is an error) or ``off``.
:func:`native_status` says which happened and counts the calls each path served.
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..kernels.parallel import configured_threads
from .build import (
    ENV_MODE as ENV_MODE,
    MODES as MODES,
    NativeBuildError as NativeBuildError,
    NativeBuildWarning as NativeBuildWarning,
    NativeLibrary,
    compiler as _compiler,
    native_cache_dir as native_cache_dir,
    native_mode as native_mode,
)

SOURCE = Path(__file__).with_name("kernels.c")
ABI = 22  # opstrata_native_abi() of a library these bindings understand
#: plain -O3 plus the CPU's own vector units; no -ffast-math (NaN / inf keep their IEEE meaning)
CFLAGS = (
    "-O3",
    "-march=native",
    "-mprefer-vector-width=512",
    "-fPIC",
    "-shared",
    "-fno-math-errno",
    "-fno-trapping-math",
)

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
#: exported function -> (argument types, result type)
_SIGNATURES = {
    "opstrata_bias_act_f32": ([_P, _P, _P, _I64, _I64, ctypes.c_int], ctypes.c_int),
    "opstrata_softmax_rows_f32": ([_P, _P, _P, _I64, _I64], None),
    "opstrata_layer_norm_f32": ([_P, _P, _P, _P, _I64, _I64, ctypes.c_float], None),
    "opstrata_rms_norm_f32": ([_P, _P, _P, _I64, _I64, ctypes.c_float], None),
    "opstrata_rope_half_f32": ([_P, _P, _P, _P, _P, _P, _P, _I64, _I64, _I64], None),
    "opstrata_depthwise_conv2d_f32": ([_P, _P, _P, _P, *[_I64] * 15], ctypes.c_int),
    "opstrata_depthwise_lanes_f32": ([_P, _P, _P, _P, *[_I64] * 16, _P], ctypes.c_int),
    "opstrata_linear_packed_f32": ([_P, _P, _P, *[_I64] * 6], ctypes.c_int),
    "opstrata_im2col_f32": ([_P, _P, *[_I64] * 15], None),
    "opstrata_max_pool2d_f32": ([_P, _P, *[_I64] * 15], ctypes.c_int),
    "opstrata_avg_pool2d_f32": ([_P, _P, *[_I64] * 11], None),
    "opstrata_attention_f32": ([*[_P] * 12, ctypes.c_int, ctypes.c_int, ctypes.c_float], ctypes.c_int),
    "opstrata_attention_blas_f32": (
        [*[_P] * 12, ctypes.c_int, ctypes.c_int, ctypes.c_float, _I64],
        ctypes.c_int,
    ),
    "opstrata_sgemm_fma_f32": ([_P, _P, _P, _P, *[_I64] * 12], ctypes.c_int),
    "opstrata_sgemm_fma_epi_f32": ([_P, _P, _P, _P, *[_I64] * 13, _P, _P], ctypes.c_int),
    "opstrata_conv_direct_f32": ([_P, _P, _P, _P, *[_I64] * 15, _P, _P], ctypes.c_int),
    "opstrata_sgemm_lanes_f32": ([_P, _P, _P, _P, *[_I64] * 13, _P, _P], ctypes.c_int),
    "opstrata_conv_gather_f32": ([_P, _P, _P, _P, *[_I64] * 18, _P, _P], ctypes.c_int),
    "opstrata_sgemm_fma_fast": ([], ctypes.c_int),
    "opstrata_call_packed": ([_I64, _P], ctypes.c_int),
    "opstrata_set_sgemm": ([_P, _P, ctypes.c_int], None),
    "opstrata_pool_run": ([_P, _P, _I64, ctypes.c_int], None),
    "opstrata_call_batch": ([_P, _I64, _P], ctypes.c_int),
    "opstrata_ew_run_f32": (
        [_P, _I64, _P, _I64, _I64, _P, _P, _P, _I64, _P, _I64, ctypes.c_int, _P, _I64, _I64],
        ctypes.c_int,
    ),
}

#: the lazily built, mode-aware handle (the build machinery is shared: :mod:`.build`)
LIBRARY = NativeLibrary(
    "opstrata_native",
    SOURCE,
    _SIGNATURES,
    cflags=CFLAGS,
    abi=("opstrata_native_abi", ABI),
    what="native kernels",
)


@dataclass
class NativeStatus:
    """What the native path is doing in this process (see :func:`native_status`)."""

    mode: str
    available: bool | None  # None: not tried yet (the library is built on the first native call)
    library: str | None = None
    compiler: str | None = None
    reason: str = ""
    calls: dict[str, dict[str, int]] = field(default_factory=dict)  # op -> {"native": n, "numpy": m}


_calls: dict[str, dict[str, int]] = {}


def library_path(cc: list[str] | None = None) -> Path:
    """Where the library for this source, compiler and CPU lives in the cache."""
    return LIBRARY.path(_compiler() if cc is None else cc)


def library() -> ctypes.CDLL | None:
    """The loaded native library, building it on the first call; None when off or (``auto``) unbuildable.

    Raises :class:`NativeBuildError` under ``OPSTRATA_NATIVE=on`` when the build fails.
    """
    return LIBRARY.get(stacklevel=4)


_count_lock = threading.Lock()  # stream workers call kernels concurrently (ctypes releases the GIL)


def count(op: str, path: str) -> None:
    """Record that ``op`` ran on ``path`` ("native" or "numpy") for :func:`native_status`."""
    with _count_lock:
        per_op = _calls.setdefault(op, {"native": 0, "numpy": 0})
        per_op[path] += 1


def native_status(*, build: bool = False) -> NativeStatus:
    """The mode, whether the library is loaded (and where), why not, and per-op native / numpy call counts.

    ``build=True`` builds or loads the library first (as the first native call would), so ``available``
    is known; a failed build under ``OPSTRATA_NATIVE=on`` is reported in ``reason`` instead of raised.
    """
    s = LIBRARY.status(build=build)
    with _count_lock:
        calls = {k: dict(v) for k, v in _calls.items()}
    return NativeStatus(s.mode, s.available, s.library, s.compiler, s.reason, calls)


def reset_native_stats() -> None:
    """Zero the per-op call counts of :func:`native_status`."""
    with _count_lock:
        _calls.clear()


def native_threads() -> int:
    """Threads a native kernel may split its work over: ``kernels.parallel.configured_threads`` (the
    enclosing ``intra_op_threads`` limit -- an InferenceSession's intra-op count during its runs and
    bindings -- else ``OPSTRATA_NUM_THREADS``, else the usable cores). Results do not depend on it (the
    kernels split work, not sums)."""
    return configured_threads()
