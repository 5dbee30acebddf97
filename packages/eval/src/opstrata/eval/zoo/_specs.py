"""The zoo's table of models: one ModelSpec per name, each naming the builder that makes it in code."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["MODELS", "ModelSpec", "UnknownModelError", "get_spec", "list_models"]


class UnknownModelError(KeyError):
    """A model name the zoo does not know; the message lists the names it does."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(name)

    def __str__(self) -> str:
        return (
            f"unknown zoo model {self.name!r}; available models: {', '.join(MODELS)} "
            "(see `opstrata zoo list`)"
        )


@dataclass(frozen=True)
class ModelSpec:
    """One zoo model: where it comes from, what it takes, and the two input shapes it is checked at."""

    name: str
    family: str  # "torchvision" | "transformers" | "torch"
    builder: str  # function name in opstrata.eval.zoo._builders
    input_kind: str  # "image" (float32 NCHW) | "tokens" (int64 [batch, seq])
    shapes: tuple[tuple[int, ...], ...]  # the input shapes checked, first one also benchmarked
    description: str  # what was shrunk, so a reader knows it is not the published size
    vocab: int = 0  # token models: ids are drawn from [0, vocab)

    @property
    def input_name(self) -> str:
        """The ONNX input name the exporters are given."""
        return "pixel_values" if self.input_kind == "image" else "input_ids"


_IMAGE_64 = ((1, 3, 64, 64), (2, 3, 64, 64))
_TOKENS = ((1, 32), (2, 48))
_VOCAB = 1000

#: Every zoo model, in listing order.
MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec("resnet18", "torchvision", "resnet18", "image", _IMAGE_64,
                  "torchvision resnet18, 100 classes, 64x64 input"),
        ModelSpec("mobilenet_v3_small", "torchvision", "mobilenet_v3_small", "image", _IMAGE_64,
                  "torchvision mobilenet_v3_small, 100 classes, He-normal init, 64x64 input"),
        ModelSpec("efficientnet_b0", "torchvision", "efficientnet_b0", "image", _IMAGE_64,
                  "torchvision efficientnet_b0, 100 classes, He-normal init, 64x64 input"),
        ModelSpec("vit_b_16", "torchvision", "vit_b_16", "image", _IMAGE_64,
                  "torchvision VisionTransformer, patch 16 as ViT-B/16 but 2 layers, hidden 64, 4 heads, "
                  "mlp 128, 64x64 input"),
        ModelSpec("squeezenet1_1", "torchvision", "squeezenet1_1", "image", _IMAGE_64,
                  "torchvision squeezenet1_1, 100 classes, 64x64 input"),
        ModelSpec("shufflenet_v2_x0_5", "torchvision", "shufflenet_v2_x0_5", "image", _IMAGE_64,
                  "torchvision shufflenet_v2_x0_5, 100 classes, He-normal init, 64x64 input"),
        ModelSpec("regnet_y_400mf", "torchvision", "regnet_y_400mf", "image", _IMAGE_64,
                  "torchvision regnet_y_400mf, 100 classes, 64x64 input"),
        ModelSpec("densenet121", "torchvision", "densenet121", "image", _IMAGE_64,
                  "torchvision densenet121, 100 classes, 64x64 input"),
        ModelSpec("convnext_tiny", "torchvision", "convnext_tiny", "image", _IMAGE_64,
                  "torchvision convnext_tiny, 100 classes, layer scale 0.5 (not 1e-6), 64x64 input"),
        ModelSpec("gpt2", "transformers", "gpt2", "tokens", _TOKENS,
                  "GPT2LMHeadModel: 2 layers, hidden 64, 4 heads, inner 128, vocab 1000, eager attention",
                  vocab=_VOCAB),
        ModelSpec("bert", "transformers", "bert", "tokens", _TOKENS,
                  "BertModel: 2 layers, hidden 64, 4 heads, intermediate 128, vocab 1000, eager attention",
                  vocab=_VOCAB),
        ModelSpec("llama", "transformers", "llama", "tokens", _TOKENS,
                  "LlamaForCausalLM: 2 layers, hidden 64, 4 heads (2 KV heads), intermediate 128, "
                  "vocab 1000, eager attention", vocab=_VOCAB),
        ModelSpec("distilbert", "transformers", "distilbert", "tokens", _TOKENS,
                  "DistilBertModel: 2 layers, dim 64, 4 heads, hidden 128, vocab 1000, eager attention",
                  vocab=_VOCAB),
        ModelSpec("t5_encoder", "transformers", "t5_encoder", "tokens", _TOKENS,
                  "T5EncoderModel: 2 layers, d_model 64, 4 heads, gated-GELU d_ff 128, 32 relative buckets, "
                  "vocab 1000, eager attention", vocab=_VOCAB),
        ModelSpec("transformer_encoder", "torch", "transformer_encoder", "tokens", _TOKENS,
                  "nn.Embedding + nn.TransformerEncoder: 2 layers, d_model 64, 4 heads, ff 128, vocab 1000",
                  vocab=_VOCAB),
    )
}  # fmt: skip


def list_models() -> list[str]:
    """The zoo's model names, in table order."""
    return list(MODELS)


def get_spec(name: str) -> ModelSpec:
    """The spec of `name`, or UnknownModelError naming the available models."""
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownModelError(name) from None
