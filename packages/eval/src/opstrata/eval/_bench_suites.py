"""Benchmark suites: each turns options into interleaved timing samples (one list per benchmark).

``ops`` times opstrata.ops kernels; ``models`` and ``zoo`` time an opstrata InferenceSession beside
onnxruntime on the same ONNX file at the same thread count (``_bench_suite_models``); ``comm`` times
all_reduce across local rank processes over message sizes (``_bench_suite_comm``). Every suite gives
``rounds`` samples per benchmark, sample i of each from round i, so the gate reads them alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._bench_run import interleave
from ._progress import progress

__all__ = ["SUITES", "BenchError", "BenchOptions", "SuiteRun", "ops_suite", "run_interleaved"]


class BenchError(ValueError):
    """A suite cannot run as asked (unknown model, bad sizes, a missing extra): names it and the fix."""


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass
class BenchOptions:
    """What a suite is asked to run; unset selections (None) take the suite's defaults."""

    rounds: int = 20
    threads: int = 1  # models, zoo: intra-op threads of both runtimes
    models: list[str] | None = None  # models, zoo: which models
    sizes: list[int] | None = None  # comm: message sizes in bytes
    ranks: int = 2  # comm: local rank processes
    progress: str = "plain"  # a _progress kind
    say: Callable[[str], None] = _stderr  # progress lines and notes (stdout stays for the results)


@dataclass
class SuiteRun:
    """Samples (seconds per call, one per round) per benchmark, their extra fields, and notes to print."""

    samples: dict[str, list[float]]
    meta: dict[str, dict[str, Any]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)


def run_interleaved(
    candidates: Mapping[str, Callable[[], object]], opts: BenchOptions, desc: str
) -> dict[str, list[float]]:
    """``interleave`` with a progress display of the rounds."""
    with progress(opts.progress, opts.rounds, desc, say=opts.say) as bar:
        return interleave(candidates, rounds=opts.rounds, on_round=lambda _i: bar.update(1))


def ops_suite() -> dict[str, Callable[[], object]]:
    """opstrata.ops kernels on the cpu device at sizes where the kernel, not the call, dominates."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((256, 256)).astype(np.float32)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    w, b = np.ones(1024, np.float32), np.zeros(1024, np.float32)

    def on_cpu(fn: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            with ops.device("cpu"):
                return fn()

        return run

    return {
        "matmul_256": on_cpu(lambda: ops.matmul(a, a)),
        "softmax_64x1024": on_cpu(lambda: ops.softmax(x, axis=-1)),
        "layer_norm_64x1024": on_cpu(lambda: ops.layer_norm(x, w, b)),
        "add_64x1024": on_cpu(lambda: ops.add(x, x)),
        "gelu_64x1024": on_cpu(lambda: ops.gelu(x)),
    }


def _run_ops(opts: BenchOptions) -> SuiteRun:
    if opts.models is not None:
        raise BenchError("--models selects models of the models and zoo suites; the ops suite has none")
    return SuiteRun(run_interleaved(ops_suite(), opts, "bench ops: rounds"))


def _run_models(opts: BenchOptions) -> SuiteRun:
    from ._bench_suite_models import run_models

    return run_models(opts)


def _run_zoo(opts: BenchOptions) -> SuiteRun:
    from ._bench_suite_models import run_zoo

    return run_zoo(opts)


def _run_comm(opts: BenchOptions) -> SuiteRun:
    from ._bench_suite_comm import run_comm

    return run_comm(opts)


#: Suite name -> runner (modules of the heavier suites load only when they run).
SUITES: dict[str, Callable[[BenchOptions], SuiteRun]] = {
    "ops": _run_ops,
    "models": _run_models,
    "zoo": _run_zoo,
    "comm": _run_comm,
}

#: One line per suite for --help.
SUITE_HELP = {
    "ops": "opstrata.ops kernels on cpu",
    "models": "InferenceSession on models built in code, beside onnxruntime at the same threads",
    "zoo": "zoo models exported by torch.onnx, opstrata beside onnxruntime (needs opstrata-eval[zoo])",
    "comm": "opstrata.comm all_reduce across local ranks over message sizes (bus bandwidth)",
}
