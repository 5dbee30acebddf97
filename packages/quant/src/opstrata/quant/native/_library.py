"""The int8 GEMM library (``qgemm.c``): built on first use through ops' shared build machinery.

``opstrata.ops.NativeLibrary`` compiles the source once per machine into ``$OPSTRATA_CACHE_DIR/native``
(atomic write, rebuilt when corrupted) and honours ``OPSTRATA_NATIVE`` (``auto``: warn once and let
the numpy kernels run; ``on``: a failed build is an error; ``off``). The library is built *without*
``-march=native``: its AVX-512 VNNI / AVX-VNNI / AVX2 functions carry ``target`` attributes and are
chosen at run time from the CPU's flags, so one build runs on any x86-64 and the portable C path
everywhere else.
"""

from __future__ import annotations

import ctypes
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import opstrata.ops as ops

from .._errors import QuantError

__all__ = [
    "ENV_PATH",
    "PATHS",
    "QGemmStatus",
    "available_paths",
    "best_path",
    "count",
    "entry_address",
    "library",
    "native_status",
    "path_id",
    "reset_native_stats",
]

SOURCE = Path(__file__).with_name("qgemm.c")
ABI = 7  # opstrata_qgemm_abi() of a library these bindings understand
#: code paths by id (the C enum QG_PATH_*), slowest first
PATHS = ("portable", "avx2", "avxvnni", "avx512vnni", "amx")
#: forces the path of the registered kernels (``auto`` or one of :data:`PATHS`)
ENV_PATH = "OPSTRATA_QGEMM_PATH"

_P, _I64, _I32, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_int
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "opstrata_qgemm_paths": ([], _INT),
    "opstrata_qgemm_best_path": ([], _INT),
    "opstrata_qgemm_packed_size": ([_I64, _I64], _I64),
    "opstrata_qgemm_fingerprint": ([_P, _I64, _I64, _I64], ctypes.c_uint64),
    "opstrata_qgemm_pack_b": ([_P, _I64, _INT, _P, _I64, _I64, _I64, _P, _P, _P], _INT),
    "opstrata_dynamic_quantize": ([_P, _I64, _P, _P, _P], _INT),
    "opstrata_qconv2d": (
        [
            *(_INT, _I64, _I64, _I64, _I64, _P, _INT, _I32),  # path, N, C, H, W, x, x_signed, x_zp
            *(_I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64, _I64),  # OC, kh, kw, sh, sw, ph, pw, dh, dw
            *(_I64, _I64, _I64),  # OH, OW, groups
            *(_P, _P, _P),  # per group: packed B, colsum, zbe (arrays of pointers)
            *(_P, _I64, _P, _P, _INT),  # scale, n, bias, out, threads
        ],
        _INT,
    ),
    "opstrata_qconv2d_depthwise": (
        [
            _INT,  # path
            *(_I64, _I64, _I64, _I64, _P, _INT, _I32),  # N, C, H, W, x, x_signed, x_zp
            *(
                _I64,
                _I64,
                _I64,
                _I64,
                _I64,
                _I64,
                _I64,
                _I64,
                _I64,
                _I64,
            ),  # kh, kw, sh, sw, ph, pw, dh, dw, OH, OW
            # the centred weight (int16; float32 or NULL; float32 in blocks of 16 channels or NULL), scale,
            # its length, bias, out, threads
            *(_P, _P, _P, _P, _I64, _P, _P, _INT),
        ],
        _INT,
    ),
    "opstrata_dqgemm": (
        [
            *(_I64, _I64, _I64, _P, _I64),  # M, N, K, x, ldx
            *(_P, _INT, _P, _P, _I64),  # packed codes, bits, scale, shift, rows per group
            *(_P, _P, _I64, _INT),  # bias, out, ldo, threads
        ],
        _INT,
    ),
    "opstrata_quantize_linear": ([_P, _I64, ctypes.c_float, _I32, _INT, _P], _INT),
    "opstrata_quantize_linear_mt": ([_P, _I64, ctypes.c_float, _I32, _INT, _P, _INT], _INT),  # + threads
    # x, residual, n, activation, alpha, beta, scale, zero point, signed, y, threads
    "opstrata_requantize_f32": (
        [_P, _P, _I64, _INT, ctypes.c_float, ctypes.c_float, ctypes.c_float, _I32, _INT, _P, _INT],
        _INT,
    ),
    # the packed entry points ops' native batches call (one int64 block of the arguments above)
    "opstrata_qconv2d_packed": ([_P], _INT),
    "opstrata_qconv2d_depthwise_packed": ([_P], _INT),
    "opstrata_quantize_linear_packed": ([_P], _INT),
    "opstrata_qconv_quantize_packed": ([_P], _INT),
    "opstrata_qgemm_packed": ([_P], _INT),
    "opstrata_qgemm_set_pool": ([_P], None),
    "opstrata_dynamic_qgemm": (
        [
            *(_INT, _I64, _I64, _I64, _P, _INT),  # path, M, N, K, x, per_row
            *(_P, _P, _P, _P, _I64, _P, _INT),  # packed B, colsum, zbe, b_scale, n, bias, relu
            *(_P, _I64, _P, _P, _INT),  # out, ldo, scales, zero points, threads
        ],
        _INT,
    ),
    "opstrata_qgemm": (
        [
            *(_INT, _I64, _I64, _I64),  # path, M, N, K
            *(_P, _I64, _INT, _P, _I64),  # A, lda, a_signed, a zero points, how many
            *(_P, _P, _P),  # packed B, colsum, zero points relative to int8
            *(_INT, _P, _I64),  # epilogue kind, out, ldo
            *(_P, _I64, _P, _I64, _P, _INT, _I32),  # a_scale, n, b_scale, n, bias, relu, y_zp
            _INT,  # threads
        ],
        _INT,
    ),
}

