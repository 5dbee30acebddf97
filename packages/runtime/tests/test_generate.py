"""generate(): cached decoding equals recomputing the whole sequence; sampling, forks, eos and errors."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

import opstrata.runtime as rt
from opstrata.graph.testing import bert_block_model, gpt_block_model
from opstrata.runtime import DecoderRunner
from opstrata.runtime._generate import _sample, filter_logits

pytest.importorskip("onnx")


def _recompute_greedy(
    sess: rt.InferenceSession, prompt: list[int], n: int
) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens by running the whole growing sequence through the session (no cache), and each step's logits."""
    ids = np.array([prompt], np.int64)
    tokens, logits = [], []
    for _ in range(n):
        (out,) = sess.run(["logits"], {"ids": ids})
        logits.append(out[0, -1])
        tokens.append(int(np.argmax(out[0, -1])))
        ids = np.concatenate([ids, [[tokens[-1]]]], axis=1)
    return tokens, logits


@pytest.fixture(scope="module")
def gpt() -> tuple[object, rt.InferenceSession]:
    model = gpt_block_model(hidden=32, heads=4, vocab=50, max_pos=24)
    return model, rt.InferenceSession(model)


def test_greedy_equals_recomputing_the_whole_sequence_on_the_gpt_block(gpt: tuple) -> None:
    model, sess = gpt
    prompt = [3, 7, 1, 9, 4, 0, 22]
    out = rt.generate(model, prompt, max_new_tokens=12, block_size=4)  # the ONNX model itself
    want, _ = _recompute_greedy(sess, prompt, 12)
    assert out.new_tokens == [want] and out.sequences == [prompt + want] and out.finish_reasons == ["length"]
    assert out.timings["decode_steps"] == 11 and out.kv_stats["used_blocks"] == 5  # 7 + 11 tokens in 4-blocks


def test_cached_logits_match_the_session_at_every_step(gpt: tuple) -> None:
    model, sess = gpt
    w = rt.DecoderWeights.from_onnx(model)
    cache = rt.PagedKVCache(num_layers=1, num_kv_heads=4, head_dim=8, num_blocks=8, block_size=4)
    runner = DecoderRunner(w, cache)
    prompt = [5, 1, 2]
    want_tokens, want_logits = _recompute_greedy(sess, prompt, 8)
    seq = cache.add_sequence()
    logits = runner.forward([seq], np.array([prompt]))
    for tok, want in zip(want_tokens, want_logits, strict=True):
        np.testing.assert_allclose(logits[0], want, rtol=1e-4, atol=1e-5)
        logits = runner.forward([seq], np.array([[tok]]))
    assert cache.length(seq) == len(prompt) + len(want_tokens)


@pytest.mark.parametrize(("kv_heads", "layers"), [(4, 2), (2, 2), (1, 3)])
def test_gqa_multilayer_ragged_batch_equals_recompute(kv_heads: int, layers: int) -> None:
    w = rt.DecoderWeights.random(
        vocab=60, hidden=32, heads=4, kv_heads=kv_heads, layers=layers, max_pos=32, seed=7
    )
    sess = rt.InferenceSession(w.to_onnx())
    prompts = [[1, 2, 3], [5, 6, 7, 8, 9, 10, 11], [42]]
    out = rt.generate(w, prompts, max_new_tokens=9, block_size=4)
    for prompt, got in zip(prompts, out.new_tokens, strict=True):
        assert got == _recompute_greedy(sess, prompt, 9)[0]


