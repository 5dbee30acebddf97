"""Decode benchmark: per-token latency of a zoo decoder on the paged KV cache against torch eager with its cache.

The zoo's transformers model (same builder, same seeded weights) is read into the runtime's
``DecoderWeights``; opstrata decodes with ``DecoderRunner`` over a ``PagedKVCache``, torch runs the
model's own forward with ``past_key_values``. Both sides decode greedily from the same prompt at the
same thread count, timed in alternating order; the logits of both are compared at every step on one
shared token sequence (torch's), so a wrong cache or rotary embedding fails the row.
"""

from __future__ import annotations

import contextlib
import inspect
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import opstrata.ops as ops
from opstrata.runtime import DecoderRunner, DecoderWeights, PagedKVCache

from ._builders import build, require_torch
from ._compare import TOLERANCE_TORCH, max_rel_error
from ._specs import get_spec

__all__ = ["DECODERS", "DecodeResult", "decode_bench", "decode_markdown", "decode_text"]

#: Zoo models the decode benchmark runs (decoder-only language models).
DECODERS = ("gpt2", "llama")


@dataclass
class DecodeResult:
    """One decode row: per-token medians on both sides, their ratio and how far the logits agree."""

    model: str
    threads: int
    prompt: int
    new_tokens: int
    ms_per_token: float | None = None  # opstrata, median over rounds of (decode time / new tokens)
    torch_ms_per_token: float | None = None
    err_vs_torch: float | None = None  # worst max_rel_error of the logits over the prefill and each step
    same_tokens: bool | None = None  # both greedy decodes produced the same tokens
    notes: list[str] = field(default_factory=list)

    @property
    def wrong(self) -> bool:
        """True when the logits disagree with torch's beyond the zoo's torch tolerance (or were not compared)."""
        return self.err_vs_torch is None or self.err_vs_torch > TOLERANCE_TORCH

    @property
    def ratio(self) -> float | None:
        """opstrata / torch per-token latency (below 1: opstrata is faster)."""
        if self.ms_per_token is None or not self.torch_ms_per_token:
            return None
        return self.ms_per_token / self.torch_ms_per_token


@contextlib.contextmanager
def _torch_threads(torch: Any, threads: int) -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _cache_kwarg(model: Any) -> str:
    """The forward keyword of the KV cache: ``cache`` in newer transformers, ``past_key_values`` before."""
    params = inspect.signature(model.forward).parameters
    return "cache" if "cache" in params else "past_key_values"


_Decoder = Callable[[int, "list[int] | None"], "tuple[list[int], list[np.ndarray], float]"]


def _torch_decoder(model: Any, prompt: np.ndarray) -> _Decoder:
    """``run(n, forced)``: prefill ``prompt``, then ``n`` greedy steps (or the ``forced`` tokens).

    Returns the tokens, the logits after the prefill and after each step, and the seconds the steps took.
    """
    torch = require_torch()
    key = _cache_kwarg(model)

    def run(n: int, forced: list[int] | None = None) -> tuple[list[int], list[np.ndarray], float]:
        with torch.no_grad():
            out = model(input_ids=torch.from_numpy(prompt[None]), use_cache=True)
            cache, logits = out.past_key_values, [out.logits[0, -1]]
            tokens: list[int] = []
            start = time.perf_counter()
            for step in range(n):
                tok = forced[step] if forced is not None else int(logits[-1].argmax())
                tokens.append(tok)
                out = model(input_ids=torch.tensor([[tok]]), use_cache=True, **{key: cache})
                cache = out.past_key_values
                logits.append(out.logits[0, -1])
            seconds = time.perf_counter() - start
        return tokens, [t.numpy() for t in logits], seconds

    return run


