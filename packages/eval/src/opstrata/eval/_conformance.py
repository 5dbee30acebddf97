"""``conformance_ops``: every registered op x dtype on a device, run on generated inputs against ``ref``.

Inputs come from two places. Ops with an entry in ``_conformance_samples.SAMPLES`` (data movement,
indexing, pooling, norms, convolutions, the attention family, quantization, bit ops, signal, ...) get
valid arguments from their own builder: index tensors in range for the data they index, weights and
scales of matching shapes, per-op variants (size-1 and empty batch dims, broadcasting, NaN/inf,
extreme floats, full-range ints, and op modes such as causal attention or reflect padding). Other ops
taking one or two tensors are fed by shape: the first of a few candidate shapes the reference kernel
accepts, then the generic variants. Everything is seeded, so a run is reproducible.

A cell is ``native`` (every variant agrees at the dtype's default tolerance, every output compared),
``decomposed``, ``fallback:<device>``, ``missing``, ``deviates`` (the worst error, and an .npz
reproducer that :func:`load_reproducer` / :func:`replay_reproducer` turn back into the call) or
``no-sample`` (nothing generated suits the op, the reference refuses the dtype, or the op is random:
listed with the reason, never judged). An input the reference refuses is a :class:`CandidateError`,
not a finding. Tolerances are the dtype defaults with atol scaled by the output's peak magnitude
(kernels may sum in another order than the reference).
"""

from __future__ import annotations

import inspect
import json
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._compare import compare
from ._conformance_samples import RANDOM_OPS, SAMPLES, Gen, OpSamples, applies, values
from ._conformance_search import search
from ._tolerances import default_tolerances, dtype_class

__all__ = [
    "CandidateError", "ConformanceCell", "ConformanceReport", "Reproducer", "conformance_ops",
    "load_reproducer", "replay_reproducer",
]  # fmt: skip

#: Shapes tried, in order, until the reference kernel accepts float32 inputs of that shape.
BASE_SHAPES: tuple[tuple[int, ...], ...] = ((4, 4), (2, 3, 4, 4), (2, 3, 8), (8,))


class CandidateError(Exception):
    """The reference kernel refused an input: that input does not suit the op (not a finding)."""


@dataclass(frozen=True)
class ConformanceCell:
    """One op x dtype on the device under test."""

    op: str
    dtype: str
    status: str  # native | decomposed | fallback:<dev> | missing | deviates | no-sample
    variants: int = 0  # generated inputs both sides ran
    max_error: float = 0.0  # worst max |actual - expected| / max |expected| over the variants
    detail: str = ""  # for deviates: which variant and how; for no-sample: why
    repro: str = ""  # .npz reproducer of the worst deviation