def test_onnx_export_round_trips_and_matches_onnxruntime() -> None:
    w = rt.DecoderWeights.random(vocab=40, hidden=24, heads=6, kv_heads=2, layers=2, max_pos=16, seed=3)
    model = w.to_onnx()
    back = rt.DecoderWeights.from_onnx(model.SerializeToString())
    assert back.config() == w.config()
    for a, b in zip(back.layers, w.layers, strict=True):
        for name in ("w_qkv", "b_qkv", "w_out", "b_out", "ln2_weight", "w_fc", "b_proj"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    np.testing.assert_array_equal(back.lm_head, w.lm_head)
    pytest.importorskip("onnxruntime")
    from opstrata.graph.testing import ort_run

    feeds = {"ids": np.array([[1, 5, 9, 2, 0]], np.int64)}
    (got,) = rt.InferenceSession(model).run(None, feeds)
    np.testing.assert_allclose(got, ort_run(model, feeds)["logits"], rtol=1e-4, atol=1e-5)


def test_sampling_is_reproducible_by_seed_and_varies_across_seeds(gpt: tuple) -> None:
    model, _ = gpt
    kw = {"max_new_tokens": 8, "do_sample": True, "temperature": 1.5, "num_return_sequences": 3}
    a = rt.generate(model, [1, 2, 3], seed=11, **kw)
    b = rt.generate(model, [1, 2, 3], seed=11, **kw)
    assert a.new_tokens == b.new_tokens
    others = [rt.generate(model, [1, 2, 3], seed=s, **kw).new_tokens for s in (12, 13)]
    assert any(o != a.new_tokens for o in others)
    assert len({tuple(t) for t in a.new_tokens}) > 1  # the forked samples differ from each other


def test_top_k_1_and_a_tiny_nucleus_equal_greedy(gpt: tuple) -> None:
    model, _ = gpt
    greedy = rt.generate(model, [4, 4, 8], max_new_tokens=10).new_tokens[0]
    k1 = rt.generate(model, [4, 4, 8], max_new_tokens=10, do_sample=True, temperature=0.7, top_k=1,
                     num_return_sequences=3, seed=0)  # fmt: skip
    p0 = rt.generate(model, [4, 4, 8], max_new_tokens=10, do_sample=True, top_p=1e-9, seed=1)
    assert k1.new_tokens == [greedy] * 3 and p0.new_tokens == [greedy]


def test_filter_logits_top_k_and_top_p_on_constructed_rows() -> None:
    logits = np.log(np.array([[0.05, 0.5, 0.15, 0.3], [0.25, 0.25, 0.25, 0.25]]))
    kept = np.isfinite(filter_logits(logits, top_k=2))
    assert kept.tolist() == [[False, True, False, True], [True, True, False, False]]  # ties: lower ids
    assert np.isfinite(filter_logits(logits, top_p=0.79))[0].tolist() == [False, True, False, True]
    assert np.isfinite(filter_logits(logits, top_p=0.81))[0].tolist() == [False, True, True, True]
    assert np.isfinite(filter_logits(logits, top_k=3, top_p=0.99))[0].tolist() == [False, True, True, True]
    np.testing.assert_array_equal(filter_logits(logits[:1], top_p=0.79)[0, [1, 3]], logits[0, [1, 3]])


def test_sampled_frequencies_follow_the_tempered_filtered_softmax() -> None:
    logits = np.tile(np.array([[2.0, 1.0, 0.0, -1.0, -3.0]]), (40000, 1))
    rng = np.random.default_rng(0)
    for temperature, top_k in ((1.0, None), (0.5, 3)):
        draws = _sample(logits, rng, temperature, top_k, None)
        z = logits[0] / temperature
        if top_k is not None:
            z[top_k:] = -np.inf
        want = np.exp(z - z.max()) / np.exp(z - z.max()).sum()
        freq = np.bincount(draws, minlength=5) / len(draws)
        np.testing.assert_allclose(freq, want, atol=0.01)


def test_return_sequences_share_the_prompt_blocks_copy_on_write(gpt: tuple) -> None:
    model, _ = gpt
    prompt = list(range(9))  # block_size 4: two full prompt blocks shared, the partial third copied on write
    out = rt.generate(
        model, prompt, max_new_tokens=3, do_sample=True, num_return_sequences=3, block_size=4, seed=5
    )
    s = out.kv_stats
    assert (s["num_forks"], s["num_cow_copies"], s["shared_blocks"]) == (2, 2, 2)
    assert s["used_blocks"] == 2 + 3  # vs 3 * 3 without sharing
    # the last step holding the most blocks: 3 x 11 tokens, the 8 in full prompt blocks stored once
    assert s["logical_tokens"] == 3 * 11 and s["physical_tokens"] == 8 + 3 * 3


def test_eos_stops_a_sequence_and_the_batch_continues(gpt: tuple) -> None:
    model, _ = gpt
    a, b = [3, 7, 1], [2, 2, 9, 30]
    solo_a = rt.generate(model, a, max_new_tokens=8).new_tokens[0]
    solo_b = rt.generate(model, b, max_new_tokens=8).new_tokens[0]
    eos = solo_a[2]
    if eos in solo_b:  # the test needs b to run on: pick an a token b never produces
        eos = next(t for t in solo_a if t not in solo_b)
    cut = solo_a.index(eos) + 1
    steps: list[int] = []
    cache = rt.PagedKVCache(num_layers=1, num_kv_heads=4, head_dim=8, num_blocks=12, block_size=4)
    out = rt.generate(model, [a, b], max_new_tokens=8, eos_token_id=eos, cache=cache,
                      on_step=lambda step, toks: steps.append(len(toks)))  # fmt: skip
    assert out.new_tokens == [solo_a[:cut], solo_b] and out.finish_reasons == ["eos", "length"]
    assert steps == [2] * cut + [1] * (8 - cut)
    assert cache.num_free_blocks == 12 and cache.sequences() == []  # every block given back


def test_a_cache_too_small_raises_kv_cache_full_and_frees_what_it_took(gpt: tuple) -> None:
    model, _ = gpt
    cache = rt.PagedKVCache(num_layers=1, num_kv_heads=4, head_dim=8, num_blocks=2, block_size=4)
    with pytest.raises(rt.KVCacheFullError, match="out of blocks") as err:
        rt.generate(model, [1, 2, 3, 4, 5, 6], max_new_tokens=6, cache=cache)
    assert "num_blocks" in str(err.value)
    assert cache.num_free_blocks == 2 and cache.sequences() == []


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_return_sequences": 2}, "greedy decoding returns one sequence"),
        ({"do_sample": True, "temperature": 0.0}, "temperature must be > 0"),
        ({"do_sample": True, "top_p": 0.0}, r"top_p must be in \(0, 1\]"),
        ({"do_sample": True, "top_k": 0}, "top_k must be an int >= 1"),
        ({"max_new_tokens": 0}, "max_new_tokens must be an int >= 1"),
        ({"max_new_tokens": 30}, "needs 32 positions, the model has 24"),
    ],
)
def test_bad_generation_arguments(gpt: tuple, kwargs: dict, match: str) -> None:
    with pytest.raises(rt.InvalidArgument, match=match):
        rt.generate(gpt[0], [1, 2, 3], **kwargs)


