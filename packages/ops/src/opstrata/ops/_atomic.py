"""Atomic file writes shared by every package: a temp file in the destination's directory, then a rename.

A reader never sees a half-written file, a crash leaves the old one in place, and the temp file is
removed when writing fails. The result gets the permissions ``open()`` would give (0666 minus the
umask): ``tempfile.mkstemp`` creates files readable by their owner only.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_write"]

_UMASK_LOCK = threading.Lock()


def _umask() -> int:
    with _UMASK_LOCK:  # os.umask only sets: read it by setting it back at once
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def atomic_write(
    path: str | os.PathLike[str], data: bytes | str | Callable[[IO[bytes]], Any], *, fsync: bool = False
) -> Path:
    """Write ``data`` (bytes, text as UTF-8, or a function writing to the open binary file) to ``path``
    atomically; ``fsync`` flushes it to disk before the rename. Returns the path.

    >>> import tempfile, pathlib
    >>> d = pathlib.Path(tempfile.mkdtemp())
    >>> atomic_write(d / "a.txt", "hi").read_text()
    'hi'
    """
    p = Path(path)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode("utf-8") if isinstance(data, str) else data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, p)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return p