@dataclass(frozen=True)
class ConformanceReport:
    """The matrix: ``cells[(op, dtype)]``, plus the device pair and where reproducers went."""

    device: str
    against: str
    ops: tuple[str, ...]
    dtypes: tuple[str, ...]
    cells: dict[tuple[str, str], ConformanceCell]

    @property
    def deviations(self) -> list[ConformanceCell]:
        """The cells whose kernel disagrees with the reference."""
        return [c for c in self.cells.values() if c.status == "deviates"]

    def counts(self) -> dict[str, int]:
        """How many cells have each status (fallback:<dev> counted as 'fallback')."""
        out: dict[str, int] = {}
        for c in self.cells.values():
            key = c.status.split(":")[0]
            out[key] = out.get(key, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: counts, then per op per dtype the cell."""
        return {
            "device": self.device, "against": self.against, "dtypes": list(self.dtypes), "counts": self.counts(),
            "ops": {op: {dt: {"status": c.status, "variants": c.variants, "max_error": c.max_error,
                              "detail": c.detail, "repro": c.repro}
                         for (o, dt), c in self.cells.items() if o == op} for op in self.ops},
        }  # fmt: skip


Call = tuple[tuple[Any, ...], dict[str, Any]]
Case = tuple[str, tuple[Any, ...], dict[str, Any]]


def _arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return -1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.default is p.empty and p.kind in kinds)


_values = values  # the generic path's value generator (normal variant)


def _variants(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype, arity: int
) -> list[tuple[str, list[np.ndarray]]]:
    """(name, args) for each generated input of one op x dtype (the shape-searched path)."""

    def args(s: tuple[int, ...], n: int = arity) -> list[np.ndarray]:
        return [_values(rng, s, dtype) for _ in range(n)]

    out = [("normal", args(shape))]
    if len(shape) > 1:
        out.append(("size-1 dim", args((1, *shape[1:]))))
    out.append(("empty dim", args((0, *shape[1:]))))
    if arity == 2 and len(shape) > 1:
        out.append(("broadcast", [_values(rng, shape, dtype), _values(rng, shape[1:], dtype)]))
    if dtype_class(dtype) == "float":
        special = args(shape)
        flat = special[0].reshape(-1)
        for i, v in enumerate((np.nan, np.inf, -np.inf)[: flat.size]):
            flat[i] = v
        out.append(("nan/inf", special))
        big = [
            (a.astype(np.float64) * np.where(rng.random(shape) < 0.5, 1e3, 1e-3)).astype(dtype)
            for a in args(shape)
        ]
        out.append(("extreme", big))
    return out


def _table_cases(entry: OpSamples, dt: np.dtype, seed: int) -> tuple[list[Case], list[str]]:
    """The op's own samples for ``dt``: (cases, why each skipped variant failed to build)."""
    rng = np.random.default_rng(seed)
    cases: list[Case] = []
    failed: list[str] = []
    for name in entry.variants:
        if not applies(name, dt):
            continue
        try:
            with warnings.catch_warnings(), np.errstate(all="ignore"):
                warnings.simplefilter("ignore")
                args, kwargs = entry.build(Gen(dt, rng, name))
        except Exception as exc:  # e.g. a permutation that does not fit a 1-byte float: not this dtype
            failed.append(
                f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0][:100] if str(exc) else ''}"
            )
            continue
        cases.append((name, tuple(args), dict(kwargs)))
    return cases, failed


def _copy(v: Any) -> Any:
    if isinstance(v, np.ndarray):
        return v.copy()
    if isinstance(v, (list, tuple)):
        return type(v)(_copy(x) for x in v)
    return v


def _call(
    fn: Callable[..., Any], device: str, inputs: Sequence[Any], kwargs: dict[str, Any] | None = None,
    inplace: tuple[int, ...] = (),
) -> list[np.ndarray | None]:  # fmt: skip
    """Every output of one call on ``device`` (copies of the inputs; in-place args appended as outputs).

    On a device with its own memory (cuda) the array inputs are copied there first and the outputs back.
    """
    mem = ops.device_memory(device) if hasattr(ops, "device_memory") else None
    args = [_to_device(mem, _copy(a)) for a in inputs]
    kw = {k: _to_device(mem, _copy(v)) for k, v in (kwargs or {}).items()}
    with (
        ops.device(device),
        ops.fallback_policy("allow"),
        warnings.catch_warnings(),
        np.errstate(all="ignore"),
    ):
        warnings.simplefilter("ignore")  # overflow on extreme values is expected on both sides
        result = fn(*args, **kw)
    items = list(result) if isinstance(result, (tuple, list)) else [result]
    if inplace:
        items = [r for r in items if r is not None] + [args[i] for i in inplace]
    return [None if r is None else _to_host(mem, r) for r in items]


def _to_device(mem: Any, v: Any) -> Any:
    """``v`` with its numpy arrays copied into device memory ``mem`` (None: the host; unchanged)."""
    if mem is None:
        return v
    if isinstance(v, np.ndarray) and not mem.is_array(v):
        return mem.from_host(v)
    if isinstance(v, (list, tuple)):
        return type(v)(_to_device(mem, x) for x in v)
    return v


def _to_host(mem: Any, r: Any) -> np.ndarray:
    return mem.to_host(r) if mem is not None and mem.is_array(r) else np.asarray(r)


