"""More architectures than the zoo holds, through the zoo's runner: right against onnxruntime, and how fast.

The zoo (``opstrata zoo run``) is what CI checks; this script widens the net to architectures no one here
tuned for -- torchvision MobileNet-V2, ResNeXt-50, MNASNet, GoogLeNet, Swin-T, EfficientNet-V2-S and
transformers RoBERTa, ALBERT, ELECTRA, GPT-Neo (local attention), OPT, BLOOM (ALiBi), Qwen2, Mistral
(sliding window), Gemma, Phi, Falcon -- at the zoo's sizes (64x64 images; 2 layers, hidden 64, 4 heads,
vocab 1000), random weights, both exporters. Each row: the zoo's status (ok / wrong / crashed / refused /
export-failed), the max relative error against onnxruntime and, with ``--bench``, opstrata's median latency
over onnxruntime's at ``--threads`` (the zoo's interleaved turns)::

    OMP_WAIT_POLICY=PASSIVE python packages/eval/benchmarks/bench_more_architectures.py --bench [--threads 1] [--models swin_t,roberta]

Exit 1 when a row is wrong or crashed. ``--quick`` checks three models without timing.
"""

# bench-needs: torch torchvision transformers onnxscript onnxruntime

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from typing import Any

from opstrata.eval.zoo import _builders, _specs, run_model  # the builders set OMP_WAIT_POLICY before torch

_HF = _builders._HF  # the zoo's tiny transformer sizes
_TINY = {"hidden_size": _HF["hidden"], "num_hidden_layers": _HF["layers"], "num_attention_heads": _HF["heads"],
         "intermediate_size": _HF["intermediate"], "vocab_size": _HF["vocab"],
         "max_position_embeddings": _HF["positions"], "attn_implementation": "eager"}  # fmt: skip


def _torchvision(name: str, *, he: bool = False, **kw: Any) -> Callable[[], Any]:
    """``he``: the zoo's He-normal weights, for the nets whose own init leaves the output nearly constant
    (not EfficientNet-V2-S: with them its activations grow to ~4e4 over 40 blocks and float32 rounding alone
    moves the output by half its scale -- torch, onnxruntime and opstrata all disagree with each other)."""

    def build() -> Any:
        model = getattr(_builders._torchvision().models, name)(
            weights=None, num_classes=_builders._NUM_CLASSES, **kw
        )
        return _builders.informative_init(model) if he else model

    return build


def _transformers(model: str, config: str, *, caches: bool = True, **cfg: Any) -> Callable[[], Any]:
    def build() -> Any:
        tf = _builders._transformers()
        return _builders._logits_of(getattr(tf, model)(getattr(tf, config)(**cfg)), caches=caches)

    return build


#: name -> (family, builder, input kind)
ARCHITECTURES: dict[str, tuple[str, Callable[[], Any], str]] = {
    "mobilenet_v2": ("torchvision", _torchvision("mobilenet_v2", he=True), "image"),
    "resnext50_32x4d": ("torchvision", _torchvision("resnext50_32x4d"), "image"),
    "mnasnet0_5": ("torchvision", _torchvision("mnasnet0_5", he=True), "image"),
    "googlenet": ("torchvision", _torchvision("googlenet", he=True, aux_logits=False, init_weights=False), "image"),
    "swin_t": ("torchvision", _torchvision("swin_t"), "image"),
    "efficientnet_v2_s": ("torchvision", _torchvision("efficientnet_v2_s"), "image"),
    "roberta": ("transformers", _transformers("RobertaModel", "RobertaConfig", **_TINY), "tokens"),
    "albert": ("transformers", _transformers("AlbertModel", "AlbertConfig", embedding_size=32, **_TINY), "tokens"),
    "electra": ("transformers", _transformers("ElectraModel", "ElectraConfig", embedding_size=32, **_TINY), "tokens"),
    "gpt_neo": ("transformers", _transformers(
        "GPTNeoForCausalLM", "GPTNeoConfig", vocab_size=1000, hidden_size=64, num_layers=2, num_heads=4,
        attention_types=[[["global", "local"], 1]], window_size=16, max_position_embeddings=128,
        intermediate_size=128, attn_implementation="eager"), "tokens"),
    "opt": ("transformers", _transformers(
        "OPTForCausalLM", "OPTConfig", vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        ffn_dim=128, max_position_embeddings=128, word_embed_proj_dim=64, attn_implementation="eager"), "tokens"),
    "bloom": ("transformers", _transformers(
        "BloomForCausalLM", "BloomConfig", vocab_size=1000, hidden_size=64, n_layer=2, n_head=4,
        attn_implementation="eager"), "tokens"),
    "qwen2": ("transformers", _transformers("Qwen2ForCausalLM", "Qwen2Config", num_key_value_heads=2, **_TINY), "tokens"),
    "mistral": ("transformers", _transformers(
        "MistralForCausalLM", "MistralConfig", num_key_value_heads=2, sliding_window=16, **_TINY), "tokens"),
    "gemma": ("transformers", _transformers(
        "GemmaForCausalLM", "GemmaConfig", num_key_value_heads=2, head_dim=16, **_TINY), "tokens"),
    "phi": ("transformers", _transformers("PhiForCausalLM", "PhiConfig", **_TINY), "tokens"),
    "falcon": ("transformers", _transformers(
        "FalconForCausalLM", "FalconConfig", vocab_size=1000, hidden_size=64, num_hidden_layers=2,
        num_attention_heads=4, attn_implementation="eager"), "tokens"),
}  # fmt: skip


def _register(name: str) -> None:
    """Make ``name`` a model the zoo's runner knows (for this process only)."""
    family, build, kind = ARCHITECTURES[name]
    build.__name__ = name
    _builders._BUILDERS[name] = build
    shapes = _specs._IMAGE_64 if kind == "image" else _specs._TOKENS
    vocab = _specs._VOCAB if kind == "tokens" else 0
    _specs.MODELS[name] = _specs.ModelSpec(
        name, family, name, kind, shapes, "bench_more_architectures", vocab=vocab
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(ARCHITECTURES), help="comma-separated names (default: all)")
    p.add_argument("--bench", action="store_true", help="add the latency ratio against onnxruntime")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--quick", action="store_true", help="three models, no timing")
    args = p.parse_args(argv)
    names = ["mobilenet_v2", "roberta", "gpt_neo"] if args.quick else args.models.split(",")
    unknown = [n for n in names if n not in ARCHITECTURES]
    if unknown:
        print(f"unknown architectures {unknown}; choose from {', '.join(ARCHITECTURES)}", file=sys.stderr)
        return 2
    bench = args.bench and not args.quick
    print("| model | exporter | status | err vs ORT | ratio | reason |\n|---|---|---|---|---|---|")
    bad, ratios = 0, []
    for name in names:
        _register(name)
        for exporter in ("dynamo", "torchscript"):
            row = run_model(name, exporter, threads=args.threads, bench=bench)
            ratio = row.latency_ratio
            if ratio is not None:
                ratios.append(ratio)
            err = "-" if row.err_vs_ort is None else f"{row.err_vs_ort:.1e}"
            shown = "-" if ratio is None else f"{ratio:.2f}"
            print(
                f"| {name} | {exporter} | {row.status} | {err} | {shown} | {(row.reason or '')[:200]} |",
                flush=True,
            )
            bad += row.status in ("wrong", "crashed")
    if ratios:
        print(f"\n{len(ratios)} timed rows at {args.threads} thread(s): median {statistics.median(ratios):.2f}x, "
              f"largest {max(ratios):.2f}x onnxruntime's latency")  # fmt: skip
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
