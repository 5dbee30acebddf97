"""The autotune cache on disk: one JSON file per key, merged under a lock file, replaced atomically.

Layout: ``$OPSTRATA_CACHE_DIR/autotune/<op>/<sha256(key)[:32]>.json`` holding ``{"format", "key",
"candidates": [{"params", "median_s", "samples_s"}]}``. The full key is stored and compared on
read, so a hash collision or a file copied from elsewhere is "foreign", never used. Writers take
``<file>.lock`` (``O_CREAT | O_EXCL``, portable), re-read and merge so a concurrent tuner's
candidates survive, write a temp file in the same directory and ``os.replace`` it.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import time
import warnings
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from .._atomic import atomic_write

__all__ = ["AutotuneCacheWarning", "autotune_cache_dir", "entry_path", "read_entry", "write_entry"]

FORMAT = "opstrata-autotune/1"
ENV_DIR = "OPSTRATA_CACHE_DIR"
LOCK_TIMEOUT_S = 30.0  # waiting longer than this for the lock file is an error, never a hang
LOCK_STALE_S = 10.0  # a lock older than this was left by a crashed process: removed with a warning


class AutotuneCacheWarning(UserWarning):
    """A cache file was unreadable, foreign or locked by a dead process; it is ignored and rebuilt."""


def cache_root() -> Path:
    """``$OPSTRATA_CACHE_DIR``, default ``$XDG_CACHE_HOME/opstrata`` or ``~/.cache/opstrata`` (autotune
    results and the native kernel library live in subdirectories)."""
    root = os.environ.get(ENV_DIR)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "opstrata")
    return Path(root)


def autotune_cache_dir() -> Path:
    """``$OPSTRATA_CACHE_DIR/autotune``, default ``$XDG_CACHE_HOME/opstrata`` or ``~/.cache/opstrata``."""
    return cache_root() / "autotune"


def entry_path(key_text: str, op: str) -> Path:
    digest = hashlib.sha256(key_text.encode()).hexdigest()[:32]
    return autotune_cache_dir() / re.sub(r"[^A-Za-z0-9_.-]", "_", op) / f"{digest}.json"


# --------------------------------------------------------------------------- the cache file


def read_entry(path: Path, key: dict[str, Any], *, warn: bool = True) -> dict[str, dict[str, Any]]:
    """Candidate timings of the entry at ``path`` (``{cid: record}``); {} if absent, corrupted or foreign."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as e:
        return _ignored(path, f"unreadable ({e})", warn)
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return _ignored(path, f"not an {FORMAT} file", warn)
        if data.get("key") != key:
            return _ignored(path, "foreign: written for another key (op, version, shapes or machine)", warn)
        out = {}
        for rec in data["candidates"]:
            out[json.dumps(rec["params"], sort_keys=True)] = {
                "params": dict(rec["params"]),
                "median_s": float(rec["median_s"]),
                "samples_s": [float(s) for s in rec["samples_s"]],
            }
        return out
    except (ValueError, KeyError, TypeError) as e:
        return _ignored(path, f"corrupted ({type(e).__name__}: {e})", warn)


def _ignored(path: Path, why: str, warn: bool) -> dict[str, dict[str, Any]]:
    if warn:
        warnings.warn(
            f"autotune cache file {path} is {why}; ignoring it and rebuilding the entry",
            AutotuneCacheWarning,
            stacklevel=4,
        )
    return {}


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """Hold ``<path>.lock`` (O_EXCL create; portable); a lock older than LOCK_STALE_S is broken."""
    lock = path.with_name(path.name + ".lock")
    deadline = time.monotonic() + LOCK_TIMEOUT_S
    while True:
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            break
        except FileExistsError:
            with contextlib.suppress(OSError):
                if time.time() - lock.stat().st_mtime > LOCK_STALE_S:
                    warnings.warn(f"removing stale autotune lock {lock}", AutotuneCacheWarning, stacklevel=4)
                    lock.unlink()
                    continue
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"autotune: waited {LOCK_TIMEOUT_S:.0f} s for lock file {lock}. "
                    "Fix: if no other opstrata process is tuning, delete that file"
                ) from None
            time.sleep(0.005)
    try:
        os.write(fd, str(os.getpid()).encode())
        os.close(fd)
        yield
    finally:
        with contextlib.suppress(OSError):
            lock.unlink()


def write_entry(path: Path, key: dict[str, Any], new: Mapping[str, dict[str, Any]]) -> None:
    """Merge ``new`` timings into the entry at ``path`` under its lock; atomic replace."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with _locked(path):
        records = read_entry(path, key, warn=False)  # the other process's candidates survive
        records.update(new)
        data = {"format": FORMAT, "key": key, "candidates": list(records.values())}
        atomic_write(path, json.dumps(data, indent=1, sort_keys=True))