def _reference(fn: Callable[..., Any], against: str, case: Case, inplace: tuple[int, ...]) -> list[Any]:
    """The reference's outputs for ``case``; CandidateError when it refuses the input."""
    name, args, kwargs = case
    try:
        return _call(fn, against, args, kwargs, inplace)
    except Exception as exc:
        msg = str(exc).splitlines()[0][:160] if str(exc) else ""
        raise CandidateError(f"{name}: {against} refuses it: {type(exc).__name__}: {msg}") from exc


def _scaled_compare(actual: np.ndarray, expected: np.ndarray) -> Any:
    """compare() at the dtype's defaults with atol scaled by the output's peak magnitude (at least 1).

    Kernels may accumulate in a different order than the reference; where large terms cancel, an
    unscaled atol would flag rounding of the large terms as a deviation.
    """
    rtol, atol = default_tolerances(actual.dtype, expected.dtype)
    finite = (
        np.abs(expected[np.isfinite(expected)].astype(np.float64))
        if dtype_class(expected.dtype) == "float"
        else None
    )
    peak = float(finite.max()) if finite is not None and finite.size else 1.0
    return compare(actual, expected, rtol=rtol, atol=atol * max(1.0, peak))


def _compare_outputs(
    got: Sequence[Any], want: Sequence[Any], dt: np.dtype, against: str
) -> tuple[str, float]:
    """(what differs or "", worst scaled error) over every output of one call."""
    if len(got) != len(want):
        return f"returns {len(got)} outputs, {against} {len(want)}", np.inf
    problem, err = "", 0.0
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        if g is None or w is None:
            if (g is None) != (w is None):
                return (
                    f"output {i} is {'None' if g is None else 'an array'}, {against} gives the other",
                    np.inf,
                )
            continue
        if g.shape != w.shape or g.dtype != w.dtype:
            return f"output {i} is {g.dtype}{list(g.shape)}, {against} gives {w.dtype}{list(w.shape)}", np.inf
        try:
            m = _scaled_compare(g, w)
        except TypeError:
            continue
        if not m.within and m.max_abs_scaled >= err:
            err = m.max_abs_scaled
            problem = (f"output {i}: {m.mismatch_fraction:.1%} of elements outside {dt.name} tolerance "
                       f"(rtol {m.rtol:g}, atol {m.atol:g}), max abs {m.max_abs:.3g}")  # fmt: skip
    return problem, err


