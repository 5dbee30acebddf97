"""Small GEMMs run on fewer BLAS threads than large ones: a per-shape plan of BLAS thread switches.

Measured on this shared 2-core machine (OpenBLAS 0.3.31, float32, ``packages/runtime/benchmarks/
bench_threads.py --gemm``, interleaved medians, 2 threads / 1 thread): OpenBLAS already keeps GEMMs
below ~1 MFLOP on one thread; between ~2 and ~4 MFLOP it splits them and loses or barely wins (with its
default idle spin 64x64x256 was 2.4x slower and 32x128x512 2.8x; with ``OPENBLAS_THREAD_TIMEOUT=4``
1.24x and 0.85x); from ~6 MFLOP on two threads win (48x256x256: 0.62-0.76x; 128x256x256: 0.60-0.64x;
512x512x512: 0.52x). With more runnable processes than cores two OpenBLAS threads lose at every size
(the second waits for a core on each call): the threshold is for a machine whose cores are the
session's, as onnxruntime's default thread count assumes. Hence :data:`GEMM_MIN_FLOPS_PER_THREAD` (kept
in ``_threads``, read when a session is created): a GEMM call gets one BLAS thread per 2.5 MFLOP, at
least one, at most the run's count; below 5 MFLOP it runs single-threaded.

The FLOPs are those of one BLAS call, from the node's static shapes (:func:`node_flops`): a MatMul
whose second operand is batched (attention's ``Q @ K^T``) is one call per batch entry, so its count is
per entry; a MatMul against a 2-D weight, Gemm and the fused Linear are one call.

Attention nodes (:data:`TILED_OPS`) run at one BLAS thread: ops' tiled kernel issues one tile-sized GEMM
per tile and splits tiles over its own workers (pinning BLAS to one thread then); run serially (below
its own size threshold) its tile GEMMs are in the range where two BLAS threads lose.

Per node, switching costs ~1 us (``BlasThreads.set``), so a plan switches only where the count changes
between consecutive GEMMs: a model whose GEMMs all want one count (the MLP, every small model) sets it
once at the start of the run and never switches. Other nodes run at whatever count is current. Runs
spread over several streams do not switch per node (the count is process-wide, so one stream's switch
would change another's GEMM): they run at the count the plan's largest GEMM call gets, capped at
``max(1, intra // inter)`` (so at 1 when every GEMM is below the single-thread threshold).

ops' autotune tunables (``ops.tunables()``) are keyword parameters of one ops kernel, declared beside
it; this threshold is a property of the runtime's BLAS scheduling, so it lives here. Moving it to an
ops tunable (timed and cached per machine) is for when ops' matmul owns its thread count.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ._flops import node_flops
from ._threads import GEMM_MIN_FLOPS_PER_THREAD, ThreadSettings

__all__ = [
    "GEMM_MIN_FLOPS_PER_THREAD",
    "GEMM_OPS",
    "TILED_OPS",
    "ThreadPlan",
    "gemm_call_flops",
    "thread_plan",
    "with_switches",
]

#: (domain, op type) of the nodes whose kernels are BLAS GEMMs
GEMM_OPS = frozenset({("", "MatMul"), ("", "Gemm"), ("ai.opstrata", "Linear")})
#: nodes whose kernels issue one small GEMM per tile and parallelise over tiles themselves (ops' tiled
#: attention pins BLAS to one thread when it does; run serially, its tile GEMMs are in the small range):
#: they run at one BLAS thread
TILED_OPS = frozenset({("", "Attention"), ("ai.opstrata", "Attention")})

Shape = tuple[int, ...]


def gemm_call_flops(node: object, ins: Sequence[Shape | None], outs: Sequence[Shape | None]) -> int | None:
    """FLOPs of one BLAS call of a GEMM node at these shapes; None: not a GEMM, or a shape unknown."""
    domain = getattr(node, "domain", "")
    key = ("" if domain in ("", "ai.onnx") else domain, getattr(node, "op_type", ""))
    if key not in GEMM_OPS or not ins or not outs or any(s is None for s in (*ins[:2], outs[0])):
        return None
    try:
        flops = node_flops(node, ins, outs)  # type: ignore[arg-type]
    except (TypeError, IndexError, ValueError):
        return None
    b, out = ins[1], outs[0]
    if key[1] == "MatMul" and b is not None and out is not None and len(b) > 2 and len(out) >= 2:
        a = ins[0]
        k = a[-1] if a else 1
        return 2 * out[-2] * out[-1] * k  # one call per batch entry
    return flops


@dataclass(frozen=True)
class ThreadPlan:
    """BLAS threads of one input-shape signature: the count a run starts with and where it changes."""

    start: int  #: set when the run begins
    switch_at: dict[int, int] = field(default_factory=dict)  #: step index -> count to set before it
    largest_gemm_flops: int = 0  #: FLOPs of the plan's largest GEMM call (0: no GEMM)


def thread_plan(
    steps: Sequence[object], shapes: Sequence[Shape | None], settings: ThreadSettings, parallel: bool
) -> ThreadPlan:
    """The plan for ``steps`` (``_Step``: ``node``, ``ins``, ``outs``) at per-slot ``shapes``.

    ``parallel``: the run is spread over the streams (no per-node switching, see the module docstring).
    """
    want: list[tuple[int, int]] = []  # (step, threads) per GEMM with known shapes and per tiled node
    largest = 0
    cap = settings.per_stream if parallel else settings.intra_op
    for i, st in enumerate(steps):
        ins = [shapes[s] if s >= 0 else None for s in st.ins]  # type: ignore[attr-defined]
        outs = [shapes[s] if s >= 0 else None for s in st.outs]  # type: ignore[attr-defined]
        node = st.node  # type: ignore[attr-defined]
        flops = gemm_call_flops(node, ins, outs)
        if flops is not None:
            largest = max(largest, flops)
            want.append((i, settings.gemm_threads(flops, cap)))
        elif (node.domain if node.domain != "ai.onnx" else "", node.op_type) in TILED_OPS:
            want.append((i, 1))
    if not want:
        return ThreadPlan(cap, {}, 0)
    if parallel:  # one count for the whole run: the largest GEMM call's
        return ThreadPlan(settings.gemm_threads(largest, cap), {}, largest)
    start = want[0][1]
    switch_at: dict[int, int] = {}
    current = start
    for i, n in want[1:]:
        if n != current:
            switch_at[i] = current = n
    return ThreadPlan(start, switch_at, largest)


def _switch_then(
    call: Callable[[], object], n: int, set_threads: Callable[[int], None]
) -> Callable[[], object]:
    def switched() -> object:
        set_threads(n)
        return call()

    return switched


def with_switches(
    calls: Sequence[Callable[[], object]],
    index: Sequence[int],
    plan: ThreadPlan,
    set_threads: Callable[[int], None],
) -> list[Callable[[], object]]:
    """A bound program's calls (``index``: the step of each) with the plan's switches put in front of
    the steps where the BLAS count changes; the other calls are left as they are."""
    if not plan.switch_at:
        return list(calls)
    return [
        _switch_then(c, plan.switch_at[i], set_threads) if i in plan.switch_at else c
        for c, i in zip(calls, index, strict=True)
    ]
