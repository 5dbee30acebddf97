"""Per-node profiler: wall time, kernels, device, fallback flag, bytes moved, FLOPs; Chrome trace export.

The trace follows the Trace Event Format (complete events, ``ph: "X"``, microseconds) that
Perfetto and chrome://tracing open. Runs sit on their own track (tid 0, "session"); node events on one
track per stream (tid ``1 + stream``, "stream k"), so concurrent branches show as overlapping bars;
each cross-stream event a node waited on is a flow arrow from its producer to it.

The trace's top-level ``metadata`` (the Trace Event Format's place for it) holds what the session set
in :attr:`Profiler.metadata`: its thread settings (intra-op, inter-op, per-stream BLAS threads, the
GEMM threshold, the BLAS libraries); each run span's args carry the BLAS thread count it started with.
"""

from __future__ import annotations

import json
import os
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import opstrata.ops as ops

__all__ = ["SESSION_TID", "STREAM_TID0", "NodeEvent", "Profiler"]

SESSION_TID = 0  #: trace track of the ``run`` spans
STREAM_TID0 = 1  #: trace track of stream 0's node events; stream k is on ``STREAM_TID0 + k``


@dataclass(frozen=True)
class NodeEvent:
    """One node execution: when, how long, on what, with which shapes, bytes and FLOPs."""

    name: str
    op_type: str
    kernels: tuple[str, ...]
    device: str
    fallback: bool
    start_ns: int
    dur_ns: int
    input_shapes: tuple[tuple[int, ...] | None, ...]
    output_shapes: tuple[tuple[int, ...] | None, ...]
    bytes_moved: int
    flops: int
    run: int
    stream: int = 0  # the stream (worker) that ran it; 0 for sequential runs
    dynamic: bool = False  # an output's shape depends on input values: a per-run buffer, not the arena


