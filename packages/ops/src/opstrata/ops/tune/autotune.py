"""Autotuner: kernels declare tunable parameters; the best candidate per shape is timed once and cached.

A kernel declares its knobs beside its definition (the TVM/Triton ``autotune`` idea, kept small)::

    ATTN = Tunable(op="attention", device="cpu", version="1",
                   params={"block_q": [None, 64, 128]}, default={"block_q": None})

    @register("attention", device="cpu")
    @autotuned(ATTN)
    def attention_cpu(q, k, v, *, block_q=None, ...): ...

Modes (``OPSTRATA_AUTOTUNE`` or :func:`autotune`): ``off`` (default: the kernel's own defaults, no
look-up), ``on`` (``1``: look up the cache, time the missing candidates on the actual arguments),
``deterministic`` (never timed, never read from the cache: the pre-tuned parameters the package
ships for a few common shapes, identical on every machine, else the declared defaults). A caller passing a
tunable keyword explicitly always wins.

Cache: one JSON file per key under ``$OPSTRATA_CACHE_DIR/autotune/<op>/`` (default
``$XDG_CACHE_HOME/opstrata`` or ``~/.cache/opstrata``). The key holds op, device, kernel version,
argument shapes/dtypes/attributes and the device fingerprint (CPU model, cores, BLAS vendor and
threads, numpy version), so another machine's or an older kernel's entry is never used. An entry
keeps every candidate's median, so a newly declared candidate is the only one timed. Writes merge
under a lock file and land by ``os.replace``; a corrupted or foreign file is ignored with an
:class:`AutotuneCacheWarning` and rebuilt.
Keys are exact shapes (as ``torch.backends.cudnn.benchmark``): meant for static shapes, not for a
decode loop whose sequence length grows every step.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import os
import platform
import random
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from .cache import (
    AutotuneCacheWarning,
    autotune_cache_dir,
    entry_path,
    read_entry,
    write_entry,
)
from .pretuned import has_pretuned, pretuned

__all__ = [
    "AutotuneCacheWarning",
    "AutotuneStats",
    "Tunable",
    "TuneResult",
    "autotune",
    "autotune_cache_dir",
    "autotune_stats",
    "autotuned",
    "clear_autotune_cache",
    "device_fingerprint",
    "reset_autotune_stats",
    "tunables",
    "tune",
]

MODES = ("off", "on", "deterministic")
ENV_MODE = "OPSTRATA_AUTOTUNE"
F = TypeVar("F", bound=Callable[..., Any])
_JSON_SCALARS = (type(None), bool, int, float, str)


@dataclass(frozen=True)
class Tunable:
    """The tunable parameters of one kernel: candidate values per parameter and the defaults.

    ``version`` names the kernel's implementation: bump it when the kernel changes so old timings
    are not reused. Candidates are the cartesian product of ``params``; values must be JSON scalars.
    """

    op: str
    device: str
    version: str
    params: Mapping[str, Sequence[Any]]
    default: Mapping[str, Any]
    repeats: int = 5  # timed runs per candidate (interleaved, shuffled each round; medians)
    min_gain: float = 0.05  # keep the default unless a candidate is at least this much faster (noise)

    def __post_init__(self) -> None:
        where = f"Tunable(op={self.op!r}, device={self.device!r})"
        if set(self.default) != set(self.params):
            raise ValueError(
                f"{where}: default keys {sorted(self.default)} must equal params keys {sorted(self.params)}"
            )
        for name, values in self.params.items():
            if not values or not all(isinstance(v, _JSON_SCALARS) for v in values):
                raise ValueError(
                    f"{where}: params[{name!r}] must be a non-empty list of JSON scalars, got {values!r}"
                )

    def candidates(self) -> list[dict[str, Any]]:
        """Every combination of parameter values, in declaration order."""
        names = list(self.params)
        return [dict(zip(names, combo, strict=True)) for combo in itertools.product(*self.params.values())]


@dataclass(frozen=True)
class TuneResult:
    """The chosen parameters and every candidate's median time (seconds) for one key."""

    op: str
    params: dict[str, Any]
    timings: dict[str, float]  # candidate (JSON of its params) -> median seconds
    timed: tuple[str, ...] = ()  # candidates timed by this call (empty: a cache hit)
    path: str = ""  # the cache file


