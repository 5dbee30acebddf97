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

import contextlib
import ctypes
import hashlib
import os
import platform
import shlex
import subprocess
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from pathlib import Path

from ..tune.cache import cache_root

ENV_MODE = "OPSTRATA_NATIVE"
MODES = ("auto", "on", "off")
SOURCE = Path(__file__).with_name("kernels.c")
ABI = 3  # opstrata_native_abi() of a library these bindings understand
#: plain -O3 plus the CPU's own vector units; no -ffast-math (NaN / inf keep their IEEE meaning)
CFLAGS = ("-O3", "-march=native", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math")
BUILD_TIMEOUT_S = 120.0

_P, _I64 = ctypes.c_void_p, ctypes.c_int64
#: exported function -> (argument types, result type)
_SIGNATURES = {
    "opstrata_bias_act_f32": ([_P, _P, _P, _I64, _I64, ctypes.c_int], ctypes.c_int),
    "opstrata_softmax_rows_f32": ([_P, _P, _P, _I64, _I64], None),
    "opstrata_layer_norm_f32": ([_P, _P, _P, _P, _I64, _I64, ctypes.c_float], None),
}


class NativeBuildError(RuntimeError):
    """The native kernel library could not be built or loaded while ``OPSTRATA_NATIVE=on``."""


class NativeBuildWarning(UserWarning):
    """``OPSTRATA_NATIVE=auto`` could not build the native library; the numpy kernels run instead."""


@dataclass
class NativeStatus:
    """What the native path is doing in this process (see :func:`native_status`)."""

    mode: str
    available: bool | None  # None: not tried yet (the library is built on the first native call)
    library: str | None = None
    compiler: str | None = None
    reason: str = ""
    calls: dict[str, dict[str, int]] = field(default_factory=dict)  # op -> {"native": n, "numpy": m}


_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False
_reason = ""
_lib_path: str | None = None
_calls: dict[str, dict[str, int]] = {}


def native_mode() -> str:
    """``OPSTRATA_NATIVE`` normalized to one of :data:`MODES` (an unknown value is an error)."""
    raw = os.environ.get(ENV_MODE, "auto").strip().lower() or "auto"
    aliases = {"1": "on", "true": "on", "yes": "on", "0": "off", "false": "off", "no": "off"}
    mode = aliases.get(raw, raw)
    if mode not in MODES:
        raise ValueError(f"{ENV_MODE}={raw!r} is not one of {', '.join(MODES)} (or 1/0); fix the variable")
    return mode


def native_cache_dir() -> Path:
    """``$OPSTRATA_CACHE_DIR/native``, default ``$XDG_CACHE_HOME/opstrata/native`` or ``~/.cache/...``."""
    return cache_root() / "native"


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def _cpu_flags() -> str:
    """The CPU's feature line (``-march=native`` code is only valid on a CPU with the same features)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _compiler_version(cc: list[str]) -> str:
    try:
        got = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(
            f"native kernels: C compiler {shlex.join(cc)!r} cannot run ({e}). Fix: install one "
            f"(Debian/Ubuntu: apt-get install gcc), point CC at it, or set {ENV_MODE}=off"
        ) from e
    return (got.stdout or got.stderr).splitlines()[0] if (got.stdout or got.stderr) else ""


def library_path(cc: list[str] | None = None) -> Path:
    """Where the library for this source, compiler and CPU lives in the cache."""
    cc = _compiler() if cc is None else cc
    try:
        source = SOURCE.read_text()
    except OSError as e:
        raise NativeBuildError(
            f"native kernels: cannot read {SOURCE} ({e}); the opstrata-ops install is incomplete: "
            f"reinstall it, or set {ENV_MODE}=off"
        ) from e
    key = "\n".join(
        [
            source,
            shlex.join(cc),
            _compiler_version(cc),
            " ".join(CFLAGS),
            platform.machine(),
            _cpu_flags(),
        ]
    )
    return native_cache_dir() / f"opstrata_native-{hashlib.sha256(key.encode()).hexdigest()[:24]}.so"


def _compile(cc: list[str], dest: Path) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        cmd = [*cc, *CFLAGS, str(SOURCE), "-o", tmp]
        try:
            got = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise NativeBuildError(
                f"native kernels: {shlex.join(cmd)} did not finish within {BUILD_TIMEOUT_S:.0f}s; "
                f"set {ENV_MODE}=off to run the numpy kernels"
            ) from e
        if got.returncode != 0:
            raise NativeBuildError(
                f"native kernels: {shlex.join(cmd)} failed (exit {got.returncode}):\n{got.stderr.strip()[-2000:]}\n"
                f"Fix: install a working C compiler or point CC at one, or set {ENV_MODE}=off"
            )
        os.replace(tmp, dest)  # atomic: a concurrent process sees the old file, none or the whole new one
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    if lib.opstrata_native_abi() != ABI:
        raise OSError(f"ABI {lib.opstrata_native_abi()} != {ABI}")
    for name, (argtypes, restype) in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes, fn.restype = argtypes, restype
    return lib


def _build() -> ctypes.CDLL:
    global _lib_path
    cc = _compiler()
    path = library_path(cc)
    _lib_path = str(path)
    if path.exists():
        try:
            return _load(path)
        except (OSError, AttributeError):  # truncated, foreign or stale: rebuild it below
            with contextlib.suppress(OSError):
                path.unlink()
    _compile(cc, path)
    try:
        return _load(path)
    except (OSError, AttributeError) as e:
        raise NativeBuildError(
            f"native kernels: built {path} but cannot load it ({e}); remove the file or set {ENV_MODE}=off"
        ) from e


def library() -> ctypes.CDLL | None:
    """The loaded native library, building it on the first call; None when off or (``auto``) unbuildable.

    Raises :class:`NativeBuildError` under ``OPSTRATA_NATIVE=on`` when the build fails.
    """
    global _lib, _tried, _reason
    if _tried:
        return _lib
    mode = native_mode()
    if mode == "off":
        return None  # not remembered: turning the variable back on takes effect at the next call
    with _lock:
        if _tried:
            return _lib
        try:
            _lib = _build()
            _reason = ""
        except NativeBuildError as e:
            if mode == "on":
                raise
            _reason = str(e)
            warnings.warn(
                f"{e}\nThe numpy kernels run instead ({ENV_MODE}=auto).", NativeBuildWarning, stacklevel=3
            )
        _tried = True
    return _lib


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
    on_error = ""
    if build:
        try:
            library()
        except NativeBuildError as e:
            on_error = str(e)
    mode = native_mode()
    available: bool | None
    if mode == "off" or on_error:
        available = False
    else:
        available = (_lib is not None) if _tried else None
    reason = "disabled by OPSTRATA_NATIVE=off" if mode == "off" else (on_error or _reason)
    cc = None
    with contextlib.suppress(Exception):
        cc = shlex.join(_compiler())
    with _count_lock:
        calls = {k: dict(v) for k, v in _calls.items()}
    return NativeStatus(mode, available, _lib_path, cc, reason, calls)


def reset_native_stats() -> None:
    """Zero the per-op call counts of :func:`native_status`."""
    with _count_lock:
        _calls.clear()
