"""Beam search over the paged KV cache, with Hugging Face transformers' semantics (its 5.x beam search).

Per prompt, each step scores every (beam, token) pair as the beam's summed log-probability plus the
token's log-softmax, takes the best ``2 * num_beams`` candidates (ties: lower beam, then lower token
id), turns those among the first ``num_beams`` that end (eos, or any token at ``max_new_tokens``)
into finished hypotheses and keeps the best ``num_beams`` that do not end as the next beams. A
finished hypothesis of ``n`` new tokens (eos included) scores ``sum_logprobs / n ** length_penalty``;
the best ``num_beams`` are kept. Surviving beams continue their parent's cache sequence (the first
child) or ``fork`` it (copy on write shares every block), beams without a child are ``free``d, so a
prompt holds at most its shared prompt blocks plus ``num_beams`` sequences' own blocks.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ._generate import DecoderRunner

__all__ = ["beam_blocks_bound", "beam_search"]


@dataclass
class _Finished:
    """The best ``num_beams`` finished hypotheses of one prompt: (score, sum_logprobs, tokens, reason)."""

    num_beams: int
    length_penalty: float
    items: list[tuple[float, float, list[int], str]] = field(default_factory=list)

    def add(self, tokens: list[int], sum_logprobs: float, reason: str) -> None:
        score = sum_logprobs / len(tokens) ** self.length_penalty
        if len(self.items) < self.num_beams or score > self.items[-1][0]:
            self.items.append((score, sum_logprobs, tokens, reason))
            self.items.sort(key=lambda h: -h[0])  # stable: of equal scores the earlier stays ahead
            del self.items[self.num_beams :]

    def is_done(self, best_sum: float, new_len: int, max_new: int, early_stopping: bool | str) -> bool:
        """transformers' stop rule: ``num_beams`` hypotheses, and (unless ``early_stopping=True``) the best
        running beam's sum ``best_sum`` cannot beat the worst of them (``False``: at its current length
        ``new_len``; ``"never"``: at the length the penalty favours most)."""
        if len(self.items) < self.num_beams:
            return False
        if early_stopping is True:
            return True
        n = max_new if early_stopping == "never" and self.length_penalty > 0 else new_len
        return self.items[-1][0] >= best_sum / n**self.length_penalty


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _top(scores: np.ndarray, n: int) -> np.ndarray:
    """Indices of the ``n`` largest of the flat ``scores``, best first; ties keep the lower index."""
    if n < scores.size:
        kth = scores[np.argpartition(-scores, n - 1)[:n]].min()
        idx = np.flatnonzero(scores >= kth)  # every tie of the n-th value, in index order
    else:
        idx = np.arange(scores.size)
    return idx[np.argsort(-scores[idx], kind="stable")][:n]


def beam_blocks_bound(prompt_len: int, length: int, num_beams: int, block_size: int) -> int:
    """Blocks one prompt's beams can hold at ``length`` tokens: the full prompt blocks once, the rest per beam."""
    shared = prompt_len // block_size
    return shared + num_beams * (-(-length // block_size) - shared)


@dataclass
class _Prompt:
    seqs: list[int]  # cache sequence per running beam
    sums: np.ndarray  # summed log-probabilities of the running beams' new tokens
    tokens: list[list[int]]  # new tokens per running beam
    finished: _Finished
    logits: np.ndarray  # next-token logits of the running beams


def beam_search(
    runner: DecoderRunner,
    prompts: list[np.ndarray],
    *,
    num_beams: int,
    max_new_tokens: int,
    eos_token_id: int | None,
    length_penalty: float,
    early_stopping: bool | str,
    num_return_sequences: int,
    on_step: Callable[[int, np.ndarray], None] | None,
    on_forward: Callable[[], None],
    timings: dict[str, float],
) -> tuple[list[list[int]], list[str], list[float]]:
    """New tokens, finish reasons and scores of the ``num_return_sequences`` best hypotheses per prompt.

    Output ``b * R + r`` is prompt ``b``'s ``r``-th best. Every cache sequence it made is freed on
    return or on error. ``on_forward`` runs after each forward (peak tracking); ``timings`` is filled.
    """
    cache, k = runner.cache, num_beams
    states: dict[int, _Prompt] = {}
    results: list[_Finished] = []
    try:
        start = time.perf_counter()
        for bi, prompt in enumerate(prompts):
            seq = cache.add_sequence()
            states[bi] = _Prompt([seq], np.zeros(1), [[]], _Finished(k, length_penalty), np.empty(0))
            states[bi].logits = runner.forward([seq], prompt[None])
            results.append(states[bi].finished)
        timings["prefill_s"] = time.perf_counter() - start
        on_forward()
        start, attn0 = time.perf_counter(), runner.attention_seconds
        for step in range(max_new_tokens):
            last = step == max_new_tokens - 1
            feed_seqs: list[int] = []
            feed_tokens: list[int] = []
            step_tokens: list[int] = []  # the running beams' new tokens, for on_step
            for bi in list(states):
                st = states[bi]
                logp = _log_softmax(st.logits) + st.sums[:, None]  # (beams, V)
                vocab = logp.shape[1]
                flat = logp.ravel()
                cand = _top(flat, 2 * k)
                keep: list[tuple[int, int, float]] = []  # (parent beam, token, sum_logprobs)
                for rank, c in enumerate(cand.tolist()):
                    beam, tok = divmod(c, vocab)
                    ends = eos_token_id is not None and tok == eos_token_id
                    if rank < k and (ends or last):  # only the best num_beams candidates can finish
                        st.finished.add(st.tokens[beam] + [tok], float(flat[c]), "eos" if ends else "length")
                        step_tokens += [tok] if last else []
                    elif not ends and not last and len(keep) < k:
                        keep.append((beam, tok, float(flat[c])))
                if not keep or st.finished.is_done(keep[0][2], step + 1, max_new_tokens, early_stopping):
                    for seq in st.seqs:  # stopped: the last step, no running beam, or none can win
                        cache.free(seq)
                    del states[bi]
                    continue
                step_tokens += [tok for _, tok, _ in keep]
                # the first child of a beam continues its sequence, later ones fork it (copy on write)
                taken: set[int] = set()
                seqs = []
                for beam, _, _ in keep:
                    seqs.append(cache.fork(st.seqs[beam]) if beam in taken else st.seqs[beam])
                    taken.add(beam)
                for beam, seq in enumerate(st.seqs):
                    if beam not in taken:
                        cache.free(seq)
                st.seqs = seqs
                st.sums = np.array([s for _, _, s in keep])
                st.tokens = [st.tokens[beam] + [tok] for beam, tok, _ in keep]
                feed_seqs += seqs
                feed_tokens += [tok for _, tok, _ in keep]
            if on_step is not None:
                on_step(step, np.array(step_tokens, np.int64))
            if not states:
                break
            logits = runner.forward(feed_seqs, np.array(feed_tokens, np.int64)[:, None])
            timings["decode_steps"] += 1
            on_forward()
            at = 0
            for st in states.values():
                st.logits, at = logits[at : at + len(st.seqs)], at + len(st.seqs)
        timings["decode_s"] = time.perf_counter() - start
        timings["attention_s"] = runner.attention_seconds - attn0
    finally:
        for st in states.values():
            for seq in st.seqs:
                cache.free(seq)
    new: list[list[int]] = []
    reasons: list[str] = []
    scores: list[float] = []
    for fin in results:
        for score, _, tokens, reason in fin.items[:num_return_sequences]:
            new.append(tokens)
            reasons.append(reason)
            scores.append(score)
    return new, reasons, scores
