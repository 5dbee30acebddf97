"""The Llama layout of DecoderWeights (RMSNorm, rotary, gated SiLU MLP, no biases) and from_transformers.

Cached decoding must equal recomputing the whole sequence through the exported whole-sequence ONNX
model; a numpy reference written here checks that export; from_transformers is fed duck-typed
configs and state dicts (no torch in the runtime's tests) laid out as transformers names them.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.runtime as rt
from opstrata.runtime import DecoderRunner, DecoderWeights, InvalidArgument, InvalidModel

pytest.importorskip("onnx")


def _numpy_llama_logits(w: DecoderWeights, ids: np.ndarray) -> np.ndarray:
    """Whole-sequence logits ``(S, V)`` of a Llama-layout decoder, float64, written from the definitions."""
    h, hkv, dh = w.num_heads, w.num_kv_heads, w.head_dim
    s = len(ids)
    pos = np.arange(s)
    inv = 1.0 / (w.rope_theta ** (np.arange(0, dh, 2) / dh))
    ang = np.concatenate([pos[:, None] * inv] * 2, axis=-1)
    cos, sin = np.cos(ang), np.sin(ang)

    def rms(x: np.ndarray, g: np.ndarray) -> np.ndarray:
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + w.eps) * g

    def rope(x: np.ndarray) -> np.ndarray:  # (heads, S, Dh)
        half = np.concatenate([-x[..., dh // 2 :], x[..., : dh // 2]], axis=-1)
        return x * cos + half * sin

    x = w.wte[ids].astype(np.float64)
    for layer in w.layers:
        qkv = rms(x, layer.ln1_weight) @ layer.w_qkv
        q = rope(qkv[:, : h * dh].reshape(s, h, dh).transpose(1, 0, 2))
        k = rope(qkv[:, h * dh : (h + hkv) * dh].reshape(s, hkv, dh).transpose(1, 0, 2))
        v = qkv[:, (h + hkv) * dh :].reshape(s, hkv, dh).transpose(1, 0, 2)
        k, v = np.repeat(k, h // hkv, axis=0), np.repeat(v, h // hkv, axis=0)
        scores = q @ k.transpose(0, 2, 1) / np.sqrt(dh) + np.triu(np.full((s, s), -np.inf), 1)
        p = np.exp(scores - scores.max(-1, keepdims=True))
        p /= p.sum(-1, keepdims=True)
        x = x + (p @ v).transpose(1, 0, 2).reshape(s, h * dh) @ layer.w_out
        t = rms(x, layer.ln2_weight)
        gate = t @ layer.w_gate
        x = x + (gate / (1 + np.exp(-gate)) * (t @ layer.w_fc)) @ layer.w_proj
    return rms(x, w.lnf_weight) @ w.lm_head


def _llama(**kw: int) -> DecoderWeights:
    args = {"vocab": 40, "hidden": 32, "heads": 4, "kv_heads": 2, "layers": 2, "max_pos": 32, "seed": 3} | kw
    return DecoderWeights.random(layout="llama", **args)


def test_llama_export_matches_a_numpy_reference_and_onnxruntime() -> None:
    w = _llama()
    ids = np.array([[1, 5, 9, 2, 0, 33, 7]], np.int64)
    (got,) = rt.InferenceSession(w.to_onnx()).run(None, {"ids": ids})
    np.testing.assert_allclose(got[0], _numpy_llama_logits(w, ids[0]), rtol=1e-4, atol=1e-5)
    pytest.importorskip("onnxruntime")
    from opstrata.graph.testing import ort_run

    np.testing.assert_allclose(got, ort_run(w.to_onnx(), {"ids": ids})["logits"], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("kv_heads", "layers"), [(4, 1), (2, 2), (1, 2)])
def test_llama_cached_logits_equal_recompute_at_every_step(kv_heads: int, layers: int) -> None:
    w = _llama(kv_heads=kv_heads, layers=layers)
    sess = rt.InferenceSession(w.to_onnx())
    cache = rt.PagedKVCache(num_layers=layers, num_kv_heads=kv_heads, head_dim=8, num_blocks=8, block_size=4)
    runner = DecoderRunner(w, cache)
    ids = [4, 8, 15, 16, 23, 42 % 40]
    seq = cache.add_sequence()
    logits = runner.forward([seq], np.array([ids]))
    for step in range(9):
        (want,) = sess.run(["logits"], {"ids": np.array([ids], np.int64)})
        np.testing.assert_allclose(logits[0], want[0, -1], rtol=1e-4, atol=1e-5, err_msg=f"step {step}")
        ids.append(int(np.argmax(want[0, -1])))
        logits = runner.forward([seq], np.array([[ids[-1]]]))


@settings(max_examples=8, deadline=None)
@given(
    lengths=st.lists(st.integers(1, 9), min_size=1, max_size=3),
    new=st.integers(1, 6),
    block=st.sampled_from([2, 4, 16]),
)
def test_llama_ragged_batch_generate_equals_recompute(lengths: list[int], new: int, block: int) -> None:
    w = _llama(max_pos=24)
    sess = rt.InferenceSession(w.to_onnx())
    rng = np.random.default_rng(len(lengths) * 100 + new)
    prompts = [rng.integers(0, w.vocab_size, n).tolist() for n in lengths]
    out = rt.generate(w, prompts, max_new_tokens=new, block_size=block)
    for prompt, got in zip(prompts, out.new_tokens, strict=True):
        ids = list(prompt)
        for _ in range(new):
            (logits,) = sess.run(["logits"], {"ids": np.array([ids], np.int64)})
            ids.append(int(np.argmax(logits[0, -1])))
        assert got == ids[len(prompt) :]


def test_rotary_tables_are_the_rotate_half_angles() -> None:
    w = _llama()
    cos, sin = w.rotary_tables(5)
    inv = 1.0 / (10000.0 ** (np.arange(0, 8, 2) / 8))
    ang = np.arange(5)[:, None] * np.concatenate([inv, inv])
    np.testing.assert_allclose(cos, np.cos(ang), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(sin, np.sin(ang), rtol=1e-6, atol=1e-6)
    with pytest.raises(InvalidArgument, match="learned positions"):
        DecoderWeights.random().rotary_tables()


def test_layout_errors_name_the_field_and_the_fix() -> None:
    w = _llama()
    gpt = DecoderWeights.random()
    with pytest.raises(InvalidArgument, match="exactly one of wpe"):
        DecoderWeights(
            w.wte,
            gpt.wpe[:, :32],
            w.layers,
            w.lnf_weight,
            None,
            w.lm_head,
            4,
            2,
            1e-6,
            "rms",
            "silu",
            1e4,
            32,
        )
    with pytest.raises(InvalidArgument, match="RMSNorm has no shift"):
        DecoderWeights(
            w.wte, None, w.layers, w.lnf_weight, w.lnf_weight, w.lm_head, 4, 2, 1e-6, "rms", "silu", 1e4, 32
        )
    with pytest.raises(InvalidArgument, match="norm must be one of"):
        DecoderWeights(
            w.wte, None, w.layers, w.lnf_weight, None, w.lm_head, 4, 2, 1e-6, "batch", "silu", 1e4, 32
        )
    with pytest.raises(InvalidArgument, match="activation must be one of"):
        DecoderWeights(
            w.wte, None, w.layers, w.lnf_weight, None, w.lm_head, 4, 2, 1e-6, "rms", "tanh", 1e4, 32
        )
    with pytest.raises(InvalidArgument, match="gated"):
        ungated = type(w.layers[0])(*[getattr(w.layers[0], f) for f in w.layers[0].__dataclass_fields__][:12])
        DecoderWeights(
            w.wte,
            None,
            (w.layers[0], ungated),
            w.lnf_weight,
            None,
            w.lm_head,
            4,
            2,
            1e-6,
            "rms",
            "silu",
            1e4,
            32,
        )
    with pytest.raises(InvalidArgument, match=r"layers\[0\].w_gate must have shape"):
        bad = type(w.layers[0])(
            *[getattr(w.layers[0], f) for f in w.layers[0].__dataclass_fields__][:12], w.wte
        )
        DecoderWeights(w.wte, None, (bad,), w.lnf_weight, None, w.lm_head, 4, 2, 1e-6, "rms", "silu", 1e4, 32)
    with pytest.raises(InvalidArgument, match="context"):
        DecoderWeights(
            w.wte, None, w.layers, w.lnf_weight, None, w.lm_head, 4, 2, 1e-6, "rms", "silu", 1e4, None
        )
    with pytest.raises(InvalidArgument, match="layout must be"):
        DecoderWeights.random(layout="bert")


def test_from_onnx_refuses_a_llama_export_by_name() -> None:
    with pytest.raises(InvalidModel, match="Llama-style") as err:
        DecoderWeights.from_onnx(_llama().to_onnx())
    assert "from_transformers" in str(err.value)


# ---------------------------------------------------------------- from_transformers (duck-typed)


class _FakeModel:
    """What from_transformers reads of a transformers model: ``.config`` and ``.state_dict()``."""

    def __init__(self, config: SimpleNamespace, state: dict[str, np.ndarray]) -> None:
        self.config, self._state = config, state

    def state_dict(self) -> dict[str, np.ndarray]:
        return self._state


def _as_hf_llama(w: DecoderWeights, **config: object) -> _FakeModel:
    h, hkv, dh = w.num_heads, w.num_kv_heads, w.head_dim
    state = {
        "model.embed_tokens.weight": w.wte,
        "model.norm.weight": w.lnf_weight,
        "lm_head.weight": w.lm_head.T,
    }
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        q, k, v = np.split(layer.w_qkv, [h * dh, (h + hkv) * dh], axis=1)
        state |= {
            p + "input_layernorm.weight": layer.ln1_weight, p + "post_attention_layernorm.weight": layer.ln2_weight,
            p + "self_attn.q_proj.weight": q.T, p + "self_attn.k_proj.weight": k.T, p + "self_attn.v_proj.weight": v.T,
            p + "self_attn.o_proj.weight": layer.w_out.T, p + "mlp.gate_proj.weight": layer.w_gate.T,
            p + "mlp.up_proj.weight": layer.w_fc.T, p + "mlp.down_proj.weight": layer.w_proj.T,
        }  # fmt: skip
    cfg = dict(
        model_type="llama", num_attention_heads=h, num_key_value_heads=hkv, hidden_size=w.hidden,
        num_hidden_layers=w.num_layers, hidden_act="silu", rms_norm_eps=w.eps, rope_theta=w.rope_theta,
        rope_scaling=None, max_position_embeddings=w.max_positions, head_dim=dh,
    )  # fmt: skip
    return _FakeModel(SimpleNamespace(**(cfg | config)), state)


def _as_hf_gpt2(w: DecoderWeights, **config: object) -> _FakeModel:
    state = {
        "transformer.wte.weight": w.wte, "transformer.wpe.weight": w.wpe, "transformer.ln_f.weight": w.lnf_weight,
        "transformer.ln_f.bias": w.lnf_bias, "lm_head.weight": w.lm_head.T,
    }  # fmt: skip
    for i, layer in enumerate(w.layers):
        p = f"transformer.h.{i}."
        state |= {
            p + "ln_1.weight": layer.ln1_weight, p + "ln_1.bias": layer.ln1_bias, p + "attn.c_attn.weight": layer.w_qkv,
            p + "attn.c_attn.bias": layer.b_qkv, p + "attn.c_proj.weight": layer.w_out, p + "attn.c_proj.bias": layer.b_out,
            p + "ln_2.weight": layer.ln2_weight, p + "ln_2.bias": layer.ln2_bias, p + "mlp.c_fc.weight": layer.w_fc,
            p + "mlp.c_fc.bias": layer.b_fc, p + "mlp.c_proj.weight": layer.w_proj, p + "mlp.c_proj.bias": layer.b_proj,
        }  # fmt: skip
    cfg = dict(
        model_type="gpt2", n_layer=w.num_layers, n_head=w.num_heads, layer_norm_epsilon=w.eps,
        activation_function="gelu_new", scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False,
    )  # fmt: skip
    return _FakeModel(SimpleNamespace(**(cfg | config)), state)


def _assert_same_weights(a: DecoderWeights, b: DecoderWeights) -> None:
    assert a.config() == b.config()
    for x, y in zip(a.layers, b.layers, strict=True):
        for name in x.__dataclass_fields__:
            u, v = getattr(x, name), getattr(y, name)
            assert (u is None) == (v is None), name
            if u is not None:
                np.testing.assert_array_equal(u, v, err_msg=name)
    np.testing.assert_array_equal(a.lm_head, b.lm_head)
    np.testing.assert_array_equal(a.wte, b.wte)


@pytest.mark.parametrize(("layout", "to_hf"), [("llama", _as_hf_llama), ("gpt2", _as_hf_gpt2)])
def test_from_transformers_reads_each_layout_back(layout: str, to_hf) -> None:
    w = DecoderWeights.random(vocab=30, hidden=16, heads=4, kv_heads=2 if layout == "llama" else 4, layers=2,
                              max_pos=20, seed=9, layout=layout)  # fmt: skip
    back = DecoderWeights.from_transformers(to_hf(w))
    _assert_same_weights(back, w)
    assert back.layers[0].w_qkv.flags.c_contiguous and back.lm_head.flags.c_contiguous


def test_from_transformers_ties_the_head_to_the_embeddings_when_the_state_has_no_head() -> None:
    w = DecoderWeights.random(vocab=30, hidden=16, heads=4, layers=1, max_pos=20)
    fake = _as_hf_gpt2(w)
    del fake._state["lm_head.weight"]
    np.testing.assert_array_equal(DecoderWeights.from_transformers(fake).lm_head, w.wte.T)


def test_from_transformers_refuses_what_it_cannot_run() -> None:
    w = _llama()
    with pytest.raises(InvalidModel, match="rope type 'linear'"):
        DecoderWeights.from_transformers(_as_hf_llama(w, rope_scaling={"rope_type": "linear", "factor": 2.0}))
    with pytest.raises(InvalidModel, match="hidden_act 'gelu'"):
        DecoderWeights.from_transformers(_as_hf_llama(w, hidden_act="gelu"))
    with pytest.raises(InvalidModel, match="head_dim 16"):
        DecoderWeights.from_transformers(_as_hf_llama(w, head_dim=16))
    with pytest.raises(InvalidModel, match="model_type 'bert'"):
        DecoderWeights.from_transformers(_FakeModel(SimpleNamespace(model_type="bert"), {}))
    with pytest.raises(InvalidModel, match="expected a transformers model"):
        DecoderWeights.from_transformers(SimpleNamespace(config=SimpleNamespace(model_type="gpt2")))
    fake = _as_hf_llama(w)
    del fake._state["model.layers.1.mlp.up_proj.weight"]
    with pytest.raises(InvalidModel, match=re.escape("no 'model.layers.1.mlp.up_proj.weight'")):
        DecoderWeights.from_transformers(fake)
    gpt = DecoderWeights.random(vocab=30, hidden=16, heads=4, layers=1, max_pos=20)
    with pytest.raises(InvalidModel, match="activation_function 'swish'"):
        DecoderWeights.from_transformers(_as_hf_gpt2(gpt, activation_function="swish"))
    with pytest.raises(InvalidModel, match="scale_attn_by_inverse_layer_idx"):
        DecoderWeights.from_transformers(_as_hf_gpt2(gpt, scale_attn_by_inverse_layer_idx=True))
