"""Paged KV cache: memory waste on a mixed workload, decode step time vs length, cached decode vs recompute.

1. Waste: 64 sequences with seeded mixed prompt (16-512) and generation (16-512) lengths decoded
   together; waste = reserved bytes (held blocks) - used bytes (written slots), as a share of the
   reserved bytes, at the end and averaged over the steps; against a contiguous allocation of the
   model's max length per sequence (what a cache without paging must reserve up front).
2. Decode step time at lengths 64..2048 (batch 4, lengths interleaved round-robin, medians): the
   step minus its attention time (gather from the cache + attention kernel) should be flat. Timed
   in process CPU time (``time.process_time``; BLAS on one thread): on a shared machine wall time
   mostly measures the other jobs.
3. Cached decode vs recompute: greedy tokens by ``generate`` against running the whole growing
   sequence through an InferenceSession each step (the same tokens; interleaved medians).
4. Beam search memory: the peak blocks ``generate(num_beams=k)`` holds (survivors fork their parent,
   copy on write; pruned beams freed) against k unshared copies of each beam's sequence (what a
   contiguous per-beam cache reordered every step holds). Bookkeeping, exact.

    PYTHONPATH=packages/ops/src:packages/graph/src:packages/runtime/src \
        python packages/runtime/benchmarks/bench_kv_cache.py [--quick] [--threads N] [--only beam]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import time
from typing import Any

import numpy as np

from opstrata.ops.benchtools import compare, format_table
from opstrata.runtime import (
    DecoderRunner,
    DecoderWeights,
    InferenceSession,
    PagedKVCache,
    SessionOptions,
    generate,
)


def bench_waste(quick: bool) -> str:
    """Waste % of reserved bytes for block sizes 8/16/32 vs a contiguous max-length allocation."""
    rng = np.random.default_rng(0)
    n = 16 if quick else 64
    prompts = rng.integers(16, 513, n)
    gens = rng.integers(16, 513, n)
    max_len = 1024  # the model's context: what a contiguous cache reserves per sequence
    rows = []
    for bs in (8, 16, 32):
        cache = PagedKVCache(
            num_layers=1, num_kv_heads=1, head_dim=1, block_size=bs, num_blocks=n * max_len // bs
        )
        seqs = [cache.add_sequence() for _ in range(n)]
        for s, p in zip(seqs, prompts, strict=True):
            cache.reserve(s, int(p))  # prefill
        wastes = []
        for step in range(int(gens.max())):
            live = [s for s, g in zip(seqs, gens, strict=True) if step < g]
            cache.reserve(live, 1)
            wastes.append(cache.stats()["waste_fraction"])
        st = cache.stats()
        rows.append(
            (f"paged, block {bs}", st["used_blocks"], f"{st['reserved_bytes'] / st['bytes_per_slot']:.0f}",
             st["physical_tokens"], f"{100 * st['waste_fraction']:.2f}%", f"{100 * statistics.mean(wastes):.2f}%")
        )  # fmt: skip
    tokens = int((prompts + gens).sum())
    contiguous = 1 - tokens / (n * max_len)
    # a contiguous cache holds max_len slots per sequence for the whole run; its average waste over the steps
    lengths = [prompts + np.minimum(step + 1, gens) for step in range(int(gens.max()))]
    avg = statistics.mean(1 - float(ln.sum()) / (n * max_len) for ln in lengths)
    rows.append(
        (
            "contiguous, max length 1024",
            "-",
            n * max_len,
            tokens,
            f"{100 * contiguous:.2f}%",
            f"{100 * avg:.2f}%",
        )
    )
    head = f"{n} sequences, prompts 16-512 and generations 16-512 tokens (seed 0), {tokens} tokens at the end\n\n"
    return head + format_table(
        ("allocation", "blocks", "reserved slots", "used slots", "waste at end", "waste averaged over steps"),
        rows,
    )


def _model(quick: bool, max_pos: int) -> DecoderWeights:
    hidden, layers = (128, 1) if quick else (256, 2)
    return DecoderWeights.random(
        vocab=1000, hidden=hidden, heads=8, kv_heads=2, layers=layers, max_pos=max_pos, seed=0
    )


def bench_step_vs_length(quick: bool) -> str:
    """Decode step time at each length (batch 4), minus the attention part; lengths interleaved."""
    lengths = (64, 256, 1024) if quick else (64, 128, 256, 512, 1024, 2048)
    rounds = 5 if quick else 41
    batch = 4
    w = _model(quick, max(lengths) + rounds + 8)
    rng = np.random.default_rng(0)
    setups = {}
    for length in lengths:
        cache = PagedKVCache(
            num_layers=w.num_layers, num_kv_heads=w.num_kv_heads, head_dim=w.head_dim, block_size=16,
            num_blocks=batch * ((length + rounds + 8) // 16 + 2),
        )  # fmt: skip
        runner = DecoderRunner(w, cache, clock=time.process_time)
        seqs = [cache.add_sequence() for _ in range(batch)]
        runner.forward(seqs, rng.integers(0, w.vocab_size, (batch, length)))  # prefill
        runner.forward(seqs, rng.integers(0, w.vocab_size, (batch, 1)))  # warm
        setups[length] = (runner, seqs)
    step: dict[int, list[float]] = {n: [] for n in lengths}
    attn: dict[int, list[float]] = {n: [] for n in lengths}
    for r in range(rounds):
        shift = r % len(lengths)
        for length in lengths[shift:] + lengths[:shift]:
            runner, seqs = setups[length]
            tokens = rng.integers(0, w.vocab_size, (batch, 1))
            a0, t0 = runner.attention_seconds, time.process_time()
            runner.forward(seqs, tokens)
            step[length].append(time.process_time() - t0)
            attn[length].append(runner.attention_seconds - a0)
    base = statistics.median(s - a for s, a in zip(step[lengths[0]], attn[lengths[0]], strict=True))
    rows = []
    for length in lengths:
        rest = statistics.median(s - a for s, a in zip(step[length], attn[length], strict=True))
        rows.append(
            (length, f"{statistics.median(step[length]) * 1e3:.2f}", f"{statistics.median(attn[length]) * 1e3:.2f}",
             f"{rest * 1e3:.2f}", f"{rest / base:.2f}x")
        )  # fmt: skip
    head = (
        f"decoder h{w.hidden}, {w.num_layers} layer(s), 8 heads / 2 kv heads, batch {batch}, block 16; "
        f"process CPU time, medians of {rounds} steps per length, lengths interleaved\n\n"
    )
    return head + format_table(
        (
            "cached length",
            "step ms",
            "attention ms (gather + kernel)",
            "step - attention ms",
            f"vs length {lengths[0]}",
        ),
        rows,
    )


def bench_cached_vs_recompute(quick: bool) -> str:
    """Greedy generation: KV cache vs rerunning the whole sequence through an InferenceSession each token."""
    cases = [(32, 16)] if quick else [(32, 32), (128, 32), (512, 32)]
    rows = []
    for prompt_len, new in cases:
        w = _model(quick, prompt_len + new + 1)
        sess = InferenceSession(w.to_onnx(), SessionOptions(graph_optimization_level=3))
        prompt = np.random.default_rng(1).integers(0, w.vocab_size, prompt_len)

        def cached(p: np.ndarray = prompt, w: DecoderWeights = w, n: int = new) -> list[int]:
            return generate(w, p, max_new_tokens=n).new_tokens[0]

        def recompute(p: np.ndarray = prompt, s: InferenceSession = sess, n: int = new) -> list[int]:
            ids = p[None].astype(np.int64)
            for _ in range(n):
                (logits,) = s.run(["logits"], {"ids": ids})
                ids = np.concatenate([ids, [[int(np.argmax(logits[0, -1]))]]], axis=1)
            return ids[0, len(p) :].tolist()

        same = cached() == recompute()
        t = compare(
            {"KV cache": cached, "recompute (session)": recompute}, repeats=3 if quick else 7, warmup=1
        )
        c, rc = t["KV cache"].median, t["recompute (session)"].median
        rows.append(
            (prompt_len, new, f"{c * 1e3:.1f}", f"{rc * 1e3:.1f}", f"{rc / c:.1f}x", "yes" if same else "NO")
        )
    head = f"decoder h{w.hidden}, {w.num_layers} layer(s), 8 heads / 2 kv heads, greedy, batch 1\n\n"
    return head + format_table(
        ("prompt", "new tokens", "KV cache ms", "recompute ms", "speedup", "same tokens"), rows
    )


def bench_beam_blocks(quick: bool) -> str:
    """Peak KV blocks of beam search with copy-on-write forks vs k unshared copies per beam."""
    cases = [(32, 4)] if quick else [(32, 4), (128, 4), (512, 4), (128, 8)]
    new, bs = (8, 16) if quick else (32, 16)
    rows = []
    for prompt_len, k in cases:
        w = _model(quick, prompt_len + new + 1)
        prompt = np.random.default_rng(2).integers(0, w.vocab_size, prompt_len)
        out = generate(w, prompt, max_new_tokens=new, num_beams=k, block_size=bs)
        s = out.kv_stats
        length = prompt_len + new - 1  # the last token's K/V is never written
        unshared = k * -(-length // bs)
        rows.append(
            (prompt_len, k, new, s["used_blocks"], unshared, f"{s['used_blocks'] / unshared:.2f}x",
             s["num_forks"], s["num_cow_copies"])
        )  # fmt: skip
    head = f"decoder h{w.hidden}, {w.num_layers} layer(s), one prompt, {new} new tokens, block {bs}, peak over the steps\n\n"
    return head + format_table(
        ("prompt", "num_beams", "new tokens", "blocks held (CoW)", "k unshared copies", "ratio", "forks",
         "CoW copies"),
        rows,
    )  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="small sizes, few repeats (a smoke run)")
    p.add_argument("--threads", type=int, default=1, help="BLAS threads (default 1)")
    p.add_argument(
        "--only", choices=("waste", "step", "recompute", "beam"), help="run one section (default: all four)"
    )
    args = p.parse_args()
    limit: Any = contextlib.nullcontext()
    note = "threadpoolctl not installed: numpy BLAS uses its default threads"
    try:
        from threadpoolctl import threadpool_limits

        limit = threadpool_limits(args.threads)
        note = f"numpy BLAS limited to {args.threads} thread(s) with threadpoolctl"
    except ImportError:
        pass
    sections = {
        "waste": ("KV cache waste", bench_waste),
        "step": (f"Decode step time vs cached length ({note})", bench_step_vs_length),
        "recompute": (f"Cached decode vs recompute ({note})", bench_cached_vs_recompute),
        "beam": ("Beam search blocks: copy-on-write forks vs unshared beams", bench_beam_blocks),
    }
    with limit:
        for name, (title, run) in sections.items():
            if args.only in (None, name):
                print(f"# {title}\n\n{run(args.quick)}\n")


if __name__ == "__main__":
    main()
