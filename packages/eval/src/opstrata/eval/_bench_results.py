"""Benchmark results on disk: JSON with a schema version and the machine fingerprint they were measured on.

A results file is ``{"schema": 1, "name", "suite", "created", "fingerprint": {...}, "results": {bench:
{"samples": [seconds, ...], ...}}}``; a corrupt file or one of another schema is a clear error naming it.
A benchmark's entry may carry more fields beside ``samples`` (``peer_of``, ``threads``, ``bytes``,
``ranks``, ...): they come back in ``Results.meta``; files without them (older runs) load unchanged.
"""

from __future__ import annotations

import json
import os
import platform
import re
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any

import opstrata.ops as ops

__all__ = ["SCHEMA", "Results", "ResultsError", "fingerprint", "fingerprint_diff", "load", "save"]

SCHEMA = 1
_PACKAGES = ("opstrata-ops", "opstrata-graph", "opstrata-runtime", "opstrata-comm", "opstrata-quant",
             "opstrata-eval", "numpy", "onnxruntime", "torch")  # fmt: skip


class ResultsError(ValueError):
    """A results file that cannot be used (missing, corrupt, another schema, a bad name)."""


@dataclass(frozen=True)
class Results:
    """One saved benchmark run."""

    name: str
    suite: str
    created: str
    fingerprint: dict[str, Any]
    results: dict[str, list[float]]  # bench name -> seconds per call, one per round
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)  # bench name -> its extra fields


def _cpu() -> tuple[str, str]:
    """(CPU model, a short digest of its flags) from /proc/cpuinfo, else platform.processor()."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.processor() or platform.machine(), ""
    model = re.search(r"^model name\s*:\s*(.+)$", text, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", text, re.M)
    wanted = ("avx2", "avx512f", "fma", "sse4_2", "neon", "asimd", "amx_tile")
    have = sorted(f for f in (flags.group(1).split() if flags else []) if f in wanted)
    return (model.group(1).strip() if model else platform.machine()), " ".join(have)


def fingerprint() -> dict[str, Any]:
    """What a timing depends on: CPU model and flags, cores, BLAS, Python and package versions."""
    model, flags = _cpu()
    blas = ""
    try:
        from threadpoolctl import threadpool_info

        blas = "; ".join(f"{i.get('internal_api')} {i.get('version')} threads={i.get('num_threads')}"
                         for i in threadpool_info() if i.get("user_api") == "blas")  # fmt: skip
    except Exception:  # threadpoolctl missing or failing: the fingerprint just says less
        blas = "unknown"
    versions = {}
    for dist in _PACKAGES:
        try:
            versions[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            versions[dist] = None
    return {"cpu": model, "cpu_flags": flags, "cores": os.cpu_count(), "blas": blas,
            "python": platform.python_version(), "versions": versions}  # fmt: skip


def fingerprint_diff(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Human lines for each fingerprint entry that differs (package versions one by one)."""
    out = []
    for key in sorted(set(a) | set(b)):
        if key == "versions":
            va, vb = a.get(key) or {}, b.get(key) or {}
            out += [
                f"{d}: {va.get(d)} vs {vb.get(d)}"
                for d in sorted(set(va) | set(vb))
                if va.get(d) != vb.get(d)
            ]
        elif a.get(key) != b.get(key):
            out.append(f"{key}: {a.get(key)!r} vs {b.get(key)!r}")
    return out


def _path(directory: Path, name: str) -> Path:
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise ResultsError(
            f"results name {name!r}: use letters, digits, '_', '.', '-' (it becomes a file name)"
        )
    return directory / f"{name}.json"


def save(
    directory: Path, name: str, suite: str, results: dict[str, list[float]],
    meta: dict[str, dict[str, Any]] | None = None,
) -> Path:  # fmt: skip
    """Write the run as ``directory/name.json`` atomically; returns the path.

    ``meta`` adds JSON-serialisable fields beside each benchmark's samples (not ``samples`` itself).
    """
    path = _path(directory, name)
    meta = meta or {}
    clash = sorted(k for k, extra in meta.items() if "samples" in extra)
    if clash:
        raise ResultsError(
            f"save: extra fields of {clash} may not be named 'samples' (that key holds the timings)"
        )
    entries = {k: {**meta.get(k, {}), "samples": [float(x) for x in v]} for k, v in results.items()}
    doc = {"schema": SCHEMA, "name": name, "suite": suite, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "fingerprint": fingerprint(), "results": entries}  # fmt: skip
    text = json.dumps(doc, indent=1)  # before any file exists: a value JSON cannot hold fails here
    directory.mkdir(parents=True, exist_ok=True)
    return ops.atomic_write(path, text)


def load(directory: Path, name: str) -> Results:
    """The saved run ``name``; ResultsError naming the file, the problem and the fix otherwise."""
    path = _path(directory, name)
    if not path.is_file():
        saved = sorted(p.stem for p in directory.glob("*.json")) if directory.is_dir() else []
        raise ResultsError(f"no saved results '{name}' in {directory} (saved: {saved or 'none'}); "
                           f"create it with `opstrata bench SUITE --save {name}`")  # fmt: skip
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ResultsError(
            f"results file {path} is corrupt ({exc}); delete it and save the run again"
        ) from None
    schema = doc.get("schema") if isinstance(doc, dict) else None
    if schema != SCHEMA:
        raise ResultsError(f"results file {path} has schema {schema!r}, this opstrata-eval reads schema {SCHEMA}; "
                           "save the baseline again with this version")  # fmt: skip
    try:
        results = {k: [float(x) for x in v["samples"]] for k, v in doc["results"].items()}
        meta = {k: {f: x for f, x in v.items() if f != "samples"} for k, v in doc["results"].items()}
        return Results(
            str(doc["name"]), str(doc["suite"]), str(doc["created"]), dict(doc["fingerprint"]), results, meta
        )
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ResultsError(
            f"results file {path} is corrupt (missing or bad field: {exc}); delete it and save the run again"
        ) from None