def _opstrata_decoder(weights: DecoderWeights, prompt: np.ndarray, block_size: int = 16) -> _Decoder:
    """The same contract as ``_torch_decoder`` over a fresh paged KV cache per run."""
    blocks = -(-(len(prompt) + 256) // block_size)

    def run(n: int, forced: list[int] | None = None) -> tuple[list[int], list[np.ndarray], float]:
        cache = PagedKVCache(
            num_layers=weights.num_layers, num_kv_heads=weights.num_kv_heads, head_dim=weights.head_dim,
            num_blocks=blocks, block_size=block_size, dtype=weights.wte.dtype,
        )  # fmt: skip
        runner = DecoderRunner(weights, cache)
        seq = cache.add_sequence()
        logits = [runner.forward([seq], prompt[None])[0]]
        tokens: list[int] = []
        start = time.perf_counter()
        for step in range(n):
            tok = forced[step] if forced is not None else int(np.argmax(logits[-1]))
            tokens.append(tok)
            logits.append(runner.forward([seq], np.array([[tok]], np.int64))[0])
        seconds = time.perf_counter() - start
        cache.free(seq)
        return tokens, logits, seconds

    return run


def decode_bench(
    name: str, threads: int = 1, prompt: int = 32, new_tokens: int = 32, rounds: int = 7, seed: int = 0
) -> DecodeResult:
    """Per-token greedy decode latency of zoo model ``name`` in opstrata (paged KV cache) and torch eager.

    Both sides at ``threads`` threads (torch.set_num_threads; the session's intra-op threads and
    numpy's BLAS pool), ``rounds`` alternating rounds of a ``prompt``-token prefill plus ``new_tokens``
    steps, only the steps timed. Logits are compared at every step on torch's tokens.
    """
    if name not in DECODERS:
        raise ValueError(f"decode_bench runs the zoo's decoders {DECODERS}, got {name!r}")
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"threads must be a positive int, got {threads!r}")
    if prompt < 1 or new_tokens < 1 or rounds < 1:
        raise ValueError(f"prompt, new_tokens and rounds must be >= 1, got {prompt}, {new_tokens}, {rounds}")
    torch = require_torch()
    from threadpoolctl import threadpool_limits

    spec = get_spec(name)
    result = DecodeResult(name, threads, prompt, new_tokens)
    hf = build(spec.builder).inner  # the zoo wraps the transformers model to return its logits only
    weights = DecoderWeights.from_transformers(hf)
    if prompt + new_tokens > weights.max_positions:
        raise ValueError(
            f"prompt + new_tokens = {prompt + new_tokens} exceeds {name}'s {weights.max_positions} positions"
        )
    ids = np.random.default_rng(seed).integers(0, spec.vocab, prompt).astype(np.int64)
    theirs, mine = _torch_decoder(hf, ids), _opstrata_decoder(weights, ids)
    with (
        _torch_threads(torch, threads),
        threadpool_limits(threads, user_api="blas"),
        ops.intra_op_threads(threads),
    ):
        ref_tokens, ref_logits, _ = theirs(new_tokens, None)
        my_tokens, _, _ = mine(new_tokens, None)
        _, forced_logits, _ = mine(new_tokens, ref_tokens)
        result.same_tokens = my_tokens == ref_tokens
        result.err_vs_torch = max(max_rel_error(a, e) for a, e in zip(forced_logits, ref_logits, strict=True))
        times: tuple[list[float], list[float]] = ([], [])
        for r in range(rounds):
            for k in (0, 1) if r % 2 == 0 else (1, 0):
                times[k].append((mine, theirs)[k](new_tokens, None)[2] / new_tokens)
    result.ms_per_token = statistics.median(times[0]) * 1e3
    result.torch_ms_per_token = statistics.median(times[1]) * 1e3
    if not result.same_tokens:
        result.notes.append(
            "greedy tokens differ (a near-tie in the logits); logits compared on torch's tokens"
        )
    return result


_HEAD = (
    "model", "threads", "prompt", "new tokens", "opstrata ms/token", "torch ms/token", "ratio", "err vs torch",
    "same tokens", "notes",
)  # fmt: skip


def _cells(r: DecodeResult) -> list[str]:
    def num(v: float | None, fmt: str) -> str:
        return "-" if v is None else format(v, fmt)

    same = "-" if r.same_tokens is None else ("yes" if r.same_tokens else "no")
    return [
        r.model, str(r.threads), str(r.prompt), str(r.new_tokens), num(r.ms_per_token, ".3f"),
        num(r.torch_ms_per_token, ".3f"), num(r.ratio, ".2f"), num(r.err_vs_torch, ".1e"), same,
        "; ".join(r.notes).replace("|", "\\|"),
    ]  # fmt: skip


def decode_markdown(rows: list[DecodeResult]) -> str:
    """The decode rows as a Markdown table."""
    lines = ["| " + " | ".join(_HEAD) + " |", "|" + "|".join("---" for _ in _HEAD) + "|"]
    lines += ["| " + " | ".join(_cells(r)) + " |" for r in rows]
    return "\n".join(lines)


def decode_text(rows: list[DecodeResult]) -> str:
    """The decode rows as fixed-width text, a header line first."""
    widths = [max(len(h), *(len(_cells(r)[i]) for r in rows)) for i, h in enumerate(_HEAD)]

    def fmt(cells: list[str]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)).rstrip()

    return "\n".join([fmt(list(_HEAD)), *(fmt(_cells(r)) for r in rows)])