def test_bad_prompts_models_and_caches(gpt: tuple) -> None:
    model, _ = gpt
    with pytest.raises(rt.InvalidArgument, match=r"outside \[0, 50\)"):
        rt.generate(model, [1, 50])
    with pytest.raises(rt.InvalidArgument, match="non-empty 1-D list of ints"):
        rt.generate(model, [[1, 2], []])
    with pytest.raises(rt.InvalidArgument, match="input_ids must be token ids"):
        rt.generate(model, "hello")
    cache = rt.PagedKVCache(num_layers=2, num_kv_heads=4, head_dim=8, num_blocks=4)
    with pytest.raises(rt.InvalidArgument, match=r"\(2, 4, 8\) does not fit the model's \(1, 4, 8\)"):
        rt.generate(model, [1], cache=cache)
    with pytest.raises(rt.InvalidModel, match="GPT-style decoder"):
        rt.DecoderWeights.from_onnx(bert_block_model())
    with pytest.raises(rt.InvalidModel, match="LayerNormalization"):
        rt.DecoderWeights.from_onnx(gpt_block_model(opset=16))
    with pytest.raises(rt.InvalidArgument, match="num_heads % num_kv_heads"):
        rt.DecoderWeights.random(heads=4, kv_heads=3)


def test_chunks_on_ragged_cached_lengths_match_the_session(gpt: tuple) -> None:
    """Several new tokens per row on top of different cached lengths (the per-row causal mask path)."""
    model, sess = gpt
    runner = DecoderRunner(
        rt.DecoderWeights.from_onnx(model),
        rt.PagedKVCache(num_layers=1, num_kv_heads=4, head_dim=8, num_blocks=8, block_size=4),
    )
    cache = runner.cache
    a, b = cache.add_sequence(), cache.add_sequence()
    runner.forward([a], np.array([[1, 2, 3, 4, 5, 6]]))
    runner.forward([b], np.array([[7, 8]]))
    chunk = np.array([[9, 10, 11], [12, 13, 14]])
    logits = runner.forward([a, b], chunk)
    for row, full in zip(logits, ([1, 2, 3, 4, 5, 6, 9, 10, 11], [7, 8, 12, 13, 14]), strict=True):
        (want,) = sess.run(["logits"], {"ids": np.array([full])})
        np.testing.assert_allclose(row, want[0, -1], rtol=1e-4, atol=1e-5)


