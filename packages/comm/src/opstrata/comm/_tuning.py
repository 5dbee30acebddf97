"""Measured selection thresholds: the file ``opstrata-comm-tune`` writes and process groups read.

Layout: ``$OPSTRATA_CACHE_DIR/comm/thresholds-<sha256(fingerprint)[:16]>.json`` (default cache root
``$XDG_CACHE_HOME/opstrata`` or ``~/.cache/opstrata``, as ops' autotuner) holding ``{"format",
"fingerprint", "created", "rules": [{"backend", "collective", "world", "upto": [[max_bytes|null, algo]]}]}``.
The fingerprint is stored and compared on read: a corrupt file or one written on another machine is
ignored with a :class:`CommTuningWarning`, never used. Writes go to a temp file that is renamed over.
Rank 0 of each group reads the file and hands its table to the others through the store, so every rank
of a group (even across machines) selects the same algorithm.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import platform
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ._store import Store

FORMAT = "opstrata-comm-thresholds/1"
ENV_DIR = "OPSTRATA_CACHE_DIR"
log = logging.getLogger("opstrata.comm")


class CommTuningWarning(UserWarning):
    """The thresholds file is unreadable, corrupt or from another machine; the built-in table is used."""


def cache_dir() -> Path:
    """``$OPSTRATA_CACHE_DIR/comm``, default ``$XDG_CACHE_HOME/opstrata/comm`` or ``~/.cache/opstrata/comm``."""
    root = os.environ.get(ENV_DIR)
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
        root = str(Path(xdg) / "opstrata")
    return Path(root) / "comm"


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _memory_bytes() -> int:
    with contextlib.suppress(OSError, ValueError, AttributeError):
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return 0


def fingerprint() -> dict[str, Any]:
    """What makes collective timings machine-specific: CPU model, core count, memory, OS and arch."""
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "memory_gib": round(_memory_bytes() / (1 << 30)),
        "machine": platform.machine(),
        "system": platform.system(),
    }


def thresholds_path(fp: dict[str, Any] | None = None) -> Path:
    """Where this machine's thresholds live."""
    digest = hashlib.sha256(json.dumps(fp or fingerprint(), sort_keys=True).encode()).hexdigest()[:16]
    return cache_dir() / f"thresholds-{digest}.json"


@dataclass(frozen=True)
class Rule:
    """Measured winners of one (backend, collective, world): ``upto`` is [(max bytes or None, algorithm)]."""

    backend: str
    collective: str
    world: int
    upto: tuple[tuple[int | None, str], ...]


class TunedTable:
    """The measured rules of one machine (empty when nothing was tuned)."""

    def __init__(self, rules: list[Rule], source: str = "") -> None:
        self.rules, self.source = rules, source

    def __bool__(self) -> bool:
        return bool(self.rules)

    def to_json(self) -> str:
        """The rules as JSON (what rank 0 hands to the group)."""
        return json.dumps(
            {
                "source": self.source,
                "rules": [
                    {"backend": r.backend, "collective": r.collective, "world": r.world, "upto": r.upto}
                    for r in self.rules
                ],
            }
        )

    @classmethod
    def from_json(cls, text: str) -> TunedTable:
        """Parse :meth:`to_json` output or a thresholds file's body (raises ValueError/KeyError/TypeError)."""
        data = json.loads(text)
        rules = []
        for r in data["rules"]:
            upto = tuple((None if b is None else int(b), str(a)) for b, a in r["upto"])
            if not upto or upto[-1][0] is not None:
                raise ValueError(f"rule {r} must end with an unbounded [null, algorithm] entry")
            rules.append(Rule(str(r["backend"]), str(r["collective"]), int(r["world"]), upto))
        return cls(rules, str(data.get("source", "")))

    def lookup(self, collective: str, nbytes: int, world: int, backend: str) -> tuple[str, str] | None:
        """(algorithm, reason) from the rule measured at the nearest world size, or None."""
        cands = [r for r in self.rules if r.backend == backend and r.collective == collective]
        if not cands:
            return None
        pow2 = world & (world - 1) == 0
        rule = min(
            cands, key=lambda r: (abs(r.world - world), (r.world & (r.world - 1) == 0) != pow2, r.world)
        )
        for bound, algo in rule.upto:
            if bound is None or nbytes <= bound:
                span = "and above" if bound is None else f"up to {bound} B"
                return algo, (
                    f"tuned on this machine ({self.source}): fastest over {backend} at world {rule.world} "
                    f"for {span} ({nbytes} B, world {world})"
                )
        return None


def _warn(path: Path, why: str) -> TunedTable:
    msg = (
        f"opstrata.comm: ignoring thresholds file {path}: {why}; using the built-in table. "
        "Re-run `opstrata-comm-tune` on this machine to measure new thresholds"
    )
    warnings.warn(msg, CommTuningWarning, stacklevel=3)
    log.warning(msg)
    return TunedTable([])


def load(path: Path | None = None) -> TunedTable:
    """This machine's tuned table; empty (with a warning) when the file is corrupt or foreign."""
    fp = fingerprint()
    path = path or thresholds_path(fp)
    try:
        text = path.read_text()
    except FileNotFoundError:
        return TunedTable([])
    except OSError as e:
        return _warn(path, f"unreadable ({e})")
    try:
        data = json.loads(text)
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            return _warn(path, f"not an {FORMAT} file")
        if data.get("fingerprint") != fp:
            return _warn(path, f"foreign: measured on another machine ({data.get('fingerprint')} != {fp})")
        table = TunedTable.from_json(json.dumps({"rules": data["rules"], "source": str(path)}))
    except (ValueError, KeyError, TypeError) as e:
        return _warn(path, f"corrupt ({type(e).__name__}: {e})")
    return table


def save(rules: list[Rule], path: Path | None = None, *, extra: dict[str, Any] | None = None) -> Path:
    """Write the thresholds file atomically (temp file in the same directory, then rename)."""
    fp = fingerprint()
    path = path or thresholds_path(fp)
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {
        "format": FORMAT,
        "fingerprint": fp,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "rules": [
            {
                "backend": r.backend,
                "collective": r.collective,
                "world": r.world,
                "upto": [list(u) for u in r.upto],
            }
            for r in rules
        ],
        **(extra or {}),
    }
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(body, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return path


def shared_table(store: Store, rank: int, timeout: float, what: str) -> TunedTable:
    """Rank 0 loads the machine's table and publishes it; every rank returns rank 0's table."""
    if rank == 0:
        table = load()
        store.set("comm_thresholds", table.to_json().encode())
        return table
    raw = store.get("comm_thresholds", timeout, what=what)
    return TunedTable.from_json(raw.decode())
