"""Build a C source into a shared library once per machine and load it with ctypes: the general machinery.

ops' own kernels (:mod:`.library`) and any package above ops that ships C source (opstrata-quant's int8
GEMM) use the same steps, so every native library behaves alike:

* built on first use by the system C compiler (``$CC``, default ``cc``) into
  ``$OPSTRATA_CACHE_DIR/native`` (default ``~/.cache/opstrata/native``), keyed by the source text, the
  compiler and its version, the flags, the machine and (for ``-march=native`` builds) the CPU's features;
* written atomically (temp file + rename): a concurrent process sees no file, the old one or the whole
  new one; a truncated, foreign or stale cached file is rebuilt;
* ``OPSTRATA_NATIVE`` chooses for all of them: ``auto`` (default: use when it builds, otherwise warn once
  with the compiler's message), ``on`` (a failed build is a :class:`NativeBuildError`) or ``off``.

:func:`build_library` is the one-shot step (raises on failure); :class:`NativeLibrary` adds the lazy,
thread-safe, mode-aware handle a kernel module keeps (``lib.get()`` -> CDLL or None, ``lib.status()``).
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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..tune.cache import cache_root

__all__ = [
    "BUILD_TIMEOUT_S",
    "ENV_MODE",
    "MODES",
    "PORTABLE_CFLAGS",
    "LibraryStatus",
    "NativeBuildError",
    "NativeBuildWarning",
    "NativeLibrary",
    "build_library",
    "library_file",
    "native_cache_dir",
    "native_mode",
]

ENV_MODE = "OPSTRATA_NATIVE"
MODES = ("auto", "on", "off")
BUILD_TIMEOUT_S = 120.0
#: flags for a library that runs on any CPU of this architecture (per-function ``target`` attributes
#: plus ``__builtin_cpu_supports`` choose vector code at run time); no -ffast-math
PORTABLE_CFLAGS = ("-O3", "-fPIC", "-shared", "-fno-math-errno", "-fno-trapping-math")

#: exported function -> (argument types, result type), as ctypes wants them
Signatures = Mapping[str, tuple[Sequence[Any], Any]]


class NativeBuildError(RuntimeError):
    """A native library could not be built or loaded (an error under ``OPSTRATA_NATIVE=on``)."""


class NativeBuildWarning(UserWarning):
    """``OPSTRATA_NATIVE=auto`` could not build a native library; the numpy kernels run instead."""


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


def compiler() -> list[str]:
    """The C compiler command: ``$CC`` split like a shell would, default ``cc``."""
    return shlex.split(os.environ.get("CC") or "cc")


def cpu_flags() -> str:
    """The CPU's feature line (``-march=native`` code is only valid on a CPU with the same features)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def compiler_version(cc: Sequence[str], what: str = "native kernels") -> str:
    """First line of ``cc --version``; a compiler that cannot run is a :class:`NativeBuildError`."""
    try:
        got = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as e:
        raise NativeBuildError(
            f"{what}: C compiler {shlex.join(cc)!r} cannot run ({e}). Fix: install one "
            f"(Debian/Ubuntu: apt-get install gcc), point CC at it, or set {ENV_MODE}=off"
        ) from e
    return (got.stdout or got.stderr).splitlines()[0] if (got.stdout or got.stderr) else ""


def library_file(
    name: str,
    source: Path,
    cflags: Sequence[str],
    cc: Sequence[str] | None = None,
    *,
    what: str = "native kernels",
) -> Path:
    """Where the library built from ``source`` with ``cflags`` by ``cc`` on this machine lives in the cache.

    The CPU's feature line is part of the key only for ``-march=native`` / ``-mcpu=native`` builds:
    a portable build is valid on any CPU of the architecture.
    """
    cc = compiler() if cc is None else list(cc)
    try:
        text = Path(source).read_text()
    except OSError as e:
        raise NativeBuildError(
            f"{what}: cannot read {source} ({e}); the install is incomplete: reinstall the package that "
            f"ships it, or set {ENV_MODE}=off"
        ) from e
    native = any(f.endswith("=native") for f in cflags)
    key = "\n".join(
        [
            text,
            shlex.join(cc),
            compiler_version(cc, what),
            " ".join(cflags),
            platform.machine(),
            cpu_flags() if native else "",
        ]
    )
    return native_cache_dir() / f"{name}-{hashlib.sha256(key.encode()).hexdigest()[:24]}.so"


def _compile(cc: Sequence[str], source: Path, cflags: Sequence[str], dest: Path, what: str) -> None:
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=dest.name + ".", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        cmd = [*cc, *cflags, str(source), "-o", tmp]
        try:
            got = subprocess.run(cmd, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired as e:
            raise NativeBuildError(
                f"{what}: {shlex.join(cmd)} did not finish within {BUILD_TIMEOUT_S:.0f}s; "
                f"set {ENV_MODE}=off to run the numpy kernels"
            ) from e
        if got.returncode != 0:
            raise NativeBuildError(
                f"{what}: {shlex.join(cmd)} failed (exit {got.returncode}):\n{got.stderr.strip()[-2000:]}\n"
                f"Fix: install a working C compiler or point CC at one, or set {ENV_MODE}=off"
            )
        os.replace(tmp, dest)  # atomic: a concurrent process sees the old file, none or the whole new one
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)