def test_decoding_reads_the_cached_keys_and_values(gpt: tuple) -> None:
    """Overwriting the cache after the prefill changes the next step: K/V really come from the cache."""
    model, sess = gpt
    cache = rt.PagedKVCache(num_layers=1, num_kv_heads=4, head_dim=8, num_blocks=4, block_size=4)
    runner = DecoderRunner(rt.DecoderWeights.from_onnx(model), cache)
    seq = cache.add_sequence()
    runner.forward([seq], np.array([[3, 1, 4, 1, 5]]))
    (want,) = sess.run(["logits"], {"ids": np.array([[3, 1, 4, 1, 5, 9]])})
    cache.pool[...] = 0.0
    got = runner.forward([seq], np.array([[9]]))
    assert not np.allclose(got[0], want[0, -1], rtol=1e-2, atol=1e-2)


@settings(max_examples=50, deadline=None)
@given(
    logits=arrays(np.float64, st.tuples(st.integers(1, 3), st.integers(1, 12)), elements=st.floats(-5, 5)),
    top_k=st.one_of(st.none(), st.integers(1, 14)),
    top_p=st.one_of(st.none(), st.floats(0.01, 1.0)),
)
def test_filter_logits_keeps_the_top_k_and_a_minimal_nucleus(
    logits: np.ndarray, top_k: int | None, top_p: float | None
) -> None:
    out = filter_logits(logits, top_k, top_p)
    kept = np.isfinite(out)
    np.testing.assert_array_equal(out[kept], logits[kept])  # kept logits untouched
    assert kept.sum(axis=-1).min() >= 1
    for row, keep in zip(logits, kept, strict=True):
        if top_k is not None:
            assert keep.sum() <= top_k
            if keep.sum() < row.size:
                assert row[keep].min() >= row[~keep].max()  # nothing dropped beats anything kept
        if top_p is not None:
            allowed = row if top_k is None else np.sort(row)[::-1][:top_k]
            p = np.exp(row[keep] - allowed.max()) / np.exp(allowed - allowed.max()).sum()
            mass = np.sort(p)[::-1]
            assert mass.sum() >= top_p - 1e-9  # the nucleus reaches top_p ...
            assert (
                mass[:-1].sum() < top_p + 1e-9
            )  # ... and is minimal: without its smallest token it does not