def _same(a: Sequence[Any], b: Sequence[Any]) -> bool:
    """Bit-for-bit equal outputs (NaN matching NaN): the reference is deterministic on this input."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b, strict=True):
        if x is None or y is None:
            if (x is None) != (y is None):
                return False
            continue
        if x.shape != y.shape or x.dtype != y.dtype or x.tobytes() != y.tobytes():
            return False
    return True


@dataclass
class _Verdict:
    """What judging one op x dtype found."""

    ran: int = 0
    worst: float = 0.0
    detail: str = ""
    repro: str = ""
    refused: str = ""  # the first CandidateError, for a cell where every input was refused
    random: bool = False  # the reference gave two answers for one input


def _judge(fn: Callable[..., Any], op: str, dt: np.dtype, cases: Iterable[Case], device: str, against: str,
           out_dir: Path | None, inplace: tuple[int, ...] = ()) -> _Verdict:  # fmt: skip
    """Run every case on both devices; keep the worst deviation (and its reproducer)."""
    v = _Verdict()
    for case in cases:
        name, args, kwargs = case
        try:
            want = _reference(fn, against, case, inplace)
        except CandidateError as exc:  # the reference refuses this input: not applicable to the op
            v.refused = v.refused or str(exc)
            continue
        if v.ran == 0 and not _same(want, _reference(fn, against, case, inplace)):
            v.random = True
            return v
        v.ran += 1
        try:
            got = _call(fn, device, args, kwargs, inplace)
            problem, err = _compare_outputs(got, want, dt, against)
        except Exception as exc:
            got, problem, err = [], f"raises {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", np.inf
        if problem and (not v.detail or err > v.worst):
            v.worst, v.detail = max(v.worst, err), f"{name}: {problem}"
            if out_dir is not None:
                v.repro = _save_repro(out_dir, op, dt.name, case, got, want, device, against)
    return v


def _base_shape(fn: Callable[..., Any], arity: int, against: str, seed: int) -> tuple[int, ...] | None:
    rng = np.random.default_rng(seed)
    for shape in BASE_SHAPES:
        try:
            _call(fn, against, [_values(rng, shape, np.dtype(np.float32)) for _ in range(arity)])
        except Exception:
            continue
        return shape
    return None


# ---- reproducers ----------------------------------------------------------------------------------


def _encode(v: Any, key: str, arrays: dict[str, np.ndarray]) -> Any:
    """A JSON spec of one argument; its arrays go into ``arrays`` under ``key``."""
    if isinstance(v, (np.ndarray, np.generic)):
        arrays[key] = np.asarray(v)
        return {"array": key, "dtype": np.asarray(v).dtype.name, "scalar": isinstance(v, np.generic)}
    if isinstance(v, (list, tuple)):
        return {
            "seq": [_encode(x, f"{key}_{j}", arrays) for j, x in enumerate(v)],
            "tuple": isinstance(v, tuple),
        }
    if isinstance(v, np.dtype) or (isinstance(v, type) and issubclass(v, np.generic)):
        return {"dtype_value": np.dtype(v).name}
    if v is None or isinstance(v, (bool, int, float, str)):
        return {"value": v}
    return {"value": repr(v), "unreplayable": True}


def _restore(a: np.ndarray, dtype: str) -> np.ndarray:
    """An array loaded from .npz in its real dtype (bfloat16 and float8 come back as raw void bytes)."""
    return a if a.dtype.name == dtype else a.view(np.dtype(ops.as_dtype(dtype)))


def _decode(spec: Any, data: Any) -> Any:
    if "array" in spec:
        a = _restore(data[spec["array"]], spec["dtype"])
        return a[()] if spec.get("scalar") else a
    if "seq" in spec:
        items = [_decode(s, data) for s in spec["seq"]]
        return tuple(items) if spec["tuple"] else items
    if "dtype_value" in spec:
        return ops.as_dtype(spec["dtype_value"])
    return spec["value"]


def _save_repro(out_dir: Path, op: str, dtype: str, case: Case, got: Sequence[Any], want: Sequence[Any],
                device: str, against: str) -> str:  # fmt: skip
    """Write the case (args, kwargs), both sides' outputs and meta (op, device, against, variant) as .npz."""
    variant, args, kwargs = case
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{op}-{dtype}-{re.sub(r'[^A-Za-z0-9]+', '_', variant)}.npz"
    arrays: dict[str, np.ndarray] = {}
    spec: dict[str, Any] = {
        "args": [_encode(a, f"arg{i}", arrays) for i, a in enumerate(args)],
        "kwargs": {k: _encode(v, f"kw_{k}", arrays) for k, v in kwargs.items()},
        "outputs": {},
    }
    for side, outs in (("actual", got), ("expected", want)):
        for i, a in enumerate(outs):
            if a is not None:
                arrays[f"{side}{i}"] = a
                spec["outputs"][f"{side}{i}"] = a.dtype.name
    meta = np.array([op, device, against, variant])
    # atomically: a reader never sees half a reproducer
    ops.atomic_write(path, lambda f: np.savez(f, meta=meta, call=np.array(json.dumps(spec)), **arrays))
    return str(path)


@dataclass(frozen=True)
class Reproducer:
    """A deviation read back from its .npz: the call, and what each side returned."""

    op: str
    device: str
    against: str
    variant: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    actual: dict[int, np.ndarray]
    expected: dict[int, np.ndarray]


