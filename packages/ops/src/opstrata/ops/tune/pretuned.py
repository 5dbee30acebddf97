"""Pre-tuned parameters shipped with the package (``autotune_pretuned.json``) for a few common shapes.

Deterministic autotune mode answers from this table (then from the declared defaults): the file
is package data, so the answer is the same on every machine and never timed. Entries are keyed by
the machine-independent part of an autotune key (op, device, kernel version, argument shapes,
dtypes and attributes); an entry for an older kernel version simply never matches. Regenerate with
``python packages/ops/benchmarks/bench_autotune.py --write-pretuned``.
"""

from __future__ import annotations

import functools
import json
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from .._atomic import atomic_write

FORMAT = "opstrata-autotune-pretuned/1"
PATH = Path(__file__).with_name("pretuned.json")


def _text(key: Mapping[str, Any]) -> str:
    return json.dumps(dict(key), sort_keys=True)


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, dict[str, Any]]:
    """``{key text: params}`` from the shipped file; {} (with a warning) if it is missing or damaged."""
    try:
        data = json.loads(PATH.read_text())
        if data.get("format") != FORMAT:
            raise ValueError(f"format {data.get('format')!r}, expected {FORMAT!r}")
        return {_text(e["key"]): dict(e["params"]) for e in data["entries"]}
    except FileNotFoundError:
        return {}
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        from .cache import AutotuneCacheWarning

        warnings.warn(
            f"pre-tuned autotune table {PATH} is damaged ({e}); deterministic mode uses declared defaults. "
            "Fix: reinstall opstrata-ops",
            AutotuneCacheWarning,
            stacklevel=2,
        )
        return {}


@functools.cache
def has_pretuned(op: str) -> bool:
    """True if the table has any entry for ``op`` (spares computing keys for the other ops)."""
    return any(json.loads(k)["op"] == op for k in _table())


def pretuned(key: Mapping[str, Any]) -> dict[str, Any] | None:
    """The shipped parameters for a machine-independent key, or None."""
    found = _table().get(_text(key))
    return None if found is None else dict(found)


def write_pretuned(entries: Iterable[tuple[Mapping[str, Any], Mapping[str, Any]]], note: str) -> Path:
    """Write ``(key, params)`` pairs as the shipped table (atomically) and forget the loaded one."""
    data = {
        "format": FORMAT,
        "note": note,
        "entries": [{"key": dict(k), "params": dict(p)} for k, p in entries],
    }
    atomic_write(PATH, json.dumps(data, indent=1, sort_keys=True) + "\n")
    _table.cache_clear()
    has_pretuned.cache_clear()
    return PATH
