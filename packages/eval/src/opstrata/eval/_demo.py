"""`opstrata demo`: the end-to-end job on a GPT-style decoder built in code (no downloads).

Builds the model with onnx.helper, saves it as ONNX, compiles it (pass report, memory plan), runs it
in an InferenceSession with profiling, checks it against onnxruntime when installed and against
the uncompiled graph, runs it tensor-parallel (tp=2, simulated in one process), decodes greedily by
recomputing the whole sequence, then generates with the paged KV cache (greedy must equal the
recompute token for token; sampled continuations fork the prompt's blocks copy-on-write). A progress
display follows the steps; a short report ends the run. Every check prints its numbers; the exit
code is non-zero if any check fails.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

import opstrata.graph as og
import opstrata.ops as ops
import opstrata.runtime as rt
from opstrata.graph.testing import gpt_block_model, ort_run, random_feeds

from ._progress import PROGRESS_KINDS, PlainProgress, TqdmProgress, progress

__all__ = ["DemoResult", "add_arguments", "run", "run_demo"]

RTOL, ATOL = 1e-4, 1e-5  # fp32 agreement required against every peer


@dataclass
class DemoResult:
    """What the demo checked: name -> (passed, detail); where it wrote the model and the trace."""

    checks: dict[str, tuple[bool, str]] = field(default_factory=dict)
    model_path: Path | None = None
    trace_path: Path | None = None
    tokens: list[int] = field(default_factory=list)  # greedy tokens of the first prompt (KV cache)
    timings: dict[str, float] = field(default_factory=dict)  # step -> seconds
    arena: tuple[int, int] = (0, 0)  # arena bytes, lower bound bytes
    kv_stats: dict[str, float | int] = field(default_factory=dict)  # greedy generation, at its peak
    sample_stats: dict[str, float | int] = field(default_factory=dict)  # sampled continuations
    decode_speedup: float = 0.0  # recompute decode time / cached decode time

    @property
    def ok(self) -> bool:
        return all(passed for passed, _ in self.checks.values())


@contextlib.contextmanager
def _step(
    title: str, key: str, say: Callable[[str], None], result: DemoResult, bar: PlainProgress | TqdmProgress
) -> Iterator[None]:
    """Print the step's title and duration, record its time, advance the progress display."""
    start = time.perf_counter()
    say(f"\n== {title}")
    yield
    result.timings[key] = time.perf_counter() - start
    say(f"   ({result.timings[key] * 1e3:.0f} ms)")
    bar.update(1, key)


def _compare(
    name: str, got: np.ndarray, want: np.ndarray, result: DemoResult, say: Callable[[str], None]
) -> None:
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)), initial=0.0))
    passed = got.shape == want.shape and bool(np.allclose(got, want, rtol=RTOL, atol=ATOL))
    result.checks[name] = (passed, f"max |diff| {diff:.2e} (rtol {RTOL}, atol {ATOL})")
    say(f"   {'PASS' if passed else 'FAIL'} {name}: max |diff| = {diff:.2e}")


def _save_model(model: object, path: Path) -> None:
    """Write the ONNX model atomically (temp file + rename)."""
    ops.atomic_write(path, model.SerializeToString())  # type: ignore[attr-defined]


#: Steps of the demo (the progress display's total).
STEPS = ("build", "compile", "session", "onnxruntime", "tensor-parallel", "recompute", "kv-cache", "profile")


def _recompute_greedy(sess: rt.InferenceSession, prompts: np.ndarray, n: int) -> list[list[int]]:
    """Greedy tokens per prompt, running the whole growing sequence through the session each step."""
    out = []
    for prompt in prompts:
        ids = prompt[None]
        for _ in range(n):
            (step_logits,) = sess.run(["logits"], {"ids": ids})
            ids = np.concatenate([ids, [[int(np.argmax(step_logits[0, -1]))]]], axis=1).astype(prompts.dtype)
        out.append(ids[0, len(prompt) :].tolist())
    return out


def _kv_line(stats: dict[str, float | int]) -> str:
    return (
        f"{stats['used_blocks']}/{stats['num_blocks']} blocks of {stats['block_size']} tokens held at most, "
        f"{stats['logical_tokens']} tokens in {stats['physical_tokens']} slots, waste "
        f"{stats['waste_fraction']:.1%} of {stats['reserved_bytes'] / 1024:.1f} KiB reserved, "
        f"shared blocks {stats['shared_blocks']}, copy-on-write copies {stats['num_cow_copies']}"
    )