def load_reproducer(path: str | Path) -> Reproducer:
    """Read a reproducer written by ``conformance_ops`` (the call's args and kwargs, both sides' outputs)."""
    with np.load(path) as data:
        op, device, against, variant = (str(s) for s in data["meta"])
        if "call" not in data.files:  # written before kwargs were saved: positional arrays only
            args = tuple(
                data[k]
                for k in sorted((k for k in data.files if k.startswith("arg")), key=lambda k: int(k[3:]))
            )
            spec: dict[str, Any] = {"kwargs": {}, "outputs": {k: data[k].dtype.name for k in data.files
                                                             if k.startswith(("actual", "expected"))}}  # fmt: skip
        else:
            spec = json.loads(str(data["call"]))
            args = tuple(_decode(s, data) for s in spec["args"])
        kwargs = {k: _decode(s, data) for k, s in spec["kwargs"].items()}
        outs = {k: _restore(data[k], dt) for k, dt in spec["outputs"].items()}
    pick = lambda side: {int(k[len(side) :]): a for k, a in outs.items() if k.startswith(side)}  # noqa: E731
    return Reproducer(op, device, against, variant, args, kwargs, pick("actual"), pick("expected"))


def _callable(op: str) -> Callable[..., Any] | None:
    """The function a cell calls: the op's public function, or ``ops.call(op, ...)`` for table ops without one."""
    entry = SAMPLES.get(op)
    if entry is not None and entry.call_op:
        return lambda *a, **k: ops.call(op, *a, **k)
    return getattr(ops, op, None)


def replay_reproducer(path: str | Path, device: str | None = None) -> list[np.ndarray | None]:
    """Run a reproducer's call again on ``device`` (default the device it deviated on); every output."""
    r = load_reproducer(path)
    fn = _callable(r.op)
    if fn is None:
        raise ValueError(
            f"replay: op {r.op!r} of {path} has no function in opstrata.ops; is opstrata-ops older?"
        )
    entry = SAMPLES.get(r.op)
    return _call(fn, device or r.device, r.args, r.kwargs, entry.inplace if entry else ())


# ---- the matrix -----------------------------------------------------------------------------------


def _cases(op: str, fn: Callable[..., Any], dt: np.dtype, shape: tuple[int, ...] | None, arity: int,
           against: str, seed: int) -> tuple[list[Case], str]:  # fmt: skip
    """The cases of one op x dtype, or (no cases, why not)."""
    entry = SAMPLES.get(op)
    if entry is not None:
        cases, failed = _table_cases(entry, dt, seed)
        return (
            cases,
            "" if cases else f"no sample builds for {dt.name}: {'; '.join(failed) or 'no variant applies'}",
        )
    if shape is None:
        why = (f"takes {arity} required tensor arguments; generated inputs cover 1 or 2 and the sample "
               "table has no entry" if arity not in (1, 2) else f"the {against} kernel accepts none of {list(BASE_SHAPES)}")  # fmt: skip
        return [], why
    rng = np.random.default_rng(seed)
    return [(name, tuple(args), {}) for name, args in _variants(rng, shape, dt, arity)], ""


def _search(fn: Callable[..., Any], op: str, dt: np.dtype, rank: int, arity: int, examples: int, seed: int,
            device: str, against: str, out_dir: Path | None, v: _Verdict) -> None:  # fmt: skip
    """Add a hypothesis search to a cell its fixed variants passed: a disagreement found (and shrunk)
    becomes the cell's deviation, with its reproducer."""

    def run(case: Case) -> tuple[str, float, Sequence[Any], Sequence[Any]] | None:
        try:
            want = _reference(fn, against, case, ())
        except CandidateError:
            return None
        try:
            got = _call(fn, device, case[1], case[2])
            problem, err = _compare_outputs(got, want, dt, against)
        except Exception as exc:
            got, problem, err = [], f"raises {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", np.inf
        return problem, err, got, want

    found = search(fn, dt, rank, arity, examples, seed, run)
    v.ran += examples
    if found is not None:
        shapes = ", ".join(str(list(a.shape)) for a in found.case[1])
        v.worst, v.detail = found.error, f"{found.case[0]} input of shape(s) {shapes}: {found.problem}"
        if out_dir is not None:
            v.repro = _save_repro(out_dir, op, dt.name, found.case, found.got, found.want, device, against)


