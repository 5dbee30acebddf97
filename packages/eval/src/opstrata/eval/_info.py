"""`opstrata info`: installed opstrata versions and ranges, versions.lock agreement, Python/numpy/BLAS, cache dir,
whether the ops native kernel library builds.

The report is one JSON-able dict (`collect`) rendered as text (`format_text`) or JSON (`--json`), so
bug reports and CI logs carry the same facts.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import sys
from collections.abc import Callable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

import tomlkit
from packaging.version import InvalidVersion, Version
from tomlkit.exceptions import TOMLKitError

from opstrata.ops.compat import UNKNOWN_VERSION, opstrata_requirements

__all__ = [
    "LAYERS",
    "add_arguments",
    "cache_dir",
    "collect",
    "find_lock",
    "format_text",
    "own_version",
    "run",
]

#: The six packages, bottom to top.
LAYERS = ("ops", "graph", "runtime", "comm", "quant", "eval")
LOCK_NAME = "versions.lock"


def own_version() -> str:
    """The installed opstrata-eval version, or UNKNOWN_VERSION when running from a source tree."""
    try:
        return metadata.version("opstrata-eval")
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION


def installed_packages(
    version_of: Callable[[str], str] = metadata.version,
    requires_of: Callable[[str], list[str] | None] = metadata.requires,
) -> list[dict[str, Any]]:
    """Each opstrata package: installed version (None if absent), declared ranges, and unmet ranges."""
    versions: dict[str, str | None] = {}
    for name in LAYERS:
        try:
            versions[f"opstrata-{name}"] = version_of(f"opstrata-{name}")
        except metadata.PackageNotFoundError:
            versions[f"opstrata-{name}"] = None
    rows = []
    for name in LAYERS:
        dist = f"opstrata-{name}"
        row: dict[str, Any] = {"name": name, "distribution": dist, "version": versions[dist], "requires": {}}
        if versions[dist] is None:
            row["importable"] = importlib.util.find_spec(f"opstrata.{name}") is not None
        problems: list[str] = []
        if versions[dist] is not None:
            for req in opstrata_requirements(dist, requires_of(dist) or []):
                row["requires"][req.name] = str(req.specifier)
                found = versions.get(req.name)
                if found is None:
                    problems.append(f"requires {req.name}{req.specifier}, but it is not installed")
                elif not _satisfies(found, req.specifier):
                    problems.append(
                        f"requires {req.name}{req.specifier}, but {req.name} {found} is installed"
                    )
        row["problems"] = [
            f"{p}; fix: pip install '{dist}=={versions[dist]}' with matching lower packages" for p in problems
        ]
        rows.append(row)
    return rows


def _satisfies(version: str, specifier: Any) -> bool:
    """True if `version` is a valid PEP 440 version inside `specifier` (pre-releases admitted)."""
    try:
        return specifier.contains(Version(version), prereleases=True)
    except InvalidVersion:
        return False


def find_lock(start: Path) -> Path | None:
    """versions.lock in `start` or the nearest directory above it, or None outside a checkout."""
    for directory in (start, *start.parents):
        candidate = directory / LOCK_NAME
        if candidate.is_file():
            return candidate
    return None


def compare_lock(lock_path: Path | None, packages: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether the installed versions equal the versions.lock ones: status match | mismatch | not in a checkout | unreadable."""
    if lock_path is None:
        return {"path": None, "status": "not in a checkout", "problems": []}
    fix = "restore it from git or rewrite it with `python tools/lock.py sync`"
    try:
        doc = tomlkit.parse(lock_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, TOMLKitError) as exc:
        problem = f"{lock_path}: expected a TOML versions.lock, could not read it ({exc}); {fix}"
        return {"path": str(lock_path), "status": "unreadable", "problems": [problem]}
    table = doc.get("packages")
    if not isinstance(table, Mapping):
        problem = (
            f"{lock_path}: key 'packages': expected a table of [packages.<name>], found {table!r}; {fix}"
        )
        return {"path": str(lock_path), "status": "unreadable", "problems": [problem]}
    problems = []
    compared = [row for row in packages if row["version"] is not None]
    if not compared:
        return {"path": str(lock_path), "status": "no installed opstrata package to compare", "problems": []}
    for row in compared:
        entry = table.get(row["name"])
        locked = entry.get("version") if isinstance(entry, Mapping) else None
        if not isinstance(locked, str):
            problems.append(
                f"{lock_path}: key 'packages.{row['name']}.version': expected a version string, found {locked!r}; {fix}"
            )
        elif locked != row["version"]:
            problems.append(
                f"{row['distribution']}: installed {row['version']}, {LOCK_NAME} says {locked}; "
                f"fix: reinstall from this checkout (pip install ./{entry.get('path', 'packages/' + row['name'])})"
            )
    return {"path": str(lock_path), "status": "mismatch" if problems else "match", "problems": problems}


