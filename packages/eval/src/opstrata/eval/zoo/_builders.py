"""Builders: each makes one zoo model in code with random weights (seeded), nothing downloaded.

A builder returns an eval-mode ``torch.nn.Module`` taking one tensor (pixels or token ids) and
returning one tensor, so both exporters and every comparison see the same single input and output.
torch, torchvision and transformers are imported here only, when a model is built.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["build", "require_torch"]

_SEED = 0
_NUM_CLASSES = 100
_HF = {"hidden": 64, "layers": 2, "heads": 4, "intermediate": 128, "vocab": 1000, "positions": 128}


def require_torch() -> Any:
    """Import torch (after setting OMP_WAIT_POLICY=PASSIVE), or ImportError naming the extra to install."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # torch's OpenMP must not spin beside the runtime
    try:
        import torch
    except ImportError as exc:
        raise ImportError(
            f"the model zoo needs torch ({exc}); install it with: pip install './packages/eval[zoo]' "
            "(pins torch, torchvision, transformers, onnxscript and onnxruntime)"
        ) from exc
    return torch


def _torchvision() -> Any:
    require_torch()
    try:
        import torchvision
    except (ImportError, RuntimeError) as exc:  # RuntimeError: a torchvision built for another torch
        raise ImportError(
            f"the torchvision models need an importable torchvision matching torch ({exc}); "
            "install the pair pinned by: pip install './packages/eval[zoo]'"
        ) from exc
    return torchvision


def _transformers() -> Any:
    require_torch()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # built from configs: never ask a hub for anything
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    try:
        import transformers
    except ImportError as exc:
        raise ImportError(
            f"the transformers models need transformers ({exc}); install: pip install './packages/eval[zoo]'"
        ) from exc
    transformers.logging.set_verbosity_error()
    return transformers


def _logits_of(module: Any, *, caches: bool = True) -> Any:
    """Wrap a transformers model so forward(ids) returns its first output tensor (logits or hidden).

    ``caches``: the model's forward takes ``use_cache`` (decoders and BERT do; encoders such as
    DistilBERT and T5's encoder have no cache to turn off).

    The all-ones attention mask is passed explicitly, as callers do: without one, transformers 5 looks
    for packed sequences with ``torch.diff``, which the TorchScript exporter cannot export.
    """
    torch = require_torch()

    class FirstOutput(torch.nn.Module):
        """forward(input_ids) -> the model's first output, with an all-ones mask and no KV cache."""

        def __init__(self, inner: Any) -> None:
            super().__init__()
            self.inner = inner

        def forward(self, input_ids: Any) -> Any:
            mask = torch.ones_like(input_ids)
            extra = {"use_cache": False} if caches else {}
            out = self.inner(input_ids=input_ids, attention_mask=mask, return_dict=False, **extra)
            return out[0]

    return FirstOutput(module)


# ---------------------------------------------------------------- torchvision


def informative_init(model: Any) -> Any:
    """He-normal weights (fan in, ReLU gain) for every Conv2d and Linear of ``model``, in place.

    torchvision's initialisations expect training: in the lightweight nets (MobileNet, EfficientNet,
    ShuffleNet, MNASNet) the activations shrink layer by layer -- MobileNet-V3-Small's logits are ~1e-10,
    EfficientNet-B0's ~1e-13 -- so every activation works near zero (HardSwish, SiLU and the clips almost
    linear, their bends never reached), and ShuffleNet's logits are its classifier's bias to four digits
    whatever the input. He-normal weights keep the activations' scale from layer to layer, so a comparison
    exercises every layer's nonlinearity and the output depends on the input.
    """
    torch = require_torch()
    for mod in model.modules():
        if isinstance(mod, (torch.nn.Conv2d, torch.nn.Linear)):
            torch.nn.init.kaiming_normal_(mod.weight, mode="fan_in", nonlinearity="relu")
    return model


def resnet18() -> Any:
    """torchvision resnet18 (full depth), 100 classes."""
    return _torchvision().models.resnet18(weights=None, num_classes=_NUM_CLASSES)


def mobilenet_v3_small() -> Any:
    """torchvision mobilenet_v3_small (HardSwish, HardSigmoid, squeeze-excite), 100 classes, He init."""
    return informative_init(_torchvision().models.mobilenet_v3_small(weights=None, num_classes=_NUM_CLASSES))


def efficientnet_b0() -> Any:
    """torchvision efficientnet_b0 (SiLU, squeeze-excite), 100 classes, He init."""
    return informative_init(_torchvision().models.efficientnet_b0(weights=None, num_classes=_NUM_CLASSES))


def vit_b_16() -> Any:
    """torchvision VisionTransformer with ViT-B/16's patch size, shrunk to 2 layers of width 64.

    torchvision zero-initialises the classification head (it expects fine-tuning), which would make
    every output 0 and every comparison vacuous; the head gets random weights instead.
    """
    torch = require_torch()
    model = _torchvision().models.VisionTransformer(
        image_size=64, patch_size=16, num_layers=2, num_heads=4, hidden_dim=64, mlp_dim=128,
        num_classes=_NUM_CLASSES,
    )  # fmt: skip
    torch.nn.init.normal_(model.heads.head.weight, std=0.02)
    torch.nn.init.normal_(model.heads.head.bias, std=0.02)
    return model


def squeezenet1_1() -> Any:
    """torchvision squeezenet1_1 (Concat of fire modules, global average pool), 100 classes."""
    return _torchvision().models.squeezenet1_1(weights=None, num_classes=_NUM_CLASSES)