def _cell(op: str, dt: np.dtype, status: str, v: _Verdict, against: str) -> ConformanceCell:
    """The cell for a judged op x dtype."""
    if v.random:
        why = f"random: {against} gives different outputs for one input, so outputs are not comparable"
        return ConformanceCell(op, dt.name, "no-sample", detail=why)
    if v.ran == 0:
        why = f"{against} refuses every {dt.name} sample" + (f" ({v.refused})" if v.refused else "")
        return ConformanceCell(op, dt.name, "no-sample", detail=why)
    if v.detail:
        return ConformanceCell(op, dt.name, "deviates", v.ran, v.worst, v.detail, v.repro)
    return ConformanceCell(op, dt.name, status, v.ran)


def conformance_ops(
    device: str = "cpu", *, against: str = "ref", op_names: Iterable[str] | None = None,
    dtypes: Iterable[Any] | None = None, out_dir: Path | None = None, seed: int = 0,
    progress: Callable[[str], None] | None = None, examples: int = 0,
) -> ConformanceReport:  # fmt: skip
    """Run every registered op (or ``op_names``) x dtype on ``device`` against ``against``.

    Ops in the sample table get their own arguments; others taking one or two tensors are fed by
    shape; the rest are ``no-sample``. Deviations write an .npz reproducer (args, kwargs, actual and
    expected outputs, meta = op, device, against, variant) to ``out_dir``; :func:`replay_reproducer` reruns it.
    ``examples`` > 0 adds a hypothesis search of that many drawn inputs to every shape-searched op x dtype
    whose fixed variants agree (``_conformance_search``; needs hypothesis): a disagreement it finds is
    shrunk to the smallest input that shows it, and that input is the reproducer.
    """
    if isinstance(examples, bool) or not isinstance(examples, int) or examples < 0:
        raise ValueError(f"conformance: examples must be an int >= 0, got {examples!r}")
    devices = ops.list_devices()
    for d, what in ((device, "device"), (against, "against")):
        if d not in devices:
            raise ValueError(f"conformance: unknown {what} {d!r}; registered devices are {devices}")
    names = sorted(ops.list_ops()) if op_names is None else list(op_names)
    unknown = [n for n in names if n not in ops.list_ops()]
    if unknown:
        raise ValueError(
            f"conformance: unknown op(s) {unknown}; `opstrata conformance ops --list` shows them"
        )
    dts = [np.dtype(d) for d in (ops.ALL_DTYPES if dtypes is None else dtypes)]
    cover = ops.coverage(names, [device], dts)
    cells: dict[tuple[str, str], ConformanceCell] = {}
    for k, op in enumerate(names):
        if progress is not None:
            progress(f"[{k + 1}/{len(names)}] {op}")
        fn = _callable(op)
        arity = _arity(fn) if fn is not None else -1
        generic = op not in SAMPLES and arity in (1, 2)
        shape = _base_shape(fn, arity, against, seed) if generic and fn is not None else None
        inplace = SAMPLES[op].inplace if op in SAMPLES else ()
        for dt in dts:
            status = cover[op][device][dt.name]
            if status == "missing" or status.startswith("fallback"):
                cells[(op, dt.name)] = ConformanceCell(op, dt.name, status)
                continue
            if op in RANDOM_OPS:
                why = "random: outputs are drawn at random, so they are not comparable with the reference"
                cells[(op, dt.name)] = ConformanceCell(op, dt.name, "no-sample", detail=why)
                continue
            cases, why = _cases(op, fn, dt, shape, arity, against, seed) if fn is not None else ([], "")
            if not cases:
                why = why or f"opstrata.ops has no function {op!r} to call"
                cells[(op, dt.name)] = ConformanceCell(op, dt.name, "no-sample", detail=why)
                continue
            verdict = _judge(fn, op, dt, cases, device, against, out_dir, inplace)
            if examples and shape is not None and op not in SAMPLES and verdict.ran and not verdict.detail:
                _search(fn, op, dt, len(shape), arity, examples, seed, device, against, out_dir, verdict)
            cells[(op, dt.name)] = _cell(op, dt, status, verdict, against)
    return ConformanceReport(device, against, tuple(names), tuple(d.name for d in dts), cells)