def _own_memory(device: str) -> bool:
    return hasattr(ops, "device_memory") and ops.device_memory(device) is not None


def run_demo(
    out_dir: Path, *, level: int = 3, tp: int = 2, batch: int = 2, seq: int = 12, new_tokens: int = 16,
    samples: int = 4, block_size: int = 8, progress_kind: str = "plain", say: Callable[[str], None] = print,
    device: str = "cpu",
) -> DemoResult:  # fmt: skip
    """Run every step of the demo, writing model.onnx and the profile into ``out_dir``; with ``device``
    other than cpu (``cuda``) also run the model there and check it against the cpu session."""
    if device != "cpu" and _own_memory(device) and not hasattr(rt.InferenceSession, "run_on_device"):
        raise RuntimeError(
            f"opstrata demo: this opstrata-runtime ({rt.__version__}) cannot run sessions on a device with its own "
            f"memory ({device!r}); install opstrata-runtime >= 0.5.48"
        )
    out_dir.mkdir(parents=True, exist_ok=True)
    result = DemoResult()
    max_pos = seq + new_tokens
    dims = {"batch": batch, "seq": seq}
    steps = STEPS if device == "cpu" else (*STEPS[:3], "device", *STEPS[3:])
    bar = progress(progress_kind, len(steps), "opstrata demo", say=say)

    def step(title: str, key: str) -> contextlib.AbstractContextManager[None]:
        return _step(title, key, say, result, bar)

    with bar:
        with step("build a GPT-style decoder block in code and export it to ONNX", "build"):
            model = gpt_block_model(hidden=64, heads=4, vocab=97, max_pos=max_pos)
            result.model_path = out_dir / "model.onnx"
            _save_model(model, result.model_path)
            say(
                f"   {result.model_path} ({result.model_path.stat().st_size / 1024:.0f} KiB, "
                f"{len(model.graph.node)} nodes)"
            )

        with step(f"compile at level {level}: what the passes did and the memory plan", "compile"):
            graph = og.from_onnx(result.model_path)
            plan = og.compile(graph, level=level)
            say(str(plan.report))
            mem = plan.memory_for({"ids": (batch, seq)})
            result.arena = (mem.arena_bytes, mem.lower_bound_bytes)
            say(
                f"   arena {mem.arena_bytes / 1024:.1f} KiB = "
                f"{mem.arena_bytes / max(mem.lower_bound_bytes, 1):.3f}x the lower bound; no reuse would need "
                f"{mem.no_reuse_bytes / 1024:.1f} KiB ({mem.no_reuse_bytes / max(mem.arena_bytes, 1):.1f}x the arena)"
            )
            result.checks["memory plan within 1.05x of the lower bound"] = (
                mem.arena_bytes <= 1.05 * mem.lower_bound_bytes,
                f"{mem.arena_bytes} vs {mem.lower_bound_bytes} bytes",
            )

        feeds = random_feeds(model, dims, int_high=97)
        with step("run in an InferenceSession (arena execution, profiling on)", "session"):
            options = rt.SessionOptions(graph_optimization_level=level, enable_profiling=True)
            sess = rt.InferenceSession(result.model_path, options)
            say(f"   inputs {[(i.name, i.shape, i.type) for i in sess.get_inputs()]}")
            (logits,) = sess.run(None, feeds)
            say(f"   logits {logits.shape} {logits.dtype}")
            _compare("session vs uncompiled graph", logits, og.run_graph(graph, feeds)["logits"], result, say)

        if device != "cpu":
            with step(f"run on {device}: node placement, logits against the cpu session", "device"):
                dsess = rt.InferenceSession(
                    result.model_path, rt.SessionOptions(graph_optimization_level=level), device=device
                )
                host = dsess.host_nodes() if hasattr(dsess, "host_nodes") else []
                on_host = [h for h in host if h.fallback]
                say(f"   {len(dsess.graph.nodes) - len(host)} of {len(dsess.graph.nodes)} nodes on {device}; on the host: "
                    f"{len(host) - len(on_host)} integer shape nodes by design, {len(on_host)} float fallbacks "
                    f"{sorted({h.op_type for h in on_host})}")  # fmt: skip
                (dlogits,) = dsess.run(None, feeds)
                _compare(f"{device} session vs cpu session", dlogits, logits, result, say)
                if hasattr(dsess, "device_arenas"):  # two more runs: the second traces, the third is served
                    for _ in range(2):
                        (again,) = dsess.run(None, feeds)
                    _compare(
                        f"{device} run served from its device arena vs the first run",
                        again,
                        dlogits,
                        result,
                        say,
                    )
                    for arena in dsess.device_arenas.values():
                        say(f"   device arena: {arena.summary()}")
                    kept = getattr(dsess, "device_folded_steps", {})
                    say(f"   host steps computed once for this input shape: {max(kept.values(), default=0)}")

        with step("check against onnxruntime", "onnxruntime"):
            try:
                import onnxruntime  # noqa: F401
            except ImportError:
                say("   skipped: onnxruntime is not installed (pip install 'opstrata-eval[peers]')")
            else:
                _compare("session vs onnxruntime", logits, ort_run(model, feeds)["logits"], result, say)

        with step(
            f"tensor-parallel: partition into tp={tp} rank graphs, simulate the all-reduce", "tensor-parallel"
        ):
            ranks = og.partition(plan.graph, tp=tp, on_unmatched="replicate")
            reduces = sum(n.op_type == "AllReduce" for n in ranks[0].nodes)
            say(f"   {tp} rank graphs, {reduces} AllReduce nodes each")
            outs = og.simulate_tensor_parallel(ranks, feeds)
            _compare(f"tp={tp} vs single process", outs[0]["logits"], logits, result, say)

        prompts = feeds["ids"]
        with step(f"greedy decoding without a cache: {new_tokens} tokens x {batch} prompts", "recompute"):
            start = time.perf_counter()
            want = _recompute_greedy(sess, prompts, new_tokens)
            recompute_s = time.perf_counter() - start
            for i, toks in enumerate(want):
                say(f"   prompt {i} {prompts[i].tolist()} -> {toks}")

        with step(f"generate with the paged KV cache (blocks of {block_size} tokens)", "kv-cache"):
            tokens_bar = progress(progress_kind, new_tokens, "tokens", say=say)
            with tokens_bar:
                out = rt.generate(
                    result.model_path, prompts, max_new_tokens=new_tokens, block_size=block_size,
                    on_step=lambda i, toks: tokens_bar.update(1, f"{len(toks)} sequences"),
                )  # fmt: skip
            result.tokens = out.new_tokens[0]
            result.kv_stats = out.kv_stats
            cached_s = out.timings["prefill_s"] + out.timings["decode_s"]
            result.decode_speedup = recompute_s / max(cached_s, 1e-9)
            for i, toks in enumerate(out.new_tokens):
                say(f"   prompt {i} -> {toks}")
            same = out.new_tokens == want
            result.checks["KV-cache greedy equals the no-cache recompute"] = (
                same, f"{sum(a == b for a, b in zip(out.new_tokens, want, strict=True))}/{len(want)} prompts identical"
            )  # fmt: skip
            say(
                f"   {'PASS' if same else 'FAIL'} KV-cache greedy equals the no-cache recompute, token for token"
            )
            say(
                f"   {cached_s * 1e3:.1f} ms with the cache vs {recompute_s * 1e3:.1f} ms recomputing "
                f"({result.decode_speedup:.1f}x); {_kv_line(out.kv_stats)}"
            )
            kw = {"do_sample": True, "temperature": 0.8, "top_k": 20, "top_p": 0.95, "seed": 0}
            sampled = rt.generate(
                result.model_path, prompts[0], max_new_tokens=new_tokens, block_size=block_size,
                num_return_sequences=samples, **kw,
            )  # fmt: skip
            again = rt.generate(
                result.model_path, prompts[0], max_new_tokens=new_tokens, block_size=block_size,
                num_return_sequences=samples, **kw,
            )  # fmt: skip
            result.sample_stats = sampled.kv_stats
            for toks in sampled.new_tokens:
                say(f"   sample (T=0.8, top-k 20, top-p 0.95, seed 0) -> {toks}")
            shared = int(sampled.kv_stats["shared_blocks"])
            result.checks["sampling reproducible by seed"] = (
                sampled.new_tokens == again.new_tokens, f"{samples} samples, seed 0, twice"
            )  # fmt: skip
            # the forks copy the prompt's partial last block when they append their first sampled token; with a
            # single new token nothing is appended (it comes from the prefill's logits), so every block stays shared
            want_shared = seq // block_size if new_tokens > 1 else -(-seq // block_size)
            result.checks["forked samples share the prompt's full blocks"] = (
                shared == want_shared,
                f"{shared} shared blocks (expected {want_shared}), prompt {seq} tokens in blocks of {block_size}",
            )
            say(f"   {samples} samples: {_kv_line(sampled.kv_stats)}")

        with step("profile and fallback audit", "profile"):
            result.trace_path = Path(sess.end_profiling(str(out_dir / "profile.json")))
            say(sess.profile_summary(top=5))
            say(f"   Chrome trace: {result.trace_path} (open in https://ui.perfetto.dev or chrome://tracing)")
            report = ops.fallback_report()
            result.checks["no kernel fell back"] = (report.total == 0, f"{report.total} fallbacks")
            say(f"   fallbacks recorded by the ops audit: {report.total}")

    _report(result, say)
    return result