def cache_dir(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The opstrata cache directory and where it came from: OPSTRATA_CACHE_DIR, XDG_CACHE_HOME or ~/.cache."""
    if environ.get("OPSTRATA_CACHE_DIR"):
        return {"path": str(Path(environ["OPSTRATA_CACHE_DIR"]).expanduser()), "source": "OPSTRATA_CACHE_DIR"}
    if environ.get("XDG_CACHE_HOME"):
        return {
            "path": str(Path(environ["XDG_CACHE_HOME"]).expanduser() / "opstrata"),
            "source": "XDG_CACHE_HOME",
        }
    return {"path": str(Path.home() / ".cache" / "opstrata"), "source": "default"}


def platform_info() -> dict[str, Any]:
    """Python, numpy and the BLAS/OpenMP thread pools numpy loaded (threadpoolctl)."""
    import numpy as np  # imported first so its BLAS is loaded when threadpoolctl looks
    from threadpoolctl import threadpool_info

    pools = [
        {
            k: pool.get(k)
            for k in (
                "user_api",
                "internal_api",
                "version",
                "num_threads",
                "threading_layer",
                "architecture",
                "filepath",
            )
        }
        for pool in threadpool_info()
    ]
    return {
        "python": {
            "version": platform.python_version(),
            "implementation": platform.python_implementation(),
            "executable": sys.executable,
        },
        "platform": platform.platform(),
        "numpy": {"version": np.__version__},
        "threadpools": pools,
    }


def native_info() -> dict[str, Any]:
    """opstrata-ops' native kernel library, built or loaded now so the report says whether it works."""
    unavailable = {"mode": None, "available": False, "library": None, "compiler": None}
    import opstrata.ops as ops

    if not hasattr(ops, "native_status"):  # an opstrata-ops before 0.3.2: numpy kernels only
        return {**unavailable, "reason": "this opstrata-ops has no native kernels (added in 0.3.2)"}
    try:
        status = ops.native_status(build=True)
    except Exception as e:  # an unknown OPSTRATA_NATIVE value, a broken install: reported, not raised
        return {**unavailable, "reason": str(e)}
    return {k: getattr(status, k) for k in ("mode", "available", "library", "compiler", "reason")}


def devices_info() -> list[dict[str, Any]]:
    """Every device opstrata-ops knows of, usable or not, with the reason an absent one (cuda) is absent."""
    import opstrata.ops as ops

    if not hasattr(ops, "device_status"):  # an opstrata-ops before 0.4.67: cpu and ref only, no probes
        return [{"name": d, "available": True, "reason": "", "memory": "host"} for d in ops.list_devices()]
    try:
        rows = ops.device_status()
    except Exception as e:  # a device plugin that fails to load: reported, not raised
        return [{"name": "?", "available": False, "reason": str(e), "memory": ""}]
    return [{"name": r.name, "available": r.available, "reason": r.reason, "memory": r.memory} for r in rows]


def session_threads() -> dict[str, Any]:
    """The intra-op / inter-op threads an InferenceSession would use now (runtime's ``thread_info``)."""
    import opstrata.runtime as rt

    if not hasattr(rt, "thread_info"):  # an opstrata-runtime before 0.5.2: BLAS decides on its own
        return {"available": False, "reason": "this opstrata-runtime sets no thread counts (added in 0.5.2)"}
    try:
        return {"available": True, **rt.thread_info()}
    except Exception as e:  # a bad OPSTRATA_NUM_THREADS: reported, not raised
        return {"available": False, "reason": str(e)}


def collect(cwd: Path | None = None, environ: Mapping[str, str] = os.environ) -> dict[str, Any]:
    """The whole `opstrata info` report as a JSON-able dict; `ok` is False on any unmet range or lock mismatch."""
    packages = installed_packages()
    lock = compare_lock(find_lock((cwd or Path.cwd()).resolve()), packages)
    ok = not any(row["problems"] for row in packages) and not lock["problems"]
    return {
        "ok": ok,
        "packages": packages,
        "lock": lock,
        **platform_info(),
        "cache_dir": cache_dir(environ),
        "native": native_info(),
        "devices": devices_info(),
        "session_threads": session_threads(),
    }


def format_text(info: Mapping[str, Any]) -> str:
    """Human-readable rendering of a `collect()` report."""
    lines = ["opstrata packages:"]
    for row in info["packages"]:
        ranges = ", ".join(f"{k}{v}" for k, v in row["requires"].items()) or "no opstrata dependencies"
        state = "ranges ok" if not row["problems"] else "RANGE NOT MET"
        if row["version"] is None:
            note = " (importable from a source tree, no metadata)" if row.get("importable") else ""
            lines.append(f"  {row['distribution']:<18} not installed{note}")
            continue
        lines.append(f"  {row['distribution']:<18} {row['version']:<10} {state:<13} ({ranges})")
        lines += [f"      ! {p}" for p in row["problems"]]
    lock = info["lock"]
    where = f" ({lock['path']})" if lock["path"] else ""
    lines.append(f"versions.lock: {lock['status']}{where}")
    lines += [f"      ! {p}" for p in lock["problems"]]
    py = info["python"]
    lines.append(f"python: {py['implementation']} {py['version']} ({py['executable']})")
    lines.append(f"platform: {info['platform']}")
    lines.append(f"numpy: {info['numpy']['version']}")
    for pool in info["threadpools"] or [
        {"user_api": "none found", "internal_api": "", "version": "", "num_threads": ""}
    ]:
        lines.append(
            f"  {pool['user_api']}: {pool['internal_api']} {pool.get('version') or ''} "
            f"threads={pool['num_threads']} {pool.get('architecture') or ''}".rstrip()
        )
    lines.append(f"cache dir: {info['cache_dir']['path']} (from {info['cache_dir']['source']})")
    nat = info["native"]
    if nat["available"]:
        lines.append(
            f"native kernels: on ({nat['library']}, built by {nat['compiler']}; OPSTRATA_NATIVE={nat['mode']})"
        )
    else:
        lines.append(f"native kernels: off, numpy kernels run ({nat['reason']})")
    for dev in info.get("devices", []):
        if dev["available"]:
            lines.append(f"device {dev['name']}: available (arrays in {dev['memory']} memory)")
        else:
            lines.append(f"device {dev['name']}: not available: {dev['reason']}")
    th = info.get("session_threads") or {"available": False, "reason": "not collected"}
    if th["available"]:
        lines.append(
            f"session threads: intra-op {th['intra_op_num_threads']} ({th['intra_op_source']}), inter-op "
            f"{th['inter_op_num_threads']}, physical cores {th['physical_cores']}; GEMMs under "
            f"{th['gemm_single_thread_below_flops']:,} FLOPs run on one thread"
        )
    else:
        lines.append(f"session threads: {th['reason']}")
    lines.append("status: ok" if info["ok"] else "status: PROBLEMS FOUND (see the lines marked !)")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """`opstrata info` options."""
    parser.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args: argparse.Namespace) -> int:
    """Print the report; exit 1 when a range is unmet or the checkout's versions.lock disagrees."""
    info = collect()
    print(json.dumps(info, indent=2) if args.json else format_text(info))
    return 0 if info["ok"] else 1
