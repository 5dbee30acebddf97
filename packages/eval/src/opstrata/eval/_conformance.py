"""``conformance_ops``: every registered op x dtype on a device, run on generated inputs against ``ref``.

For each op the inputs are found by shape: the first of a few candidate shapes (square matrices first,
so elementwise, matmul and reductions all take them) that the reference kernel accepts. From that
base each dtype runs variants — normal values, size-1 and empty leading dims, a broadcast second
operand, NaN/inf, extreme magnitudes — seeded, so a run is reproducible. A cell is ``native``
(every variant agrees at the dtype's default tolerance), ``decomposed``, ``fallback:<device>``,
``missing``, ``deviates`` (the worst error, and an .npz reproducer) or ``no-sample`` (no generated
input suits the op's signature; it is listed, not judged). Tolerances are the dtype defaults with
atol scaled by the output's peak magnitude (kernels may sum in another order than the reference).
"""

from __future__ import annotations

import inspect
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._compare import compare
from ._tolerances import default_tolerances, dtype_class

__all__ = ["CandidateError", "ConformanceCell", "ConformanceReport", "conformance_ops"]

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


def _arity(fn: Callable[..., Any]) -> int:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return -1
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in params if p.default is p.empty and p.kind in kinds)


def _values(rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    kind = dtype_class(dtype)
    if kind == "bool":
        return rng.random(shape) < 0.5
    if kind == "int":
        lo = 0 if (dtype.kind == "u" or "uint" in dtype.name) else -10
        return rng.integers(lo, lo + 20, shape).astype(dtype)
    return rng.standard_normal(shape).astype(dtype)


def _variants(
    rng: np.random.Generator, shape: tuple[int, ...], dtype: np.dtype, arity: int
) -> list[tuple[str, list[np.ndarray]]]:
    """(name, args) for each generated input of one op x dtype."""

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


def _call(fn: Callable[..., Any], device: str, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    with (
        ops.device(device),
        ops.fallback_policy("allow"),
        warnings.catch_warnings(),
        np.errstate(all="ignore"),
    ):
        warnings.simplefilter("ignore")  # overflow on extreme values is expected on both sides
        result = fn(*[a.copy() for a in inputs])
    items = result if isinstance(result, (tuple, list)) else [result]
    return [np.asarray(r) for r in items]


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


def _save_repro(out_dir: Path, op: str, dtype: str, variant: str, inputs: Sequence[np.ndarray],
                got: Sequence[np.ndarray], want: Sequence[np.ndarray], device: str, against: str) -> str:  # fmt: skip
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{op}-{dtype}-{re.sub(r'[^A-Za-z0-9]+', '_', variant)}.npz"
    arrays = {f"arg{i}": a for i, a in enumerate(inputs)}
    arrays |= {f"actual{i}": a for i, a in enumerate(got)} | {f"expected{i}": a for i, a in enumerate(want)}
    meta = np.array([op, device, against, variant])
    np.savez(path, meta=meta, **arrays)
    return str(path)


def _judge(fn: Callable[..., Any], op: str, dt: np.dtype, shape: tuple[int, ...], arity: int,
           device: str, against: str, seed: int, out_dir: Path | None) -> tuple[int, float, str, str]:  # fmt: skip
    """(variants run, worst error, detail of the worst deviation or "", repro path)."""
    rng = np.random.default_rng(seed)
    ran, worst, detail, repro = 0, 0.0, "", ""
    for name, inputs in _variants(rng, shape, dt, arity):
        try:
            want = _call(fn, against, inputs)
        except Exception:  # the reference refuses this input: not applicable to the op
            continue
        ran += 1
        problem, err = "", 0.0
        try:
            got = _call(fn, device, inputs)
        except Exception as exc:
            got, problem, err = [], f"raises {type(exc).__name__}: {str(exc).splitlines()[0][:120]}", np.inf
        if not problem and len(got) != len(want):
            problem, err = f"returns {len(got)} outputs, {against} {len(want)}", np.inf
        for i, (g, w) in enumerate(zip(got, want, strict=False)):
            if problem:
                break
            if g.shape != w.shape or g.dtype != w.dtype:
                problem, err = (
                    f"output {i} is {g.dtype}{list(g.shape)}, {against} gives {w.dtype}{list(w.shape)}",
                    np.inf,
                )
                break
            try:
                m = _scaled_compare(g, w)
            except TypeError:
                continue
            if not m.within:
                err = max(err, m.max_abs_scaled)
                problem = (f"output {i}: {m.mismatch_fraction:.1%} of elements outside {dt.name} tolerance "
                           f"(rtol {m.rtol:g}, atol {m.atol:g}), max abs {m.max_abs:.3g}")  # fmt: skip
        if problem and (not detail or err > worst):
            worst, detail = max(worst, err), f"{name}: {problem}"
            if out_dir is not None:
                repro = _save_repro(out_dir, op, dt.name, name, inputs, got, want, device, against)
    return ran, worst, detail, repro


def _base_shape(fn: Callable[..., Any], arity: int, against: str, seed: int) -> tuple[int, ...] | None:
    rng = np.random.default_rng(seed)
    for shape in BASE_SHAPES:
        try:
            _call(fn, against, [_values(rng, shape, np.dtype(np.float32)) for _ in range(arity)])
        except Exception:
            continue
        return shape
    return None


def conformance_ops(
    device: str = "cpu", *, against: str = "ref", op_names: Iterable[str] | None = None,
    dtypes: Iterable[Any] | None = None, out_dir: Path | None = None, seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> ConformanceReport:  # fmt: skip
    """Run every registered op (or ``op_names``) x dtype on ``device`` against ``against``.

    Ops taking one or two tensors are generated for; others are ``no-sample``. Deviations write an
    .npz reproducer (args, actual and expected outputs, meta = op, device, against, variant) to ``out_dir``.
    """
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
        fn = getattr(ops, op, None)
        arity = _arity(fn) if fn is not None else -1
        shape = _base_shape(fn, arity, against, seed) if arity in (1, 2) else None
        for dt in dts:
            status = cover[op][device][dt.name]
            key = (op, dt.name)
            if status == "missing" or status.startswith("fallback"):
                cells[key] = ConformanceCell(op, dt.name, status)
                continue
            if shape is None:
                why = (f"takes {arity} required tensor arguments; generated inputs cover 1 or 2"
                       if arity not in (1, 2) else f"the {against} kernel accepts none of {list(BASE_SHAPES)}")  # fmt: skip
                cells[key] = ConformanceCell(op, dt.name, "no-sample", detail=why)
                continue
            ran, worst, detail, repro = _judge(fn, op, dt, shape, arity, device, against, seed, out_dir)
            if ran == 0:
                cells[key] = ConformanceCell(
                    op, dt.name, "no-sample", detail=f"{against} refuses {dt.name} inputs"
                )
            elif detail:
                cells[key] = ConformanceCell(op, dt.name, "deviates", ran, worst, detail, repro)
            else:
                cells[key] = ConformanceCell(op, dt.name, status, ran)
    return ConformanceReport(device, against, tuple(names), tuple(d.name for d in dts), cells)