def shufflenet_v2_x0_5() -> Any:
    """torchvision shufflenet_v2_x0_5 (channel shuffle as Reshape-Transpose-Reshape, Split, depthwise 3x3),
    He init."""
    return informative_init(_torchvision().models.shufflenet_v2_x0_5(weights=None, num_classes=_NUM_CLASSES))


def regnet_y_400mf() -> Any:
    """torchvision regnet_y_400mf (grouped 3x3 convolutions of group width 8, squeeze-excite)."""
    return _torchvision().models.regnet_y_400mf(weights=None, num_classes=_NUM_CLASSES)


def densenet121() -> Any:
    """torchvision densenet121 (every layer's input a Concat of all before it in its block)."""
    return _torchvision().models.densenet121(weights=None, num_classes=_NUM_CLASSES)


def convnext_tiny() -> Any:
    """torchvision convnext_tiny (7x7 depthwise, channels-last LayerNorm, GELU MLP), layer scale 0.5.

    torchvision starts every block's layer scale at 1e-6 (it expects training), which makes each block
    add almost nothing to its residual and the comparison nearly blind to the blocks; 0.5 makes them count.
    """
    return _torchvision().models.convnext_tiny(weights=None, num_classes=_NUM_CLASSES, layer_scale=0.5)


# ---------------------------------------------------------------- transformers


def gpt2() -> Any:
    """GPT2LMHeadModel from a tiny GPT2Config (learned positions, GELU-new, tied LM head)."""
    tf = _transformers()
    config = tf.GPT2Config(
        vocab_size=_HF["vocab"], n_positions=_HF["positions"], n_embd=_HF["hidden"], n_layer=_HF["layers"],
        n_head=_HF["heads"], n_inner=_HF["intermediate"], attn_implementation="eager",
    )  # fmt: skip
    return _logits_of(tf.GPT2LMHeadModel(config))


def bert() -> Any:
    """BertModel from a tiny BertConfig; returns the last hidden state."""
    tf = _transformers()
    config = tf.BertConfig(
        vocab_size=_HF["vocab"], hidden_size=_HF["hidden"], num_hidden_layers=_HF["layers"],
        num_attention_heads=_HF["heads"], intermediate_size=_HF["intermediate"],
        max_position_embeddings=_HF["positions"], attn_implementation="eager",
    )  # fmt: skip
    return _logits_of(tf.BertModel(config, add_pooling_layer=False))


def llama() -> Any:
    """LlamaForCausalLM from a tiny LlamaConfig (RMSNorm, rotary positions, SiLU MLP, grouped KV heads)."""
    tf = _transformers()
    config = tf.LlamaConfig(
        vocab_size=_HF["vocab"], hidden_size=_HF["hidden"], num_hidden_layers=_HF["layers"],
        num_attention_heads=_HF["heads"], num_key_value_heads=_HF["heads"] // 2,
        intermediate_size=_HF["intermediate"], max_position_embeddings=_HF["positions"],
        attn_implementation="eager",
    )  # fmt: skip
    return _logits_of(tf.LlamaForCausalLM(config))


def distilbert() -> Any:
    """DistilBertModel from a tiny DistilBertConfig; returns the last hidden state."""
    tf = _transformers()
    config = tf.DistilBertConfig(
        vocab_size=_HF["vocab"], dim=_HF["hidden"], n_layers=_HF["layers"], n_heads=_HF["heads"],
        hidden_dim=_HF["intermediate"], max_position_embeddings=_HF["positions"], attn_implementation="eager",
    )  # fmt: skip
    return _logits_of(tf.DistilBertModel(config), caches=False)


def t5_encoder() -> Any:
    """T5EncoderModel from a tiny T5Config (T5 v1.1's gated GELU; RMS norm; relative position buckets)."""
    tf = _transformers()
    config = tf.T5Config(
        vocab_size=_HF["vocab"], d_model=_HF["hidden"], d_kv=_HF["hidden"] // _HF["heads"],
        d_ff=_HF["intermediate"], num_layers=_HF["layers"], num_heads=_HF["heads"],
        relative_attention_num_buckets=32, relative_attention_max_distance=_HF["positions"],
        feed_forward_proj="gated-gelu", attn_implementation="eager",
    )  # fmt: skip
    return _logits_of(tf.T5EncoderModel(config), caches=False)


# ---------------------------------------------------------------- plain torch


def transformer_encoder() -> Any:
    """nn.Embedding followed by a 2-layer nn.TransformerEncoder (post-norm, ReLU)."""
    torch = require_torch()

    class Encoder(torch.nn.Module):
        """Token embedding, then a stock nn.TransformerEncoder."""

        def __init__(self) -> None:
            super().__init__()
            self.embed = torch.nn.Embedding(_HF["vocab"], _HF["hidden"])
            layer = torch.nn.TransformerEncoderLayer(
                _HF["hidden"], _HF["heads"], _HF["intermediate"], dropout=0.0, batch_first=True
            )
            self.encoder = torch.nn.TransformerEncoder(layer, _HF["layers"], enable_nested_tensor=False)

        def forward(self, input_ids: Any) -> Any:
            return self.encoder(self.embed(input_ids))

    return Encoder()


_BUILDERS = {
    f.__name__: f
    for f in (
        resnet18, mobilenet_v3_small, efficientnet_b0, vit_b_16, squeezenet1_1, shufflenet_v2_x0_5,
        regnet_y_400mf, densenet121, convnext_tiny, gpt2, bert, llama, distilbert, t5_encoder,
        transformer_encoder,
    )
}  # fmt: skip


def build(builder: str) -> Any:
    """The eval-mode module made by builder `builder`, with weights drawn from a fixed seed."""
    torch = require_torch()
    torch.manual_seed(_SEED)
    with torch.no_grad():
        model = _BUILDERS[builder]()
    return model.eval()