class Profiler:
    """Collects NodeEvents and run spans; writes a Chrome trace and a hot-op summary."""

    def __init__(self, prefix: str = "opstrata_profile") -> None:
        self.prefix = prefix
        self.events: list[NodeEvent] = []
        self.runs: list[tuple[int, int, int]] = []  # (run index, start ns, duration ns)
        #: cross-stream events a node waited on: (run, producer node, consumer node); drawn as flow arrows
        self.flows: list[tuple[int, str, str]] = []
        #: JSON-ready facts about the session (its thread settings), written as the trace's ``metadata``
        self.metadata: dict[str, Any] = {}
        self.run_threads: dict[int, int] = {}  # run index -> BLAS threads it started with
        self._t0 = time.perf_counter_ns()
        self._pid = os.getpid()

    def add_run(self, start_ns: int, dur_ns: int, blas_threads: int | None = None) -> int:
        """Record one ``run`` span (and the BLAS thread count it started with); returns its index."""
        i = len(self.runs)
        self.runs.append((i, start_ns, dur_ns))
        if blas_threads is not None:
            self.run_threads[i] = blas_threads
        return i

    def trace(self) -> dict[str, Any]:
        """The Chrome trace (Trace Event Format) as a JSON-ready dict."""
        us = lambda ns: (ns - self._t0) / 1000.0  # noqa: E731
        ev: list[dict[str, Any]] = [
            {"name": "process_name", "ph": "M", "pid": self._pid, "args": {"name": "opstrata.runtime"}},
        ]
        streams = sorted({e.stream for e in self.events} | {0})
        for tid, label in [(SESSION_TID, "session")] + [(STREAM_TID0 + k, f"stream {k}") for k in streams]:
            ev.append(
                {"name": "thread_name", "ph": "M", "pid": self._pid, "tid": tid, "args": {"name": label}}
            )
            ev.append({"name": "thread_sort_index", "ph": "M", "pid": self._pid, "tid": tid,
                       "args": {"sort_index": tid}})  # fmt: skip
        for i, start, dur in self.runs:
            args: dict[str, Any] = {"run": i}
            if i in self.run_threads:
                args["blas_threads"] = self.run_threads[i]
            ev.append({"name": f"run {i}", "cat": "session", "ph": "X", "ts": us(start), "dur": dur / 1000.0,
                       "pid": self._pid, "tid": SESSION_TID, "args": args})  # fmt: skip
        for e in self.events:
            ev.append({
                "name": e.name, "cat": e.op_type, "ph": "X", "ts": us(e.start_ns), "dur": e.dur_ns / 1000.0,
                "pid": self._pid, "tid": STREAM_TID0 + e.stream,
                "args": {
                    "op_type": e.op_type, "kernels": list(e.kernels), "device": e.device, "fallback": e.fallback,
                    "input_shapes": [list(s) if s is not None else None for s in e.input_shapes],
                    "output_shapes": [list(s) if s is not None else None for s in e.output_shapes],
                    "bytes": e.bytes_moved, "flops": e.flops, "run": e.run, "stream": e.stream,
                    "dynamic": e.dynamic,
                },
            })  # fmt: skip
        at = {(e.run, e.name): e for e in self.events}
        for k, (run, src, dst) in enumerate(self.flows):
            a, b = at.get((run, src)), at.get((run, dst))
            if a is None or b is None:
                continue
            end = us(a.start_ns + a.dur_ns) - min(a.dur_ns / 2000.0, 0.001)  # inside the producer's slice
            ev.append({"name": "event", "cat": "stream-event", "ph": "s", "id": k, "pid": self._pid,
                       "tid": STREAM_TID0 + a.stream, "ts": end})  # fmt: skip
            ev.append({"name": "event", "cat": "stream-event", "ph": "f", "bp": "e", "id": k, "pid": self._pid,
                       "tid": STREAM_TID0 + b.stream, "ts": us(b.start_ns)})  # fmt: skip
        return {"traceEvents": ev, "displayTimeUnit": "ms", "metadata": dict(self.metadata)}

    def write(self, path: str | os.PathLike[str] | None = None) -> str:
        """Write the trace atomically (temp file + rename) to ``path`` or ``<prefix>_<time>.json``."""
        if path is None:
            path = f"{self.prefix}_{time.strftime('%Y-%m-%d_%H-%M-%S')}_{os.getpid()}.json"
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        ops.atomic_write(p, json.dumps(self.trace()))
        return str(p)

    def summary(self, top: int = 10) -> str:
        """Hottest nodes by total time, the share of time per op type and, with streams, per stream."""
        if not self.events:
            return "profile: no node events recorded (enable_profiling=True, then run)"
        by_node: dict[str, list[NodeEvent]] = defaultdict(list)
        by_op: dict[str, int] = defaultdict(int)
        for e in self.events:
            by_node[e.name].append(e)
            by_op[e.op_type] += e.dur_ns
        total = sum(by_op.values()) or 1
        lines = [
            f"profile: {len(self.runs)} runs, {len(self.events)} node events, {total / 1e6:.3f} ms in nodes"
        ]
        th = self.metadata.get("threads")
        if th:
            lines.append(
                f"threads: intra-op {th['intra_op_num_threads']} ({th['intra_op_source']}), inter-op "
                f"{th['inter_op_num_threads']}, BLAS per stream {th['blas_threads_per_stream']}, GEMMs below "
                f"{th['gemm_single_thread_below_flops'] / 1e6:g} MFLOP single-threaded"
            )
        lines += ["", "hottest nodes:",
                 f"  {'node':<28} {'op':<20} {'calls':>5} {'total ms':>9} {'share':>6} {'GFLOP/s':>8} {'GB/s':>7}  kernels"]  # fmt: skip
        rows = sorted(by_node.items(), key=lambda kv: -sum(e.dur_ns for e in kv[1]))[:top]
        for name, evs in rows:
            t = sum(e.dur_ns for e in evs)
            fl = sum(e.flops for e in evs)
            by = sum(e.bytes_moved for e in evs)
            e0 = evs[0]
            flag = " FALLBACK" if e0.fallback else ""
            lines.append(
                f"  {name[:28]:<28} {e0.op_type[:20]:<20} {len(evs):>5} {t / 1e6:>9.3f} {t / total:>6.1%} "
                f"{fl / t if t else 0:>8.2f} {by / t if t else 0:>7.2f}  {'+'.join(e0.kernels)}@{e0.device}{flag}"
            )
        lines += ["", "time per op type:", f"  {'op':<28} {'total ms':>9} {'share':>6}"]
        for op, t in sorted(by_op.items(), key=lambda kv: -kv[1]):
            lines.append(f"  {op[:28]:<28} {t / 1e6:>9.3f} {t / total:>6.1%}")
        by_stream: dict[int, int] = defaultdict(int)
        for e in self.events:
            by_stream[e.stream] += e.dur_ns
        if len(by_stream) > 1:  # node time per stream over wall time of the runs: how much overlapped
            wall = sum(d for _, _, d in self.runs) or 1
            lines += ["", f"time per stream (node time / run wall time {wall / 1e6:.3f} ms):"]
            for k, t in sorted(by_stream.items()):
                lines.append(f"  stream {k:<21} {t / 1e6:>9.3f} {t / wall:>6.1%}")
            lines.append(f"  {'overlap (sum / wall)':<28} {total / wall:>9.2f}x")
        return "\n".join(lines)
