"""``DecoderWeights`` from a transformers GPT-2 or Llama model: its config and state dict, no torch import.

The model object is read by duck typing (``.config``, ``.state_dict()``, tensors with ``.detach()``), so
the runtime does not depend on torch or transformers; what the decoder cannot run (another
architecture, rope scaling, a head dim other than hidden / heads, scaled attention variants) is
refused by name rather than run wrong.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ._decoder import DecoderLayer, DecoderWeights
from ._errors import InvalidModel

__all__ = ["decoder_from_transformers"]

_WHERE = "DecoderWeights.from_transformers"
_GPT2_ACTIVATIONS = {
    "gelu_new": "gelu_tanh",
    "gelu_pytorch_tanh": "gelu_tanh",
    "gelu": "gelu",
    "relu": "relu",
}


def _numpy_state(model: Any, dtype: Any) -> dict[str, np.ndarray]:
    try:
        state = model.state_dict()
    except AttributeError as e:
        raise InvalidModel(
            _WHERE,
            f"expected a transformers model (with .config and .state_dict()), got {type(model).__name__}",
        ) from e
    out = {}
    for name, t in state.items():
        t = t.detach().cpu() if hasattr(t, "detach") else t
        if hasattr(t, "is_floating_point") and t.is_floating_point():
            t = t.float()  # bfloat16 has no numpy dtype; float32 stays as it is
        out[name] = np.ascontiguousarray(np.asarray(t.numpy() if hasattr(t, "numpy") else t), dtype=dtype)
    return out


def _getter(state: Mapping[str, np.ndarray], model_type: str) -> Callable[[str], np.ndarray]:
    def get(name: str) -> np.ndarray:
        if name not in state:
            raise InvalidModel(
                _WHERE, f"the {model_type} state dict has no {name!r} (keys start {sorted(state)[:4]})",
                "pass the transformers model itself (e.g. GPT2LMHeadModel / LlamaForCausalLM), not a submodule",
            )  # fmt: skip
        return state[name]

    return get


def _refuse(config: Any, what: str, fix: str) -> InvalidModel:
    return InvalidModel(_WHERE, f"{type(config).__name__}: {what}", fix)


def _gpt2(config: Any, state: Mapping[str, np.ndarray]) -> DecoderWeights:
    get = _getter(state, "gpt2")
    act = _GPT2_ACTIVATIONS.get(config.activation_function)
    if act is None:
        raise _refuse(
            config, f"activation_function {config.activation_function!r} is not one the decoder runs",
            f"use one of {sorted(_GPT2_ACTIVATIONS)}",
        )  # fmt: skip
    if getattr(config, "scale_attn_by_inverse_layer_idx", False) or not getattr(
        config, "scale_attn_weights", True
    ):
        raise _refuse(
            config, "attention scaled other than by 1/sqrt(head_dim) (scale_attn_by_inverse_layer_idx / "
            "scale_attn_weights=False)", "use the default attention scaling",
        )  # fmt: skip
    layers = []
    for i in range(config.n_layer):
        p = f"transformer.h.{i}."
        layers.append(
            DecoderLayer(
                get(p + "ln_1.weight"),
                get(p + "ln_1.bias"),
                get(p + "attn.c_attn.weight"),
                get(p + "attn.c_attn.bias"),  # Conv1D: already (in, out)
                get(p + "attn.c_proj.weight"),
                get(p + "attn.c_proj.bias"),
                get(p + "ln_2.weight"),
                get(p + "ln_2.bias"),
                get(p + "mlp.c_fc.weight"),
                get(p + "mlp.c_fc.bias"),
                get(p + "mlp.c_proj.weight"),
                get(p + "mlp.c_proj.bias"),
            )
        )
    wte = get("transformer.wte.weight")
    head = state.get("lm_head.weight", wte)  # tied unless the checkpoint says otherwise
    return DecoderWeights(
        wte, get("transformer.wpe.weight"), tuple(layers), get("transformer.ln_f.weight"),
        get("transformer.ln_f.bias"), np.ascontiguousarray(head.T), config.n_head, config.n_head,
        float(config.layer_norm_epsilon), "layer", act,
    )  # fmt: skip


def _rope_theta(config: Any) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    scaling = getattr(config, "rope_scaling", None) or {}
    kind = params.get("rope_type") or scaling.get("rope_type") or scaling.get("type") or "default"
    if kind != "default":
        raise _refuse(
            config, f"rope type {kind!r}: the decoder runs the default rotary embedding only",
            "use a config without rope scaling",
        )  # fmt: skip
    theta = params.get("rope_theta", getattr(config, "rope_theta", None))
    if theta is None:
        raise _refuse(config, "no rope_theta in the config", "set config.rope_theta")
    return float(theta)


def _llama(config: Any, state: Mapping[str, np.ndarray]) -> DecoderWeights:
    get = _getter(state, "llama")
    heads, hidden = config.num_attention_heads, config.hidden_size
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    if head_dim * heads != hidden:
        raise _refuse(
            config, f"head_dim {head_dim} x {heads} heads != hidden {hidden}",
            "use a config whose head_dim is hidden_size / num_attention_heads",
        )  # fmt: skip
    if config.hidden_act != "silu":
        raise _refuse(
            config, f"hidden_act {config.hidden_act!r}: the gated MLP runs silu only", "use hidden_act='silu'"
        )
    theta = _rope_theta(config)

    def opt(name: str) -> np.ndarray | None:
        return state.get(name)

    layers = []
    for i in range(config.num_hidden_layers):
        p = f"model.layers.{i}."
        qkv = [get(p + f"self_attn.{n}_proj.weight") for n in "qkv"]  # (out, in) each
        biases = [opt(p + f"self_attn.{n}_proj.bias") for n in "qkv"]
        b_qkv = None if biases[0] is None else np.concatenate(biases)
        mlp_bias = [opt(p + f"mlp.{n}_proj.bias") for n in ("up", "down", "gate")]
        if mlp_bias[2] is not None:
            raise _refuse(config, "a biased gate projection (mlp_bias=True)", "use mlp_bias=False")
        layers.append(
            DecoderLayer(
                get(p + "input_layernorm.weight"),
                None,
                np.ascontiguousarray(np.concatenate(qkv).T),
                b_qkv,
                np.ascontiguousarray(get(p + "self_attn.o_proj.weight").T),
                opt(p + "self_attn.o_proj.bias"),
                get(p + "post_attention_layernorm.weight"),
                None,
                np.ascontiguousarray(get(p + "mlp.up_proj.weight").T),
                mlp_bias[0],
                np.ascontiguousarray(get(p + "mlp.down_proj.weight").T),
                mlp_bias[1],
                np.ascontiguousarray(get(p + "mlp.gate_proj.weight").T),
            )
        )
    wte = get("model.embed_tokens.weight")
    head = state.get("lm_head.weight", wte)
    return DecoderWeights(
        wte, None, tuple(layers), get("model.norm.weight"), None, np.ascontiguousarray(head.T), heads, kv_heads,
        float(config.rms_norm_eps), "rms", "silu", theta, int(config.max_position_embeddings),
    )  # fmt: skip


_READERS = {"gpt2": _gpt2, "llama": _llama}


def decoder_from_transformers(model: Any, dtype: Any = np.float32) -> DecoderWeights:
    """Read a transformers ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` (random or trained) into ``DecoderWeights``."""
    config = getattr(model, "config", None)
    kind = getattr(config, "model_type", None)
    if kind not in _READERS:
        raise InvalidModel(
            _WHERE, f"model_type {kind!r} is not a decoder this runtime runs (have {sorted(_READERS)})",
            "pass a GPT2LMHeadModel or LlamaForCausalLM, or build DecoderWeights yourself",
        )  # fmt: skip
    return _READERS[kind](config, _numpy_state(model, dtype))
