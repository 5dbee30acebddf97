"""W8A8 dynamic quantization end to end: transformers models exported by torch.onnx, quantized by
opstrata.quant and by onnxruntime's quantize_dynamic, each run in its own runtime, one thread.

Per model, six candidates timed interleaved (every round runs all of them, the order rotating;
medians; ``opstrata.ops.benchtools.compare``): opstrata fp32, opstrata's w8a8-dynamic model (one scale per tensor) and
its w8a8-dynamic-token model (symmetric int8 per token) in opstrata, the per-tensor model in onnxruntime,
onnxruntime fp32, onnxruntime's quantize_dynamic model in onnxruntime. Printed:
speed-up of opstrata's quantized model over opstrata fp32, its ratio to onnxruntime's quantized
model (below 1: opstrata faster), and output cosine to the fp32 model. Random weights, built in code
(nothing downloaded); ``--quick`` shrinks the models and rounds.

    python packages/eval/benchmarks/bench_quant_models.py [--quick] [--rounds N] [--models bert,gpt2]
"""

# bench-needs: torch transformers

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPSTRATA_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import opstrata.quant as oq  # noqa: E402
import opstrata.runtime as rt  # noqa: E402
from opstrata.ops.benchtools import compare, format_table  # noqa: E402

SIZES = {  # hidden, layers, heads, intermediate
    "full": (384, 4, 6, 1536),
    "quick": (128, 2, 4, 512),
}


def _build(name: str, size: str) -> Any:
    """A transformers model with random weights at ``size``, wrapped to return its first output."""
    from opstrata.eval.zoo import _builders as zb

    tf = zb._transformers()
    zb.require_torch().manual_seed(0)  # the same random weights on every run (as the zoo's build())
    hidden, layers, heads, inter = SIZES[size]
    common = {"vocab_size": 1000, "attn_implementation": "eager"}
    if name == "bert":
        cfg = tf.BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                            intermediate_size=inter, max_position_embeddings=256, **common)  # fmt: skip
        return zb._logits_of(tf.BertModel(cfg, add_pooling_layer=False))
    if name == "distilbert":
        cfg = tf.DistilBertConfig(dim=hidden, n_layers=layers, n_heads=heads, hidden_dim=inter,
                                  max_position_embeddings=256, **common)  # fmt: skip
        return zb._logits_of(tf.DistilBertModel(cfg))
    if name == "gpt2":
        cfg = tf.GPT2Config(
            n_embd=hidden, n_layer=layers, n_head=heads, n_inner=inter, n_positions=256, **common
        )
        return zb._logits_of(tf.GPT2LMHeadModel(cfg))
    if name == "llama":
        cfg = tf.LlamaConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                             num_key_value_heads=heads // 2, intermediate_size=inter,
                             max_position_embeddings=256, **common)  # fmt: skip
        return zb._logits_of(tf.LlamaForCausalLM(cfg))
    raise SystemExit(f"unknown model {name!r}; use bert, distilbert, gpt2, llama")


def _export(name: str, size: str, out: Path) -> Path:
    from opstrata.eval.zoo import export_model

    spec = "llama" if name == "llama" else ("gpt2" if name == "gpt2" else "bert")
    path = export_model(spec, "dynamo", out / name, model=_build(name, size).eval())
    return path


def _ort(path: Path) -> Any:
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.add_session_config_entry("session.intra_op.allow_spinning", "0")
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def _cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--models", default="bert,distilbert,gpt2,llama")
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    size = "quick" if args.quick else "full"
    rounds = args.rounds or (5 if args.quick else 21)
    seq = 32 if args.quick else args.seq
    hidden, layers, heads, inter = SIZES[size]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            fp32 = _export(name, size, Path(tmp))
            ours_q = fp32.with_name(fp32.stem + ".w8a8-dynamic.onnx")
            oq.quantize(fp32, scheme="w8a8-dynamic").save(ours_q)
            ours_t = fp32.with_name(fp32.stem + ".w8a8-dynamic-token.onnx")
            oq.quantize(fp32, scheme="w8a8-dynamic-token").save(ours_t)
            ort_q = fp32.with_name(fp32.stem + ".ort-dynamic.onnx")
            quantize_dynamic(str(fp32), str(ort_q), weight_type=QuantType.QInt8)
            ids = np.random.default_rng(0).integers(0, 1000, (1, seq)).astype(np.int64)
            feeds = {"input_ids": ids}
            opts = rt.SessionOptions(intra_op_num_threads=1)
            sess = {
                "opstrata fp32": rt.InferenceSession(fp32, opts),
                "opstrata w8a8-dyn": rt.InferenceSession(ours_q, opts),
                "opstrata w8a8-dyn-token": rt.InferenceSession(ours_t, opts),
                "onnxruntime on ours": _ort(ours_q),
                "onnxruntime fp32": _ort(fp32),
                "onnxruntime quantize_dynamic": _ort(ort_q),
            }
            ref = sess["opstrata fp32"].run(None, feeds)[0]
            cos = _cosine(sess["opstrata w8a8-dyn"].run(None, feeds)[0], ref)
            cos_tok = _cosine(sess["opstrata w8a8-dyn-token"].run(None, feeds)[0], ref)
            cos_ort = _cosine(sess["onnxruntime quantize_dynamic"].run(None, feeds)[0], ref)
            timed = compare(
                {k: (lambda s=s, f=feeds: s.run(None, f)) for k, s in sess.items()}, repeats=rounds
            )
            med = {k: t.median for k, t in timed.items()}
            ours, ort_q_t = med["opstrata w8a8-dyn"], med["onnxruntime quantize_dynamic"]
            tok = med["opstrata w8a8-dyn-token"]
            rows.append([
                name, f"{med['opstrata fp32'] * 1e3:.2f}", f"{ours * 1e3:.2f}", f"{tok * 1e3:.2f}",
                f"{ort_q_t * 1e3:.2f}", f"{med['opstrata fp32'] / ours:.2f}x", f"{ours / ort_q_t:.2f}x",
                f"{tok / ort_q_t:.2f}x", f"{med['onnxruntime fp32'] / ort_q_t:.2f}x", f"{cos:.5f}", f"{cos_tok:.5f}",
                f"{cos_ort:.5f}",
            ])  # fmt: skip
    print(f"W8A8 dynamic, 1 thread, batch 1, seq {seq}; models hidden {hidden}, {layers} layers, {heads} heads, "
          f"ffn {inter}; medians of {rounds} interleaved rounds")  # fmt: skip
    print(format_table(
        ["model", "ours fp32 ms", "ours q ms", "ours q-token ms", "ort q ms", "ours q speed-up", "ours q / ort q",
         "ours q-token / ort q", "ort q speed-up", "cos ours", "cos ours token", "cos ort"], rows,
    ))  # fmt: skip


if __name__ == "__main__":
    main()