_NativeLibrary = getattr(ops, "NativeLibrary", None)  # opstrata-ops >= 0.4.3
LIBRARY: Any = (
    _NativeLibrary(
        "opstrata_quant_qgemm",
        SOURCE,
        _SIGNATURES,
        # no FMA contraction: the float epilogues round the product and the sum apart, as the numpy reference
        cflags=(*ops.native.build.PORTABLE_CFLAGS, "-pthread", "-ffp-contract=off"),
        abi=("opstrata_qgemm_abi", ABI),
        what="quant int8 kernels",
    )
    if _NativeLibrary is not None
    else None
)
_OLD_OPS = (
    f"opstrata-ops {getattr(ops, '__version__', '?')} has no build_library / NativeLibrary (added after "
    "0.4.2): the numpy kernels run. Fix: upgrade opstrata-ops"
)


def library() -> ctypes.CDLL | None:
    """The loaded library (built on first call); None when ``OPSTRATA_NATIVE=off``, when ``auto`` could
    not build it (warned once), or with an opstrata-ops too old to build it. Raises
    ``opstrata.ops.NativeBuildError`` under ``OPSTRATA_NATIVE=on`` when the build fails."""
    if LIBRARY is None:
        return None
    lib = LIBRARY.get(stacklevel=4)
    if lib is not None and _pooled.get("lib") is not lib:
        _pooled["lib"] = lib
        _share_pool(lib)
    return lib


_pooled: dict[str, Any] = {}


def _share_pool(lib: ctypes.CDLL) -> None:
    """Hand ops' persistent worker pool to the library (opstrata-ops >= 0.4.59): its kernels split work over
    those workers instead of starting threads per call. Without it they keep their own threads."""
    address = ops.native_pool_address() if hasattr(ops, "native_pool_address") else 0
    lib.opstrata_qgemm_set_pool(address or None)


def entry_address(lib: ctypes.CDLL, name: str) -> int:
    """The address of the library's exported function ``name`` (a packed entry point that ops' native
    batches call through ``opstrata.ops.foreign_call``)."""
    return int(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value or 0)


def available_paths(lib: ctypes.CDLL | None = None) -> list[str]:
    """The code paths this CPU runs (slowest first); ``[]`` without the library."""
    lib = lib or library()
    if lib is None:
        return []
    mask = lib.opstrata_qgemm_paths()
    return [name for i, name in enumerate(PATHS) if mask & (1 << i)]


def best_path(lib: ctypes.CDLL | None = None) -> str | None:
    """The path ``path="auto"`` takes on this CPU; None without the library."""
    lib = lib or library()
    return None if lib is None else PATHS[lib.opstrata_qgemm_best_path()]


def path_id(path: str | None, lib: ctypes.CDLL) -> int:
    """``path`` (None / ``"auto"``: ``$OPSTRATA_QGEMM_PATH``, default the best) as the C enum; a path this
    CPU lacks or an unknown name is a :class:`~opstrata.quant.QuantError` naming the ones it has."""
    name = (path or os.environ.get(ENV_PATH, "") or "auto").strip().lower()
    if name == "auto":
        return -1
    have = available_paths(lib)
    if name not in PATHS:
        raise QuantError(
            "qgemm",
            f"path={name!r} is not one of auto, {', '.join(PATHS)} (from the argument or ${ENV_PATH})",
            "fix the name",
        )
    if name not in have:
        raise QuantError(
            "qgemm",
            f"path {name!r} needs CPU features this machine lacks; it runs {', '.join(have)}",
            "pick one of those or path='auto'",
        )
    return PATHS.index(name)


@dataclass
class QGemmStatus:
    """What quant's int8 kernels are doing in this process (see :func:`native_status`)."""

    mode: str
    available: bool | None  # None: not tried yet (built on the first int8 GEMM)
    library: str | None = None
    compiler: str | None = None
    reason: str = ""
    paths: list[str] = field(default_factory=list)  # code paths this CPU runs
    best_path: str | None = None  # the one "auto" takes
    calls: dict[str, dict[str, int]] = field(default_factory=dict)  # op -> {"native": n, "numpy": m}


_count_lock = threading.Lock()
_calls: dict[str, dict[str, int]] = {}


def count(op: str, path: str) -> None:
    """Record that ``op`` ran on ``path`` (``"native"`` or ``"numpy"``) for :func:`native_status`."""
    with _count_lock:
        per_op = _calls.setdefault(op, {"native": 0, "numpy": 0})
        per_op[path] += 1


def reset_native_stats() -> None:
    """Zero the per-op call counts of :func:`native_status`."""
    with _count_lock:
        _calls.clear()


def native_status(*, build: bool = False) -> QGemmStatus:
    """Mode, whether the int8 library is loaded (and where), why not, the CPU's code paths and per-op
    native / numpy call counts. ``build=True`` builds or loads it first (a failed build under
    ``OPSTRATA_NATIVE=on`` is reported in ``reason`` rather than raised)."""
    with _count_lock:
        calls = {k: dict(v) for k, v in _calls.items()}
    if LIBRARY is None:
        return QGemmStatus(ops.native_status().mode, False, None, None, _OLD_OPS, calls=calls)
    s = LIBRARY.status(build=build)
    lib = LIBRARY.get() if s.available else None
    return QGemmStatus(
        s.mode, s.available, s.library, s.compiler, s.reason, available_paths(lib) if lib else [],
        best_path(lib) if lib else None, calls,
    )  # fmt: skip
