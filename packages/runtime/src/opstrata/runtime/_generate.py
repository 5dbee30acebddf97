"""``generate``: autoregressive decoding of a GPT-style decoder over the paged KV cache.

Each prompt is prefilled once (its K/V written to the cache), forked ``num_return_sequences``
times (copy on write: the prompt's blocks are shared), then every step feeds one token per live
sequence, appends its K/V and attends over the cached keys with ``opstrata.ops.attention``
(grouped-query heads when ``num_kv_heads < num_heads``). Sampling is greedy, or temperature /
top-k / top-p from a seeded ``numpy.random.Generator``; ``num_beams > 1`` runs beam search
(``_beam.py``: surviving beams fork their parent's blocks, pruned beams are freed).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import opstrata.ops as ops

from ._beam import beam_blocks_bound, beam_search
from ._decoder import DecoderWeights
from ._errors import InvalidArgument
from ._kv_cache import PagedKVCache

__all__ = ["DecoderRunner", "GenerateOutput", "generate"]


@dataclass
class GenerateOutput:
    """Per returned sequence (prompt ``b``, sample or beam ``r`` at index ``b * R + r``): tokens and why it stopped."""

    sequences: list[list[int]]  # prompt + generated tokens
    new_tokens: list[list[int]]  # generated tokens only
    finish_reasons: list[str]  # "eos" or "length"
    kv_stats: dict[str, float | int] = field(
        default_factory=dict
    )  # cache stats, last step holding the most blocks
    timings: dict[str, float] = field(default_factory=dict)  # prefill_s, decode_s, decode_steps, attention_s
    scores: list[float] | None = None  # beam search: sum logprob / new tokens ** length_penalty, best first


class DecoderRunner:
    """Runs decoder forward passes whose K/V go to and come from a PagedKVCache.

    The building block of ``generate`` and of custom loops (beam search: ``cache.fork`` the beams
    that survive, ``cache.free`` the others, ``forward`` the survivors' next tokens).
    """

    def __init__(
        self,
        weights: DecoderWeights,
        cache: PagedKVCache,
        device: str | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        w = weights
        got = (cache.num_layers, cache.num_kv_heads, cache.head_dim)
        want = (w.num_layers, w.num_kv_heads, w.head_dim)
        if got != want:
            raise InvalidArgument(
                "generate", f"cache (num_layers, num_kv_heads, head_dim) = {got} does not fit the model's {want}",
                "create the cache with the model's sizes (or let generate create it)",
            )  # fmt: skip
        self.w, self.cache, self.device, self.clock = w, cache, device, clock
        self.attention_seconds = (
            0.0  # gather + attention kernel (by ``clock``), the part that grows with length
        )
        self._rope = w.rotary_tables() if w.rope_theta is not None else None

    def _linear(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        y = ops.matmul(x, weight, device=self.device)
        if bias is not None:
            y += bias
        return y

    def _norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray | None) -> np.ndarray:
        if self.w.norm == "rms":
            return ops.rms_norm(x, weight, eps=self.w.eps, device=self.device)
        return ops.layer_norm(x, weight, bias, eps=self.w.eps, device=self.device)

    def _act(self, x: np.ndarray) -> np.ndarray:
        kind = self.w.activation
        if kind == "silu":
            return ops.silu(x, device=self.device)
        if kind == "relu":
            return ops.relu(x, device=self.device)
        return ops.gelu(x, approximate="tanh" if kind == "gelu_tanh" else "none", device=self.device)

    def _mlp(self, x: np.ndarray, layer: Any) -> np.ndarray:
        t = self._norm(x, layer.ln2_weight, layer.ln2_bias)
        up = self._linear(t, layer.w_fc, layer.b_fc)
        hid = self._act(up) if layer.w_gate is None else self._act(self._linear(t, layer.w_gate, None)) * up
        return self._linear(hid, layer.w_proj, layer.b_proj)

    def forward(self, seqs: Sequence[int], tokens: np.ndarray) -> np.ndarray:
        """Feed ``tokens`` ``(B, n)`` to sequences ``seqs``; returns the last position's logits ``(B, V)``."""
        w, cache = self.w, self.cache
        b, n = tokens.shape
        before = np.array([cache.length(s) for s in seqs], np.int64)
        positions = before[:, None] + np.arange(n)  # (B, n)
        if positions.max(initial=0) >= w.max_positions:
            raise InvalidArgument(
                "generate", f"position {int(positions.max())} is past the model's {w.max_positions} positions",
                "shorten the prompt or max_new_tokens so prompt + new tokens <= the model's max positions",
            )  # fmt: skip
        slots = cache.reserve(list(seqs), n)
        tables = cache.padded_tables(seqs)
        if (before == before[0]).all():  # equal lengths: bottom-right causal is exactly right
            mask, causal = None, n > 1
        else:  # query i of row b sees keys j <= before[b] + i
            m = int(tables[1].max())
            mask = (np.arange(m)[None, None, :] <= positions[:, :, None])[:, None]  # (B, 1, n, M)
            causal = False
        h, hkv, dh = w.num_heads, w.num_kv_heads, w.head_dim
        x = w.wte[tokens]  # (B, n, D)
        if w.wpe is not None:
            x = x + w.wpe[positions]
        else:  # rotary: (B, 1, n, Dh) for q's (B, H, n, Dh), (B n, 1, Dh) for the cached k rows
            cos, sin = self._rope[0][positions], self._rope[1][positions]
        for li, layer in enumerate(w.layers):
            qkv = self._linear(self._norm(x, layer.ln1_weight, layer.ln1_bias), layer.w_qkv, layer.b_qkv)
            q = qkv[..., : h * dh].reshape(b, n, h, dh).transpose(0, 2, 1, 3)
            kv = qkv[..., h * dh :].reshape(b * n, 2, hkv, dh)  # slot i * n + t is token t of row i
            k_new = kv[:, 0]
            if w.wpe is None:
                q = ops.rope_rotate_half(q, cos[:, None], sin[:, None], device=self.device)
                k_new = ops.rope_rotate_half(
                    k_new, cos.reshape(b * n, 1, dh), sin.reshape(b * n, 1, dh), device=self.device
                )
            cache.write(li, slots, k_new, kv[:, 1])
            start = self.clock()
            k, v, _ = cache.gather(li, tables=tables)
            attn = ops.attention(q, k, v, causal=causal, mask=mask, device=self.device)  # (B, H, n, Dh)
            self.attention_seconds += self.clock() - start
            x = x + self._linear(attn.transpose(0, 2, 1, 3).reshape(b, n, h * dh), layer.w_out, layer.b_out)
            x = x + self._mlp(x, layer)
        last = self._norm(x[:, -1], w.lnf_weight, w.lnf_bias)
        return ops.matmul(last, w.lm_head, device=self.device)


def filter_logits(logits: np.ndarray, top_k: int | None = None, top_p: float | None = None) -> np.ndarray:
    """Logits ``(B, V)`` with everything outside the top-k and the top-p nucleus set to ``-inf``.

    Ties at the k-th value keep the lower token ids (stable order); the nucleus is the smallest
    prefix of tokens by probability whose mass reaches ``top_p`` (at least one token).
    """
    order = np.argsort(-logits, axis=-1, kind="stable")
    sorted_logits = np.take_along_axis(logits, order, axis=-1)
    keep = np.ones_like(sorted_logits, dtype=bool)
    if top_k is not None:
        keep[:, top_k:] = False
    if top_p is not None:
        z = np.where(keep, sorted_logits, -np.inf)
        p = np.exp(z - z[:, :1])
        p /= p.sum(axis=-1, keepdims=True)
        mass_before = np.cumsum(p, axis=-1) - p
        keep &= mass_before < top_p
    out = np.full_like(logits, -np.inf)
    np.put_along_axis(out, order, np.where(keep, sorted_logits, -np.inf), axis=-1)
    return out


def _sample(
    logits: np.ndarray,
    rng: np.random.Generator | None,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
) -> np.ndarray:
    """Next tokens ``(B,)``: argmax without ``rng``, else an inverse-CDF draw from the filtered softmax."""
    logits = logits.astype(np.float64)
    if rng is None:
        return np.argmax(logits, axis=-1)
    z = filter_logits(logits / temperature, top_k, top_p)
    p = np.exp(z - z.max(axis=-1, keepdims=True))
    cdf = np.cumsum(p, axis=-1)
    u = rng.random(len(z)) * cdf[:, -1]
    return np.minimum((cdf <= u[:, None]).sum(axis=-1), z.shape[-1] - 1)


def _prompts(input_ids: Any, vocab: int) -> list[np.ndarray]:
    if isinstance(input_ids, (str, bytes)):
        rows = []
    elif isinstance(input_ids, np.ndarray) and input_ids.ndim in (1, 2):
        rows = [input_ids] if input_ids.ndim == 1 else list(input_ids)
    elif (
        isinstance(input_ids, Sequence)
        and input_ids
        and all(isinstance(t, (int, np.integer)) for t in input_ids)
    ):
        rows = [np.asarray(input_ids)]
    elif isinstance(input_ids, Sequence) and input_ids:
        rows = [np.asarray(r) for r in input_ids]
    else:
        rows = []
    if not rows:
        raise InvalidArgument(
            "generate",
            f"input_ids must be token ids: a list, a list of lists or a 1-/2-D array, got {input_ids!r}",
        )
    out = []
    for i, r in enumerate(rows):
        if r.ndim != 1 or r.size == 0 or r.dtype.kind not in "iu":
            raise InvalidArgument("generate", f"prompt {i} must be a non-empty 1-D list of ints, got {r!r}")
        if r.min() < 0 or r.max() >= vocab:
            raise InvalidArgument("generate", f"prompt {i} has token ids outside [0, {vocab}): {r.tolist()}")
        out.append(r.astype(np.int64))
    return out


def _is_int(x: object) -> bool:
    return isinstance(x, (int, np.integer)) and not isinstance(x, bool)


def _check_sampling(
    do_sample: bool,
    temperature: float,
    top_k: int | None,
    top_p: float | None,
    r: int,
    max_new: int,
    num_beams: int = 1,
) -> None:
    def bad(what: str, got: object, fix: str | None = None) -> InvalidArgument:
        return InvalidArgument("generate", f"{what}, got {got!r}", fix)

    if not _is_int(max_new) or max_new < 1:
        raise bad("max_new_tokens must be an int >= 1", max_new)
    if not _is_int(r) or r < 1:
        raise bad("num_return_sequences must be an int >= 1", r)
    if not do_sample and num_beams == 1 and r > 1:
        raise bad(
            "greedy decoding returns one sequence per prompt: num_return_sequences must be 1", r,
            "pass do_sample=True to draw several samples per prompt, or num_beams >= "
            "num_return_sequences for the best beams",
        )  # fmt: skip
    if not temperature > 0:
        raise bad("temperature must be > 0", temperature, "use do_sample=False for greedy decoding")
    if top_k is not None and (
        isinstance(top_k, bool) or not isinstance(top_k, (int, np.integer)) or top_k < 1
    ):
        raise bad("top_k must be an int >= 1 or None", top_k)
    if top_p is not None and not 0 < top_p <= 1:
        raise bad("top_p must be in (0, 1] or None", top_p)


def _check_beams(num_beams: int, do_sample: bool, length_penalty: float, early_stopping: bool | str) -> None:
    def bad(what: str, got: object, fix: str | None = None) -> InvalidArgument:
        return InvalidArgument("generate", f"{what}, got {got!r}", fix)

    if not _is_int(num_beams) or num_beams < 1:
        raise bad("num_beams must be an int >= 1 (1: no beam search)", num_beams)
    if (
        isinstance(length_penalty, bool)
        or not isinstance(length_penalty, (int, float, np.integer, np.floating))
        or not np.isfinite(length_penalty)
    ):
        raise bad("length_penalty must be a finite number", length_penalty)
    if not isinstance(early_stopping, (bool, np.bool_)) and early_stopping != "never":
        raise bad('early_stopping must be True, False or "never"', early_stopping)
    if do_sample and num_beams > 1:
        raise InvalidArgument(
            "generate", f"do_sample=True with num_beams={num_beams} (beam-search sampling) is not supported",
            "pass do_sample=False for beam search, or num_beams=1 to sample",
        )  # fmt: skip


def generate(
    model: DecoderWeights | Any,
    input_ids: Any,
    *,
    max_new_tokens: int = 16,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_k: int | None = None,
    top_p: float | None = None,
    num_return_sequences: int = 1,
    num_beams: int = 1,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
    eos_token_id: int | None = None,
    seed: int | np.random.Generator | None = None,
    cache: PagedKVCache | None = None,
    block_size: int = 16,
    on_step: Callable[[int, np.ndarray], None] | None = None,
    device: str | None = None,
) -> GenerateOutput:
    """Generate up to ``max_new_tokens`` tokens per prompt with a paged KV cache.

    ``model``: ``DecoderWeights`` or a GPT-style ONNX model (``ModelProto``, path or bytes).
    ``input_ids``: one prompt (list / 1-D array) or several (list of lists, possibly ragged, or 2-D).
    Greedy unless ``do_sample``; sampling divides logits by ``temperature``, keeps the ``top_k``
    tokens and the ``top_p`` nucleus, and draws from ``seed`` (an int or a Generator). A sequence
    stops at ``eos_token_id`` (kept in its tokens) or after ``max_new_tokens``; its blocks are freed
    at once. ``num_beams > 1`` runs beam search (transformers' semantics: ``length_penalty``,
    ``early_stopping`` True / False / "never"; the ``num_return_sequences`` best hypotheses per
    prompt, best first, their scores in ``GenerateOutput.scores``). ``cache`` defaults to a pool
    holding every sequence at full length. ``on_step(step, tokens)`` is called with each step's new
    tokens (one per live sequence or running beam).
    """
    weights = model if isinstance(model, DecoderWeights) else DecoderWeights.from_onnx(model)
    prompts = _prompts(input_ids, weights.vocab_size)
    r = num_return_sequences
    _check_beams(num_beams, do_sample, length_penalty, early_stopping)
    _check_sampling(do_sample, temperature, top_k, top_p, r, max_new_tokens, num_beams)
    if num_beams > 1 and r > min(num_beams, weights.vocab_size):
        raise InvalidArgument(
            "generate", f"num_return_sequences must be <= num_beams ({num_beams}) and the vocabulary size "
            f"({weights.vocab_size}): beam search returns the best of its hypotheses, got {r}",
            f"pass num_return_sequences <= {min(num_beams, weights.vocab_size)}"
            + (" or raise num_beams" if num_beams < weights.vocab_size else ""),
        )  # fmt: skip
    longest = max(len(p) for p in prompts) + max_new_tokens - 1  # the last token's K/V is never needed
    if longest > weights.max_positions:
        raise InvalidArgument(
            "generate", f"the longest prompt ({max(len(p) for p in prompts)} tokens) plus max_new_tokens "
            f"({max_new_tokens}) needs {longest} positions, the model has {weights.max_positions}",
            "shorten the prompt or lower max_new_tokens",
        )  # fmt: skip
    if cache is None and num_beams > 1:  # the shared prompt blocks once, num_beams sequences' own blocks
        blocks = sum(
            beam_blocks_bound(len(p), len(p) + max_new_tokens, num_beams, block_size) for p in prompts
        )
    elif cache is None:
        blocks = sum(r * -(-(len(p) + max_new_tokens) // block_size) for p in prompts)
    if cache is None:
        cache = PagedKVCache(
            num_layers=weights.num_layers, num_kv_heads=weights.num_kv_heads, head_dim=weights.head_dim,
            num_blocks=blocks, block_size=block_size, dtype=weights.wte.dtype,
        )  # fmt: skip
    runner = DecoderRunner(weights, cache, device)
    peak: dict[str, float | int] = {}
    timings = {"prefill_s": 0.0, "decode_s": 0.0, "decode_steps": 0, "attention_s": 0.0}

    def note_peak() -> None:
        nonlocal peak
        if not peak or cache.num_blocks - cache.num_free_blocks >= peak["used_blocks"]:
            peak = cache.stats()

    if num_beams > 1:
        early = "never" if isinstance(early_stopping, str) else bool(early_stopping)
        beams, beam_reasons, scores = beam_search(
            runner, prompts, num_beams=num_beams, max_new_tokens=max_new_tokens, eos_token_id=eos_token_id,
            length_penalty=float(length_penalty), early_stopping=early, num_return_sequences=r,
            on_step=on_step, on_forward=note_peak, timings=timings,
        )  # fmt: skip
        seqs = [prompts[i // r].tolist() + toks for i, toks in enumerate(beams)]
        return GenerateOutput(seqs, beams, beam_reasons, peak, timings, scores)
    rng = (
        (seed if isinstance(seed, np.random.Generator) else np.random.default_rng(seed))
        if do_sample
        else None
    )
    new: list[list[int]] = [[] for _ in range(len(prompts) * r)]
    reasons = ["length"] * len(new)
    live: dict[int, int] = {}  # output index -> cache sequence
    try:
        start = time.perf_counter()
        rows = []
        for bi, prompt in enumerate(prompts):
            seq = cache.add_sequence()
            live[bi * r] = seq
            rows.append(runner.forward([seq], prompt[None]))
            for j in range(1, r):
                live[bi * r + j] = cache.fork(seq)
        logits = np.repeat(np.concatenate(rows), r, axis=0)
        timings["prefill_s"] = time.perf_counter() - start
        note_peak()
        start, attn0 = time.perf_counter(), runner.attention_seconds
        for step in range(max_new_tokens):
            order = list(live)
            tokens = _sample(logits, rng, temperature, top_k, top_p)
            for out_idx, tok in zip(order, tokens.tolist(), strict=True):
                new[out_idx].append(int(tok))
                if eos_token_id is not None and tok == eos_token_id:
                    reasons[out_idx] = "eos"
                    cache.free(live.pop(out_idx))
            if on_step is not None:
                on_step(step, tokens)
            if not live or step == max_new_tokens - 1:
                break
            still = [i for i, o in enumerate(order) if o in live]
            logits = runner.forward([live[o] for o in order if o in live], tokens[still, None])
            timings["decode_steps"] += 1
            note_peak()
        timings["decode_s"] = time.perf_counter() - start
        timings["attention_s"] = runner.attention_seconds - attn0
    finally:
        for seq in live.values():
            cache.free(seq)
    sequences = [prompts[i // r].tolist() + toks for i, toks in enumerate(new)]
    return GenerateOutput(sequences, new, reasons, peak, timings)