@dataclass(frozen=True)
class AutotuneStats:
    """Counters since the last :func:`reset_autotune_stats` (this process)."""

    hits: int  # answered from memory or disk without timing
    misses: int  # needed at least one candidate timed
    candidates_timed: int
    tuning_seconds: float  # wall time spent timing candidates
    deterministic: int  # calls answered with defaults by deterministic mode


@dataclass
class _State:
    mode: str | None = None  # set by autotune(); None: read OPSTRATA_AUTOTUNE
    tunables: dict[tuple[str, str], tuple[Tunable, Callable[..., Any]]] = field(default_factory=dict)
    memory: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)
    counts: dict[str, float] = field(default_factory=dict)


_STATE = _State()


def _count(name: str, by: float = 1) -> None:
    _STATE.counts[name] = _STATE.counts.get(name, 0) + by


def autotune_stats() -> AutotuneStats:
    """Hits, misses, candidates timed and seconds spent tuning in this process."""
    c = _STATE.counts
    return AutotuneStats(
        int(c.get("hits", 0)),
        int(c.get("misses", 0)),
        int(c.get("timed", 0)),
        float(c.get("seconds", 0.0)),
        int(c.get("deterministic", 0)),
    )


def reset_autotune_stats() -> None:
    """Zero the counters of :func:`autotune_stats`."""
    _STATE.counts.clear()


# --------------------------------------------------------------------------- mode


def _parse_mode(value: Any, source: str) -> str:
    text = str(value).strip().lower()
    if value is True or text in ("1", "on", "true", "yes"):
        return "on"
    if value is False or text in ("", "0", "off", "false", "no"):
        return "off"
    if text == "deterministic":
        return "deterministic"
    raise ValueError(
        f"{source}: expected one of 0/off, 1/on, deterministic, got {value!r}. "
        f"Fix: set {ENV_MODE}=1 to tune, {ENV_MODE}=deterministic for defaults, or unset it"
    )


def current_mode() -> str:
    """``off``, ``on`` or ``deterministic``: :func:`autotune`'s setting, else ``OPSTRATA_AUTOTUNE``."""
    if _STATE.mode is not None:
        return _STATE.mode
    return _parse_mode(os.environ.get(ENV_MODE, ""), f"environment variable {ENV_MODE}")


class autotune(contextlib.AbstractContextManager):
    """Set the autotune mode for the process (``True``, ``False``, ``"deterministic"``, or None for the env).

    Takes effect at once; used as a context manager it restores the previous mode on exit::

        with ops.autotune(True):
            ops.attention(q, k, v, causal=True)   # tuned on first use of this shape, then cached
    """

    def __init__(self, enabled: bool | str | None = True) -> None:
        self._previous = _STATE.mode
        _STATE.mode = None if enabled is None else _parse_mode(enabled, "autotune(enabled)")

    def __exit__(self, *exc: object) -> None:
        _STATE.mode = self._previous


# --------------------------------------------------------------------------- key and fingerprint


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _blas() -> dict[str, Any]:
    try:
        from threadpoolctl import threadpool_info

        pools = [p for p in threadpool_info() if p.get("user_api") == "blas"]
        if pools:
            p = pools[0]
            return {
                "vendor": p.get("internal_api"),
                "version": p.get("version"),
                "threads": p.get("num_threads"),
            }
    except Exception:  # threadpoolctl is optional; fall back to numpy's build config
        pass
    vendor = "unknown"
    with contextlib.suppress(Exception):
        cfg = np.show_config(mode="dicts")  # numpy >= 1.25
        blas = cfg["Build Dependencies"]["blas"]
        vendor = f"{blas.get('name')} {blas.get('version', '')}".strip()
    threads = os.environ.get("OPENBLAS_NUM_THREADS") or os.environ.get("OMP_NUM_THREADS") or "default"
    return {"vendor": vendor, "version": None, "threads": threads}