def _report(result: DemoResult, say: Callable[[str], None]) -> None:
    """The closing summary: checks, timings, memory, KV cache, trace."""
    passed = sum(ok for ok, _ in result.checks.values())
    say(f"\n== report: {passed}/{len(result.checks)} checks passed")
    for name, (ok, detail) in result.checks.items():
        say(f"   {'PASS' if ok else 'FAIL'}  {name}: {detail}")
    total = sum(result.timings.values())
    say(f"   time {total:.2f} s: " + ", ".join(f"{k} {v:.2f}" for k, v in result.timings.items()))
    arena, bound = result.arena
    say(
        f"   arena {arena / 1024:.1f} KiB = {arena / max(bound, 1):.3f}x the lower bound ({bound / 1024:.1f} KiB)"
    )
    if result.kv_stats:
        say(
            f"   KV cache (greedy): {_kv_line(result.kv_stats)}; decode {result.decode_speedup:.1f}x faster than recompute"
        )
    if result.sample_stats:
        say(f"   KV cache (samples): {_kv_line(result.sample_stats)}")
    say(f"   trace: {result.trace_path}")
    say(f"   {'all checks passed' if result.ok else 'SOME CHECKS FAILED'}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Options of `opstrata demo`."""
    parser.add_argument(
        "--out", type=Path, default=Path("opstrata-demo"), help="directory for model.onnx and profile.json"
    )
    parser.add_argument("--level", type=int, default=3, choices=range(4), help="optimisation level (0-3)")
    parser.add_argument(
        "--device",
        default="cpu",
        help="also run the model on this device and check it against cpu (e.g. cuda)",
    )
    parser.add_argument("--tp", type=int, default=2, help="tensor-parallel degree for the simulated run")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens to generate per prompt")
    parser.add_argument(
        "--progress", choices=PROGRESS_KINDS, default="auto",
        help="progress display: tqdm bar (pip install 'opstrata-eval[progress]'), plain lines, or auto "
        "(tqdm when installed and stderr is a terminal)",
    )  # fmt: skip


def run(args: argparse.Namespace) -> int:
    """Run the demo; exit 0 when every check passed, 1 otherwise (2 for a bad --progress choice)."""
    try:
        from ._progress import resolve_progress

        resolve_progress(args.progress)
    except ValueError as e:
        print(f"opstrata demo: {e}", file=sys.stderr)
        return 2
    if args.device not in ops.list_devices():
        why = (
            [s.reason for s in ops.device_status() if s.name == args.device]
            if hasattr(ops, "device_status")
            else []
        )
        print(f"opstrata demo: --device {args.device!r} is not usable here: {why[0] if why else 'unknown device'}; "
              f"devices: {ops.list_devices()}", file=sys.stderr)  # fmt: skip
        return 2
    result = run_demo(
        args.out, level=args.level, tp=args.tp, new_tokens=args.new_tokens, progress_kind=args.progress,
        device=args.device,
    )  # fmt: skip
    return 0 if result.ok else 1
