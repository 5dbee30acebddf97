"""generate(num_beams=k): equals a brute-force beam search that recomputes every hypothesis without a cache.

The reference is transformers' (5.x) beam search written out plainly: every step runs each beam's
whole sequence through an ``InferenceSession`` on the exported model, sorts all (beam, token)
candidates with Python's ``sorted``, and keeps hypotheses in a list. Cached and recomputed logits
differ by ~1e-6 per step, so the reference also reports the smallest gap between two scores a
decision rested on (the last kept beam vs the next candidate, a candidate at the ``num_beams`` cut
when it can finish, a new hypothesis vs the worst kept, the stop rule, the final order): a gap under
``TIE`` could flip the decision either way, and such cases are skipped (property test) or must not
occur (fixed cases).
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

import opstrata.runtime as rt
from opstrata.runtime._beam import beam_search

pytest.importorskip("onnx")

TIE = 1e-4


def _log_softmax_last(sess: rt.InferenceSession, rows: list[list[int]]) -> np.ndarray:
    (logits,) = sess.run(["logits"], {"ids": np.array(rows, np.int64)})
    z = logits[:, -1].astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def reference_beam_search(
    sess: rt.InferenceSession,
    prompt: list[int],
    *,
    k: int,
    max_new: int,
    eos: int | None = None,
    length_penalty: float = 1.0,
    early_stopping: bool | str = False,
) -> tuple[list[tuple[float, list[int], str]], float]:
    """Finished hypotheses ``(score, new tokens, reason)`` best first, and the smallest compared gap."""
    beams: list[tuple[float, list[int]]] = [(0.0, [])]  # (sum of log-probabilities, new tokens)
    finished: list[tuple[float, list[int], str]] = []
    gaps = [np.inf]

    def add(tokens: list[int], total: float, reason: str) -> None:
        score = total / len(tokens) ** length_penalty
        if len(finished) == k:
            gaps.append(abs(score - finished[-1][0]))
        if len(finished) < k or score > finished[-1][0]:
            finished.append((score, tokens, reason))
            finished.sort(key=lambda h: -h[0])
            gaps.extend(a[0] - b[0] for a, b in itertools.pairwise(finished))  # who is dropped
            del finished[k:]

    for step in range(max_new):
        last = step == max_new - 1  # every candidate ends here
        logp = _log_softmax_last(sess, [prompt + toks for _, toks in beams])
        cands = sorted(
            ((total + logp[i, tok], i, tok) for i, (total, _) in enumerate(beams) for tok in range(logp.shape[1])),
            key=lambda c: -c[0],
        )  # fmt: skip
        if len(cands) > k and (last or eos in (cands[k - 1][2], cands[k][2])):
            gaps.append(cands[k - 1][0] - cands[k][0])  # which candidates are among the best k?
        running = []
        for rank, (total, i, tok) in enumerate(cands[: 2 * k]):
            if rank < k and (tok == eos or last):  # the best k candidates that end are hypotheses
                add(beams[i][1] + [tok], total, "eos" if tok == eos else "length")
            elif tok != eos and not last and len(running) < k:
                running.append((total, beams[i][1] + [tok]))
                if len(running) == k:
                    following = [c[0] for c in cands[rank + 1 :] if c[2] != eos][:1]
                    gaps += [total - c for c in following]  # the last beam kept vs the first dropped
        if not running:
            break
        if len(finished) == k:  # can the best running beam still beat the worst hypothesis?
            if early_stopping is True:
                break
            n = max_new if early_stopping == "never" and length_penalty > 0 else step + 1
            best_possible = running[0][0] / n**length_penalty
            gaps.append(abs(finished[-1][0] - best_possible))
            if finished[-1][0] >= best_possible:
                break
        beams = running
    gaps += [a[0] - b[0] for a, b in itertools.pairwise(finished)]
    return finished, min(gaps)


def _blocks_bound(prompt_len: int, length: int, k: int, block_size: int) -> int:
    """Blocks k beams of ``length`` tokens need when they share the prompt's full blocks."""
    shared = prompt_len // block_size
    return shared + k * (-(-length // block_size) - shared)


def _check_against_reference(
    sess: rt.InferenceSession,
    w: rt.DecoderWeights,
    prompts: list[list[int]],
    *,
    k: int,
    r: int,
    max_new: int,
    block_size: int,
    skip_ties: bool = False,
    **kw: object,
) -> tuple[rt.GenerateOutput, list[list[tuple[float, list[int], str]]]]:
    """Run generate and the reference; compare tokens, reasons, scores, the cache bound and leaks."""
    refs, gaps = zip(
        *(
            reference_beam_search(
                sess, p, k=k, max_new=max_new, eos=kw.get("eos_token_id"),  # type: ignore[arg-type]
                length_penalty=kw.get("length_penalty", 1.0), early_stopping=kw.get("early_stopping", False),  # type: ignore[arg-type]
            )
            for p in prompts
        ),
        strict=True,
    )  # fmt: skip
    if skip_ties:
        assume(min(gaps) > TIE)
    else:
        assert min(gaps) > TIE, "pick another case: a near tie makes the reference ambiguous"
    num_blocks = sum(_blocks_bound(len(p), len(p) + max_new, k, block_size) for p in prompts)
    cache = rt.PagedKVCache(
        num_layers=w.num_layers, num_kv_heads=w.num_kv_heads, head_dim=w.head_dim,
        num_blocks=num_blocks, block_size=block_size,
    )  # fmt: skip
    held: list[tuple[int, int]] = []

    def on_step(step: int, tokens: np.ndarray) -> None:  # beams hold prompt + step tokens here
        cache.check_invariants()
        bound = sum(_blocks_bound(len(p), len(p) + step, k, block_size) for p in prompts)
        held.append((int(cache.stats()["used_blocks"]), bound))

    out = rt.generate(
        w, prompts, num_beams=k, num_return_sequences=r, max_new_tokens=max_new, block_size=block_size,
        cache=cache, on_step=on_step, **kw,  # type: ignore[arg-type]
    )  # fmt: skip
    want = [h for ref in refs for h in ref[:r]]
    assert out.new_tokens == [toks for _, toks, _ in want]
    assert out.finish_reasons == [reason for _, _, reason in want]
    assert out.sequences == [prompts[i // r] + toks for i, toks in enumerate(out.new_tokens)]
    assert out.scores is not None
    np.testing.assert_allclose(out.scores, [s for s, _, _ in want], rtol=1e-5, atol=1e-5)
    assert all(used <= bound for used, bound in held), held
    peak_bound = sum(_blocks_bound(len(p), len(p) + max_new - 1, k, block_size) for p in prompts)
    assert out.kv_stats["used_blocks"] <= peak_bound  # the fullest step, K/V of the new tokens written
    assert cache.sequences() == [] and cache.num_free_blocks == num_blocks  # nothing leaked
    cache.check_invariants()
    return out, list(refs)


@pytest.fixture(scope="module")
def gqa() -> tuple[rt.DecoderWeights, rt.InferenceSession]:
    w = rt.DecoderWeights.random(vocab=24, hidden=32, heads=4, kv_heads=2, layers=2, max_pos=32, seed=11)
    return w, rt.InferenceSession(w.to_onnx())


PROMPTS = [[3, 1, 4, 1, 5, 9, 2, 6, 5], [7], [2, 7, 18, 2, 8]]  # ragged: 9, 1 and 5 tokens


@pytest.mark.parametrize("k", [2, 3, 5])
def test_beam_search_equals_the_reference_on_a_ragged_batch(gqa: tuple, k: int) -> None:
    w, sess = gqa
    out, _ = _check_against_reference(sess, w, PROMPTS, k=k, r=k, max_new=8, block_size=4)
    assert out.finish_reasons == ["length"] * 3 * k
    for b in range(3):  # best first
        scores = out.scores[b * k : (b + 1) * k]
        assert scores == sorted(scores, reverse=True)
    # beams share more than the prompt: the peak holds fewer blocks than k unshared sequences would
    unshared = sum(k * -(-(len(p) + 7) // 4) for p in PROMPTS)
    assert out.kv_stats["used_blocks"] < unshared and out.kv_stats["num_forks"] > 0
    steps: list[tuple[int, int]] = []  # on_step sees every running beam's new token, the last step too
    rt.generate(w, PROMPTS, num_beams=k, max_new_tokens=8, on_step=lambda i, t: steps.append((i, len(t))))
    assert steps == [(i, 3 * k) for i in range(8)]


@pytest.mark.parametrize(
    ("k", "length_penalty", "early_stopping"),
    [(2, 1.0, False), (3, 2.0, False), (3, 0.0, True), (4, -0.5, False), (3, 1.0, "never"), (2, 2.0, True)],
)
def test_beam_search_with_eos_and_length_penalty_equals_the_reference(
    gqa: tuple, k: int, length_penalty: float, early_stopping: bool | str
) -> None:
    w, sess = gqa
    plain = rt.generate(w, PROMPTS, num_beams=k, max_new_tokens=8, num_return_sequences=k)
    counts = np.bincount([t for toks in plain.new_tokens for t in toks], minlength=w.vocab_size)
    eos = int(np.argmax(counts))  # the token the beams use most: hypotheses do end on it
    out, _ = _check_against_reference(
        sess, w, PROMPTS, k=k, r=min(2, k), max_new=8, block_size=4, eos_token_id=eos,
        length_penalty=length_penalty, early_stopping=early_stopping,
    )  # fmt: skip
    assert any(eos in toks[:-1] for toks in plain.new_tokens)  # without eos handling the beams run past it
    for toks, reason in zip(out.new_tokens, out.finish_reasons, strict=True):
        assert (toks[-1] == eos) == (reason == "eos") and eos not in toks[:-1]


def test_length_penalty_changes_which_hypothesis_wins(gqa: tuple) -> None:
    """With eos, a high penalty exponent favours long hypotheses and a negative one short ones."""
    w, sess = gqa
    prompt = PROMPTS[0]
    plain = rt.generate(w, prompt, num_beams=4, max_new_tokens=8, num_return_sequences=4)
    eos = int(np.argmax(np.bincount([t for toks in plain.new_tokens for t in toks])))
    lengths = {}
    for lp in (-2.0, 3.0):
        out = rt.generate(w, prompt, num_beams=4, max_new_tokens=8, eos_token_id=eos, length_penalty=lp)
        ref, _ = reference_beam_search(sess, prompt, k=4, max_new=8, eos=eos, length_penalty=lp)
        assert out.new_tokens[0] == ref[0][1]
        lengths[lp] = len(out.new_tokens[0])
    assert lengths[-2.0] < lengths[3.0]


def test_num_beams_1_is_greedy_and_equals_the_reference_with_one_beam(gqa: tuple) -> None:
    w, sess = gqa
    greedy = rt.generate(w, PROMPTS, max_new_tokens=8)
    one = rt.generate(w, PROMPTS, max_new_tokens=8, num_beams=1)
    assert one.new_tokens == greedy.new_tokens and one.scores is None
    for prompt, toks in zip(PROMPTS, one.new_tokens, strict=True):
        ref, _ = reference_beam_search(sess, prompt, k=1, max_new=8)
        assert ref[0][1] == toks
        eos = toks[3]  # stop greedy at its 4th token; one beam stops there too
        cut = rt.generate(w, prompt, max_new_tokens=8, num_beams=1, eos_token_id=eos).new_tokens[0]
        ref_eos, _ = reference_beam_search(sess, prompt, k=1, max_new=8, eos=eos)
        assert cut == ref_eos[0][1] == toks[: toks.index(eos) + 1]


@pytest.fixture(scope="module")
def small() -> tuple[rt.DecoderWeights, rt.InferenceSession]:
    w = rt.DecoderWeights.random(vocab=12, hidden=16, heads=2, kv_heads=1, layers=1, max_pos=16, seed=5)
    return w, rt.InferenceSession(w.to_onnx())


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(
    k=st.integers(2, 4),
    prompts=st.lists(st.lists(st.integers(0, 11), min_size=1, max_size=6), min_size=1, max_size=3),
    max_new=st.integers(1, 6),
    eos=st.one_of(st.none(), st.integers(0, 11)),
    length_penalty=st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.0]),
    early_stopping=st.sampled_from([False, True, "never"]),
    block_size=st.integers(1, 5),
    data=st.data(),
)
def test_beam_search_property_equals_the_reference(
    small: tuple, k: int, prompts: list[list[int]], max_new: int, eos: int | None, length_penalty: float,
    early_stopping: bool | str, block_size: int, data: st.DataObject,
) -> None:  # fmt: skip
    w, sess = small
    r = data.draw(st.integers(1, k), label="num_return_sequences")
    _check_against_reference(
        sess, w, prompts, k=k, r=r, max_new=max_new, block_size=block_size, skip_ties=True,
        eos_token_id=eos, length_penalty=length_penalty, early_stopping=early_stopping,
    )  # fmt: skip


def test_a_cache_too_small_for_the_beams_raises_and_frees_everything(gqa: tuple) -> None:
    w, _ = gqa
    cache = rt.PagedKVCache(
        num_layers=w.num_layers, num_kv_heads=w.num_kv_heads, head_dim=w.head_dim, num_blocks=4, block_size=4
    )
    with pytest.raises(rt.KVCacheFullError, match="out of blocks"):
        rt.generate(w, PROMPTS[0], num_beams=4, max_new_tokens=8, cache=cache)
    assert cache.sequences() == [] and cache.num_free_blocks == 4
    cache.check_invariants()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_beams": 0}, r"num_beams must be an int >= 1 \(1: no beam search\), got 0"),
        ({"num_beams": 2.0}, r"num_beams must be an int >= 1 .*got 2\.0"),
        ({"num_beams": True}, r"num_beams must be an int >= 1 .*got True"),
        (
            {"num_beams": 3, "num_return_sequences": 4},
            r"num_return_sequences must be <= num_beams \(3\).*got 4\. Fix: pass num_return_sequences <= 3",
        ),
        (
            {"num_beams": 2, "do_sample": True},
            r"do_sample=True with num_beams=2 \(beam-search sampling\) is not supported\. "
            r"Fix: pass do_sample=False for beam search, or num_beams=1 to sample",
        ),
        ({"num_beams": 2, "length_penalty": float("nan")}, "length_penalty must be a finite number, got nan"),
        ({"num_beams": 2, "early_stopping": "sometimes"}, "early_stopping must be True, False or \"never\", got 'sometimes'"),
        ({"num_return_sequences": 2}, "or num_beams >= num_return_sequences"),
    ],
)  # fmt: skip
def test_bad_beam_arguments_name_the_argument_expected_and_actual(
    gqa: tuple, kwargs: dict, match: str
) -> None:
    with pytest.raises(rt.InvalidArgument, match=match):
        rt.generate(gqa[0], [1, 2, 3], max_new_tokens=4, **kwargs)


def test_more_return_sequences_than_tokens_is_an_error() -> None:
    w = rt.DecoderWeights.random(vocab=3, hidden=8, heads=2, layers=1, max_pos=8, seed=0)
    with pytest.raises(
        rt.InvalidArgument, match=r"vocabulary size \(3\).*got 4\. Fix: pass num_return_sequences <= 3$"
    ):
        rt.generate(w, [0, 1], num_beams=5, num_return_sequences=4, max_new_tokens=2)
    out = rt.generate(w, [0, 1], num_beams=5, num_return_sequences=3, max_new_tokens=1)
    assert sorted(t[0] for t in out.new_tokens) == [0, 1, 2]  # every token once, a vocabulary of 3


class _ScriptedRunner:
    """Stands in for DecoderRunner: next-token probabilities looked up by a sequence's new tokens.

    The tokens live in the cache itself (as 1-wide K/V), so the lookup reads them back through the
    block tables: forks and copy on write must carry every beam's history correctly.
    """

    def __init__(self, table: dict[tuple[int, ...], list[float]], vocab: int, prompt_len: int) -> None:
        self.cache = rt.PagedKVCache(num_layers=1, num_kv_heads=1, head_dim=1, num_blocks=64, block_size=2)
        self.table, self.vocab, self.prompt_len = table, vocab, prompt_len
        self.attention_seconds = 0.0

    def forward(self, seqs: list[int], tokens: np.ndarray) -> np.ndarray:
        slots = self.cache.reserve(list(seqs), tokens.shape[1])
        values = tokens.reshape(-1, 1, 1).astype(np.float32)
        self.cache.write(0, slots, values, values)
        k, _, lengths = self.cache.gather(0, list(seqs))
        rows = []
        for row, n in zip(k[:, 0, :, 0], lengths, strict=True):
            new = tuple(int(t) for t in row[self.prompt_len : n])
            rows.append(np.log(self.table.get(new, [1 / self.vocab] * self.vocab)))
        return np.array(rows)


def _scripted(
    table: dict[tuple[int, ...], list[float]], k: int, max_new: int, r: int, **kw: object
) -> tuple[list[list[int]], list[str], list[float]]:
    runner = _ScriptedRunner(table, vocab=5, prompt_len=1)
    out = beam_search(
        runner, [np.array([4])], num_beams=k, max_new_tokens=max_new, eos_token_id=0, num_return_sequences=r,
        on_step=None, on_forward=lambda: None, timings={"decode_steps": 0},
        **{"length_penalty": 1.0, "early_stopping": False, **kw},  # type: ignore[arg-type]
    )  # fmt: skip
    assert runner.cache.sequences() == []
    return out


def _score(*probs: float) -> float:
    return float(np.sum(np.log(probs))) / len(probs)


def test_an_eos_candidate_outside_the_best_num_beams_is_not_a_hypothesis() -> None:
    """Step 2 ranks: (1,eos) (2,eos) (3,4) (3,eos) ...: the eos at rank 3 = num_beams is skipped (as in HF)."""
    table = {
        (): [0.01, 0.4, 0.3, 0.28, 0.01],
        (1,): [0.9, 0.04, 0.03, 0.02, 0.01],
        (2,): [0.9, 0.05, 0.02, 0.02, 0.01],
        (3,): [0.45, 0.01, 0.01, 0.01, 0.52],
        (3, 4): [0.5, 0.2, 0.1, 0.1, 0.1],
    }
    new, reasons, scores = _scripted(table, k=3, max_new=3, r=3, early_stopping=True)
    # (3, eos) never counts: the third hypothesis is (3, 4, eos) one step later
    assert new == [[1, 0], [2, 0], [3, 4, 0]] and reasons == ["eos"] * 3
    np.testing.assert_allclose(scores, [_score(0.4, 0.9), _score(0.3, 0.9), _score(0.28, 0.52, 0.5)])


def test_early_stopping_true_drops_the_running_beams_once_num_beams_hypotheses_exist() -> None:
    table = {
        (): [0.349, 0.4, 0.249, 0.001, 0.001],
        (1,): [0.4, 0.0005, 0.0005, 0.598, 0.001],
        (1, 3): [0.1, 0.6, 0.1, 0.1, 0.1],
    }
    new, reasons, scores = _scripted(table, k=2, max_new=3, r=2, early_stopping=True)
    assert new == [[1, 0], [0]] and reasons == ["eos", "eos"]  # not (1, 3, 1), though it scores higher
    np.testing.assert_allclose(scores, [_score(0.4, 0.4), _score(0.349)])
    new, reasons, scores = _scripted(table, k=2, max_new=3, r=2, early_stopping=False)
    assert new == [[1, 3, 1], [1, 0]] and reasons == ["length", "eos"]  # (1, 3) could still win: it did
    np.testing.assert_allclose(scores, [_score(0.4, 0.598, 0.6), _score(0.4, 0.4)])
    # at max_new_tokens the best num_beams candidates all finish, running or eos, even with early stopping
    new, reasons, _ = _scripted(table, k=2, max_new=2, r=2, early_stopping=True)
    assert new == [[1, 3], [1, 0]] and reasons == ["length", "eos"]


def test_early_stopping_never_keeps_searching_while_a_longer_hypothesis_could_win() -> None:
    """After step 2 the best running beam cannot beat the worst hypothesis at its length (False stops),
    but it could at max_new_tokens = 3 ("never" goes on and finds a better 3-token hypothesis)."""
    table = {
        (): [0.6, 0.3, 0.098, 0.001, 0.001],
        (1,): [0.52, 0.001, 0.001, 0.477, 0.001],
        (1, 3): [0.05, 0.001, 0.001, 0.001, 0.947],
    }
    new, _, scores = _scripted(table, k=2, max_new=3, r=2, early_stopping=False)
    assert new == [[0], [1, 0]]
    np.testing.assert_allclose(scores, [_score(0.6), _score(0.3, 0.52)])
    new, reasons, scores = _scripted(table, k=2, max_new=3, r=2, early_stopping="never")
    assert new == [[0], [1, 3, 4]] and reasons == ["eos", "length"]
    np.testing.assert_allclose(scores, [_score(0.6), _score(0.3, 0.477, 0.947)])