@functools.lru_cache(maxsize=1)
def device_fingerprint() -> dict[str, Any]:
    """What makes timings machine-specific: CPU model, cores, BLAS vendor/threads, numpy version.

    Cached per process; call ``device_fingerprint.cache_clear()`` after changing BLAS threads.
    """
    return {
        "cpu": _cpu_model(),
        "cores": os.cpu_count(),
        "machine": platform.machine(),
        "system": platform.system(),
        "blas": _blas(),
        "numpy": np.__version__,
    }


def _describe(v: Any) -> Any:
    """A JSON description of one argument: arrays by shape and dtype, scalars by value."""
    if isinstance(v, _JSON_SCALARS):
        return v
    if hasattr(v, "shape") and hasattr(v, "dtype"):
        return {"shape": list(v.shape), "dtype": str(v.dtype)}
    if isinstance(v, (list, tuple)):
        return [_describe(x) for x in v]
    if isinstance(v, np.generic):
        return v.item()
    return {"type": type(v).__name__}


def shape_key(spec: Tunable, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The machine-independent part of a key: op, device, version, the arguments' description."""
    return {
        "op": spec.op,
        "device": spec.device,
        "version": spec.version,
        "args": [_describe(a) for a in args],
        "kwargs": {k: _describe(v) for k, v in sorted(kwargs.items()) if k not in spec.params},
    }


def cache_key(spec: Tunable, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The full key of a call: :func:`shape_key` plus the device fingerprint."""
    return {**shape_key(spec, args, kwargs), "fingerprint": device_fingerprint()}


def _deterministic(spec: Tunable, args: Sequence[Any], kwargs: Mapping[str, Any]) -> dict[str, Any]:
    """The package's pre-tuned parameters for this shape if it ships some, else the declared defaults."""
    _count("deterministic")
    found = pretuned(shape_key(spec, args, kwargs)) if has_pretuned(spec.op) else None
    return dict(spec.default) if found is None else found


def clear_autotune_cache(*, disk: bool = False) -> None:
    """Forget the in-memory choices; with ``disk=True`` also delete the autotune cache directory."""
    _STATE.memory.clear()
    if disk:
        import shutil

        shutil.rmtree(autotune_cache_dir(), ignore_errors=True)


# --------------------------------------------------------------------------- tuning


def _time(
    spec: Tunable, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any], cands: list[dict]
) -> dict[str, dict[str, Any]]:
    """Interleaved medians, like ``benchtools.compare`` but in a shuffled order each round.

    A fixed cyclic order makes the candidate after the most memory-hungry one pay for the heap and
    page state it leaves (measured: a systematic 5-25% penalty); shuffling spreads that cost.
    """
    runs = {json.dumps(c, sort_keys=True): functools.partial(fn, *args, **kwargs, **c) for c in cands}
    rng = random.Random(0)
    start = time.perf_counter()
    for run in runs.values():
        run()  # warmup
    samples: dict[str, list[float]] = {cid: [] for cid in runs}
    order = list(runs)
    for _ in range(spec.repeats):
        rng.shuffle(order)
        for cid in order:
            t0 = time.perf_counter()
            runs[cid]()
            samples[cid].append(time.perf_counter() - t0)
    _count("seconds", time.perf_counter() - start)
    _count("timed", len(cands))
    return {
        cid: {"params": c, "median_s": statistics.median(samples[cid]), "samples_s": samples[cid]}
        for cid, c in zip(runs, cands, strict=True)
    }


def _tune(
    spec: Tunable, fn: Callable[..., Any], args: Sequence[Any], kwargs: Mapping[str, Any]
) -> TuneResult:
    key = cache_key(spec, args, kwargs)
    key_text = json.dumps(key, sort_keys=True)
    cands = spec.candidates()
    cids = [json.dumps(c, sort_keys=True) for c in cands]
    path = entry_path(key_text, spec.op)
    mem_key = (str(path), key_text, "|".join(cids))
    hit = _STATE.memory.get(mem_key)
    if hit is not None:
        _count("hits")
        return TuneResult(spec.op, dict(hit["params"]), hit["timings"], (), str(path))
    records = read_entry(path, key)
    missing = [c for c, cid in zip(cands, cids, strict=True) if cid not in records]
    if missing:
        _count("misses")
        new = _time(spec, fn, args, kwargs, missing)
        write_entry(path, key, new)
        records.update(new)
    else:
        _count("hits")
    timings = {cid: records[cid]["median_s"] for cid in cids}
    best = min(cids, key=timings.__getitem__)  # ties: the first declared
    default = json.dumps(dict(spec.default), sort_keys=True)
    if default in timings and timings[best] > timings[default] * (1 - spec.min_gain):
        best = default  # a win within the noise is not worth leaving the default for
    params = dict(records[best]["params"])
    _STATE.memory[mem_key] = {"params": params, "timings": timings}
    return TuneResult(
        spec.op, dict(params), timings, tuple(json.dumps(c, sort_keys=True) for c in missing), str(path)
    )


def register_tunable(spec: Tunable, fn: Callable[..., Any]) -> None:
    """Declare ``fn`` (the undecorated kernel) tunable by ``spec``; :func:`autotuned` calls this."""
    _STATE.tunables[(spec.op, spec.device)] = (spec, fn)
    _STATE.memory.clear()


def autotuned(spec: Tunable) -> Callable[[F], F]:
    """Decorate a kernel so dispatch picks its tunable keywords per the autotune mode (module docstring)."""

    def deco(fn: F) -> F:
        register_tunable(spec, fn)
        names = tuple(spec.params)

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            mode = current_mode()
            if mode == "off" or any(kwargs.get(n) is not None for n in names):
                return fn(*args, **kwargs)
            kwargs = {k: v for k, v in kwargs.items() if k not in names}
            if mode == "deterministic":
                return fn(*args, **kwargs, **_deterministic(spec, args, kwargs))
            return fn(*args, **kwargs, **_tune(spec, fn, args, kwargs).params)

        wrapper.__wrapped_tunable__ = spec  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return deco


def tunables() -> list[Tunable]:
    """Every declared :class:`Tunable`, by op and device."""
    return [spec for _, (spec, _) in sorted(_STATE.tunables.items())]


def tune(op: str, *args: Any, device: str = "cpu", deterministic: bool = False, **kwargs: Any) -> TuneResult:
    """Time ``op``'s tunable candidates on these arguments (cached as in autotune mode ``on``).

    Runs whatever the current mode; ``deterministic=True`` answers as deterministic mode (the
    package's pre-tuned parameters for this shape, else the declared defaults) without timing.

    >>> import numpy as np, opstrata.ops as ops
    >>> q = np.zeros((1, 1, 8, 4), np.float32)
    >>> ops.tune("attention", q, q, q, deterministic=True).params
    {'block_q': None}
    """
    found = _STATE.tunables.get((op, device))
    if found is None:
        have = ", ".join(f"{o} on {d}" for o, d in sorted(_STATE.tunables)) or "none"
        raise LookupError(
            f"tune: op {op!r} has no tunable kernel on device {device!r}; tunable: {have}. "
            "Fix: declare one with @autotuned(Tunable(...)) beside the kernel"
        )
    spec, fn = found
    kwargs = {k: v for k, v in kwargs.items() if k not in spec.params}
    if deterministic:
        return TuneResult(op, _deterministic(spec, args, kwargs), {})
    return _tune(spec, fn, args, kwargs)
