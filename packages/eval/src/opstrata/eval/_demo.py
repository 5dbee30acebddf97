"""`opstrata demo`: the end-to-end job on a GPT-style decoder built in code (no downloads).

Builds the model with onnx.helper, saves it as ONNX, compiles it (pass report, memory plan), runs it
in an InferenceSession with profiling, checks it against onnxruntime when installed and against
the uncompiled graph, runs it tensor-parallel (tp=2, simulated in one process) and decodes a few
tokens greedily. Every check prints its numbers; the exit code is non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import opstrata.graph as og
import opstrata.ops as ops
import opstrata.runtime as rt
from opstrata.graph.testing import gpt_block_model, ort_run, random_feeds

__all__ = ["DemoResult", "add_arguments", "run", "run_demo"]

RTOL, ATOL = 1e-4, 1e-5  # fp32 agreement required against every peer


@dataclass
class DemoResult:
    """What the demo checked: name -> (passed, detail); where it wrote the model and the trace."""

    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    model_path: Path | None = None
    trace_path: Path | None = None
    tokens: list[int] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(passed for passed, _ in self.checks.values())


@contextlib.contextmanager
def _step(title: str, say: Callable[[str], None]) -> Iterator[None]:
    start = time.perf_counter()
    say(f"\n== {title}")
    yield
    say(f"   ({(time.perf_counter() - start) * 1e3:.0f} ms)")


def _compare(
    name: str, got: np.ndarray, want: np.ndarray, result: DemoResult, say: Callable[[str], None]
) -> None:
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    passed = got.shape == want.shape and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL))
    result.checks[name] = (passed, f"max |diff| {diff:.2e} (rtol {RTOL}, atol {ATOL})")
    say(f"   {'PASS' if passed else 'FAIL'} {name}: max |diff| = {diff:.2e}")


def _save_model(model: object, path: Path) -> None:
    """Write the ONNX model atomically (temp file + rename)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(model.SerializeToString())  # type: ignore[attr-defined]
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def run_demo(
    out_dir: Path, *, level: int = 3, tp: int = 2, batch: int = 2, seq: int = 12, new_tokens: int = 6,
    say: Callable[[str], None] = print,
) -> DemoResult:  # fmt: skip
    """Run every step of the demo, writing model.onnx and the profile into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    result = DemoResult()
    max_pos = seq + new_tokens
    dims = {"batch": batch, "seq": seq}

    with _step("build a GPT-style decoder block in code and export it to ONNX", say):
        model = gpt_block_model(hidden=64, heads=4, vocab=97, max_pos=max_pos)
        result.model_path = out_dir / "model.onnx"
        _save_model(model, result.model_path)
        say(
            f"   {result.model_path} ({result.model_path.stat().st_size / 1024:.0f} KiB, {len(model.graph.node)} nodes)"
        )

    with _step(f"compile at level {level}: what the passes did and the memory plan", say):
        graph = og.from_onnx(result.model_path)
        plan = og.compile(graph, level=level)
        say(str(plan.report))
        mem = plan.memory_for({"ids": (batch, seq)})
        say(
            f"   arena {mem.arena_bytes / 1024:.1f} KiB = {mem.arena_bytes / max(mem.lower_bound_bytes, 1):.3f}x "
            f"the lower bound; no reuse would need {mem.no_reuse_bytes / 1024:.1f} KiB "
            f"({mem.no_reuse_bytes / max(mem.arena_bytes, 1):.1f}x the arena)"
        )
        result.checks["memory plan within 1.05x of the lower bound"] = (
            mem.arena_bytes <= 1.05 * mem.lower_bound_bytes,
            f"{mem.arena_bytes} vs {mem.lower_bound_bytes} bytes",
        )

    feeds = random_feeds(model, dims, int_high=97)
    with _step("run in an InferenceSession (arena execution, profiling on)", say):
        options = rt.SessionOptions(graph_optimization_level=level, enable_profiling=True)
        sess = rt.InferenceSession(result.model_path, options)
        say(f"   inputs {[(i.name, i.shape, i.type) for i in sess.get_inputs()]}")
        (logits,) = sess.run(None, feeds)
        say(f"   logits {logits.shape} {logits.dtype}")
        _compare("session vs uncompiled graph", logits, og.run_graph(graph, feeds)["logits"], result, say)

    with _step("check against onnxruntime", say):
        try:
            import onnxruntime  # noqa: F401
        except ImportError:
            say("   skipped: onnxruntime is not installed (pip install 'opstrata-eval[peers]')")
        else:
            _compare("session vs onnxruntime", logits, ort_run(model, feeds)["logits"], result, say)

    with _step(f"tensor-parallel: partition into tp={tp} rank graphs, simulate the all-reduce", say):
        ranks = og.partition(plan.graph, tp=tp, on_unmatched="replicate")
        reduces = sum(n.op_type == "AllReduce" for n in ranks[0].nodes)
        say(f"   {tp} rank graphs, {reduces} AllReduce nodes each")
        outs = og.simulate_tensor_parallel(ranks, feeds)
        _compare(f"tp={tp} vs single process", outs[0]["logits"], logits, result, say)

    with _step(f"greedy decoding: {new_tokens} tokens (recomputing the sequence each step)", say):
        ids = feeds["ids"][:1]
        for _ in range(new_tokens):
            (step_logits,) = sess.run(["logits"], {"ids": ids})
            nxt = int(np.argmax(step_logits[0, -1]))
            ids = np.concatenate([ids, np.array([[nxt]], dtype=ids.dtype)], axis=1)
        result.tokens = ids[0, seq:].tolist()
        say(f"   prompt {ids[0, :seq].tolist()} -> generated {result.tokens}")

    with _step("profile and fallback audit", say):
        result.trace_path = Path(sess.end_profiling(str(out_dir / "profile.json")))
        say(sess.profile_summary(top=5))
        say(f"   Chrome trace: {result.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
        report = ops.fallback_report()
        result.checks["no kernel fell back"] = (report.total == 0, f"{report.total} fallbacks")
        say(f"   fallbacks recorded by the ops audit: {report.total}")

    say("\n== report")
    for name, (passed, detail) in result.checks.items():
        say(f"   {'PASS' if passed else 'FAIL'}  {name}: {detail}")
    say(f"   {'all checks passed' if result.ok else 'SOME CHECKS FAILED'}")
    return result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata demo`."""
    parser.add_argument(
        "--out", type=Path, default=Path("opstrata-demo"), help="directory for model.onnx and profile.json"
    )
    parser.add_argument("--level", type=int, default=3, choices=range(4), help="optimisation level (0-3)")
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree for the simulated run")


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when every check passed, 1 otherwise."""
    return 0 if run_demo(args.out, level=args.level, tp=args.tp).ok else 1