def _load(path: Path, signatures: Signatures, abi: tuple[str, int] | None) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    if abi is not None:
        fn = getattr(lib, abi[0])
        fn.argtypes, fn.restype = [], ctypes.c_int
        if fn() != abi[1]:
            raise OSError(f"ABI {fn()} != {abi[1]}")
    for fname, (argtypes, restype) in signatures.items():
        f = getattr(lib, fname)
        f.argtypes, f.restype = list(argtypes), restype
    return lib


def build_library(
    name: str,
    source: Path | str,
    signatures: Signatures,
    *,
    cflags: Sequence[str] = PORTABLE_CFLAGS,
    abi: tuple[str, int] | None = None,
    what: str | None = None,
) -> tuple[ctypes.CDLL, Path]:
    """Compile ``source`` (once per machine; cached) and load it; return the library and its file.

    ``signatures`` sets each exported function's ctypes ``argtypes`` / ``restype``; ``abi`` is an
    exported ``int f(void)`` and the value these bindings expect (a cached library answering otherwise
    is rebuilt). ``what`` names the library in errors. Ignores ``OPSTRATA_NATIVE`` (see
    :class:`NativeLibrary` for the mode-aware handle). Raises :class:`NativeBuildError` with the
    compiler's command and message when the build or the load fails.
    """
    what = what or f"native library {name!r}"
    source, cc = Path(source), compiler()
    path = library_file(name, source, cflags, cc, what=what)
    return _build_at(path, cc, source, signatures, cflags, abi, what), path


def _build_at(
    path: Path,
    cc: Sequence[str],
    source: Path,
    signatures: Signatures,
    cflags: Sequence[str],
    abi: tuple[str, int] | None,
    what: str,
) -> ctypes.CDLL:
    """Load the cached library at ``path``, (re)building it first when missing or unloadable."""
    if path.exists():
        try:
            return _load(path, signatures, abi)
        except (OSError, AttributeError):  # truncated, foreign or stale: rebuild it below
            with contextlib.suppress(OSError):
                path.unlink()
    _compile(cc, source, cflags, path, what)
    try:
        return _load(path, signatures, abi)
    except (OSError, AttributeError) as e:
        raise NativeBuildError(
            f"{what}: built {path} but cannot load it ({e}); remove the file or set {ENV_MODE}=off"
        ) from e


@dataclass
class LibraryStatus:
    """Where one :class:`NativeLibrary` stands: mode, loaded or not (None: not tried yet), file, why not."""

    mode: str
    available: bool | None
    library: str | None
    compiler: str | None
    reason: str


class NativeLibrary:
    """A native library built on first use, honouring ``OPSTRATA_NATIVE``; thread-safe.

    >>> lib = NativeLibrary("mylib", "mylib.c", {"f": ([ctypes.c_int], ctypes.c_int)})  # doctest: +SKIP
    >>> handle = lib.get()          # CDLL, or None when off / (auto) unbuildable   # doctest: +SKIP
    """

    def __init__(
        self,
        name: str,
        source: Path | str,
        signatures: Signatures,
        *,
        cflags: Sequence[str] = PORTABLE_CFLAGS,
        abi: tuple[str, int] | None = None,
        what: str | None = None,
    ) -> None:
        self.name, self.source, self.signatures = name, Path(source), dict(signatures)
        self.cflags, self.abi = tuple(cflags), abi
        self.what = what or f"native library {name!r}"
        self._lock = threading.Lock()
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        self._reason = ""
        self._path: str | None = None

    def path(self, cc: Sequence[str] | None = None) -> Path:
        """Where the library for this source, compiler, flags and machine lives in the cache."""
        return library_file(self.name, self.source, self.cflags, cc, what=self.what)

    def get(self, *, stacklevel: int = 3) -> ctypes.CDLL | None:
        """The loaded library, building it on the first call; None when off or (``auto``) unbuildable.

        Raises :class:`NativeBuildError` under ``OPSTRATA_NATIVE=on`` when the build fails; under
        ``auto`` a failed build warns once (:class:`NativeBuildWarning`) and is remembered.
        """
        if self._tried:
            return self._lib
        mode = native_mode()
        if mode == "off":
            return None  # not remembered: turning the variable back on takes effect at the next call
        with self._lock:
            if self._tried:
                return self._lib
            try:
                cc = compiler()
                path = library_file(self.name, self.source, self.cflags, cc, what=self.what)
                self._path = str(path)
                self._lib = _build_at(
                    path, cc, self.source, self.signatures, self.cflags, self.abi, self.what
                )
                self._reason = ""
            except NativeBuildError as e:
                if mode == "on":
                    raise
                self._reason = str(e)
                warnings.warn(
                    f"{e}\nThe numpy kernels run instead ({ENV_MODE}=auto).",
                    NativeBuildWarning,
                    stacklevel=stacklevel,
                )
            self._tried = True
        return self._lib

    def status(self, *, build: bool = False) -> LibraryStatus:
        """Mode, whether loaded (and where), why not. ``build=True`` tries the build first; a failure
        under ``OPSTRATA_NATIVE=on`` is then reported in ``reason`` instead of raised."""
        on_error = ""
        if build:
            try:
                self.get()
            except NativeBuildError as e:
                on_error = str(e)
        mode = native_mode()
        available: bool | None
        if mode == "off" or on_error:
            available = False
        else:
            available = (self._lib is not None) if self._tried else None
        reason = f"disabled by {ENV_MODE}=off" if mode == "off" else (on_error or self._reason)
        cc = None
        with contextlib.suppress(Exception):
            cc = shlex.join(compiler())
        return LibraryStatus(mode, available, self._path, cc, reason)
