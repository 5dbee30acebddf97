"""Weights of a GPT-style decoder for ``generate``: read from ONNX, made at random, or exported to ONNX.

The architecture is the graph package's ``gpt_block_model`` (GPT-2): token + learned position
embeddings; per layer pre-LayerNorm, fused QKV projection, causal attention, output projection,
pre-LayerNorm tanh-GELU MLP, residuals; a final LayerNorm and an untied LM head. Weights are stored
as the ONNX graph multiplies them, ``x @ W + b``. ``num_kv_heads < num_heads`` gives grouped-query
attention (the fused projection then holds ``H + 2 Hkv`` heads).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._errors import InvalidArgument, InvalidModel

__all__ = ["DecoderLayer", "DecoderWeights"]

_META_KEY = "opstrata.decoder"  # metadata_props entry written by to_onnx: the config as JSON


@dataclass(frozen=True)
class DecoderLayer:
    """One pre-LN block: ``x += out(attn(ln1(x)))``, ``x += proj(gelu(fc(ln2(x))))``."""

    ln1_weight: np.ndarray  # (D,)
    ln1_bias: np.ndarray  # (D,)
    w_qkv: np.ndarray  # (D, (H + 2 Hkv) * Dh): q heads, then k heads, then v heads
    b_qkv: np.ndarray  # ((H + 2 Hkv) * Dh,)
    w_out: np.ndarray  # (H * Dh, D)
    b_out: np.ndarray  # (D,)
    ln2_weight: np.ndarray
    ln2_bias: np.ndarray
    w_fc: np.ndarray  # (D, F)
    b_fc: np.ndarray  # (F,)
    w_proj: np.ndarray  # (F, D)
    b_proj: np.ndarray  # (D,)


@dataclass(frozen=True)
class DecoderWeights:
    """A GPT-style decoder: embeddings, ``layers``, final LayerNorm and LM head, plus the head counts."""

    wte: np.ndarray  # (V, D) token embeddings
    wpe: np.ndarray  # (P, D) position embeddings: sequences up to P tokens
    layers: tuple[DecoderLayer, ...]
    lnf_weight: np.ndarray
    lnf_bias: np.ndarray
    lm_head: np.ndarray  # (D, V)
    num_heads: int
    num_kv_heads: int
    eps: float = 1e-5

    def __post_init__(self) -> None:
        d, h, hkv = self.hidden, self.num_heads, self.num_kv_heads
        if h < 1 or hkv < 1 or h % hkv or d % h:
            raise InvalidArgument(
                "DecoderWeights", f"need num_heads % num_kv_heads == 0 and hidden % num_heads == 0, got "
                f"hidden {d}, num_heads {h}, num_kv_heads {hkv}",
            )  # fmt: skip
        dh = d // h
        want = {"wpe": (self.wpe.shape[0], d), "lm_head": (d, self.wte.shape[0]), "lnf_weight": (d,)}
        for i, layer in enumerate(self.layers):
            f = layer.w_fc.shape[-1]
            want |= {
                f"layers[{i}].w_qkv": (d, (h + 2 * hkv) * dh), f"layers[{i}].b_qkv": ((h + 2 * hkv) * dh,),
                f"layers[{i}].w_out": (h * dh, d), f"layers[{i}].w_fc": (d, f), f"layers[{i}].w_proj": (f, d),
            }  # fmt: skip
        for name, shape in want.items():
            obj: Any = self
            for part in name.replace("]", "").split("."):
                obj = (
                    obj.layers[int(part.split("[")[1])] if part.startswith("layers[") else getattr(obj, part)
                )
            if tuple(obj.shape) != shape:
                raise InvalidArgument(
                    "DecoderWeights", f"{name} must have shape {shape}, got {tuple(obj.shape)}"
                )

    # ------------------------------------------------------------------ sizes

    @property
    def hidden(self) -> int:
        return int(self.wte.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.wte.shape[0])

    @property
    def max_positions(self) -> int:
        return int(self.wpe.shape[0])

    @property
    def head_dim(self) -> int:
        return self.hidden // self.num_heads

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def config(self) -> dict[str, Any]:
        return {
            "hidden": self.hidden, "vocab": self.vocab_size, "max_pos": self.max_positions,
            "heads": self.num_heads, "kv_heads": self.num_kv_heads, "layers": self.num_layers, "eps": self.eps,
        }  # fmt: skip

    # ------------------------------------------------------------------ constructors

    @classmethod
    def random(
        cls, *, vocab: int = 50, hidden: int = 32, heads: int = 4, kv_heads: int | None = None, layers: int = 1,
        ffn: int | None = None, max_pos: int = 64, seed: int = 0, dtype: Any = np.float32,
    ) -> DecoderWeights:  # fmt: skip
        """Seeded weights scaled like a fan-in init (GPT-2 sized activations)."""
        rng = np.random.default_rng(seed)
        kv_heads = heads if kv_heads is None else kv_heads
        ffn = 4 * hidden if ffn is None else ffn
        dh = hidden // max(heads, 1)

        def w(*shape: int, scale: float | None = None) -> np.ndarray:
            s = 1 / math.sqrt(shape[0]) if scale is None else scale
            return (rng.standard_normal(shape) * s).astype(dtype)

        def ln() -> tuple[np.ndarray, np.ndarray]:
            return (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype), w(hidden, scale=0.1)

        blocks = []
        for _ in range(layers):
            g1, b1 = ln()
            qkv = (heads + 2 * kv_heads) * dh
            g2, b2 = ln()
            blocks.append(
                DecoderLayer(
                    g1,
                    b1,
                    w(hidden, qkv),
                    w(qkv, scale=0.1),
                    w(heads * dh, hidden),
                    w(hidden, scale=0.1),
                    g2,
                    b2,
                    w(hidden, ffn),
                    w(ffn, scale=0.1),
                    w(ffn, hidden),
                    w(hidden, scale=0.1),
                )
            )
        gf, bf = ln()
        return cls(
            w(vocab, hidden, scale=0.5), w(max_pos, hidden, scale=0.5), tuple(blocks), gf, bf,
            w(hidden, vocab), heads, kv_heads,
        )  # fmt: skip

    @classmethod
    def from_onnx(cls, model: Any) -> DecoderWeights:
        """Read the weights of a GPT-style decoder ONNX model (``gpt_block_model`` or ``to_onnx``'s).

        ``model`` is an ``onnx.ModelProto``, a path or bytes. The layout is found from the graph: the
        Gather of the ``ids`` input (token embeddings), the other embedding Gather (positions), the
        LayerNormalization nodes (two per layer and a final one) and the MatMuls by a weight in node
        order (QKV, output, FC, projection per layer, then the LM head) with their bias Adds.
        """
        import onnx
        from onnx import numpy_helper

        where = "DecoderWeights.from_onnx"
        if isinstance(model, (str, Path)):
            try:
                model = onnx.load(str(model))
            except Exception as e:
                raise InvalidModel(where, f"cannot read ONNX file {model}: {e}") from e
        elif isinstance(model, (bytes, bytearray)):
            model = onnx.load_from_string(bytes(model))
        g = model.graph
        inits = {t.name: numpy_helper.to_array(t) for t in g.initializer}
        consumers: dict[str, list[Any]] = {}
        for n in g.node:
            for i in n.input:
                consumers.setdefault(i, []).append(n)
        graph_inputs = [i.name for i in g.input if i.name not in inits]

        def fail(problem: str) -> InvalidModel:
            return InvalidModel(
                where, problem, "pass a GPT-style decoder exported with opset >= 17 (LayerNormalization nodes), "
                "e.g. opstrata.graph.testing.gpt_block_model() or DecoderWeights.to_onnx()",
            )  # fmt: skip

        gathers = [
            n for n in g.node if n.op_type == "Gather" and n.input[0] in inits and inits[n.input[0]].ndim == 2
        ]
        wte = [n for n in gathers if n.input[1] in graph_inputs]
        wpe = [n for n in gathers if n.input[1] not in graph_inputs]
        if len(wte) != 1 or len(wpe) != 1:
            raise fail(
                f"expected one token and one position embedding Gather, found {len(wte)} and {len(wpe)}"
            )
        norms = [n for n in g.node if n.op_type == "LayerNormalization"]
        if len(norms) < 3 or len(norms) % 2 != 1:
            raise fail(f"expected 2 LayerNormalization nodes per layer and a final one, found {len(norms)}")
        n_layers = (len(norms) - 1) // 2
        mats = [n for n in g.node if n.op_type == "MatMul" and n.input[1] in inits]
        if len(mats) != 4 * n_layers + 1:
            raise fail(
                f"expected {4 * n_layers + 1} MatMuls by a weight for {n_layers} layer(s), found {len(mats)}"
            )

        def bias(mm: Any) -> np.ndarray:
            for c in consumers.get(mm.output[0], []):
                if c.op_type == "Add":
                    other = [i for i in c.input if i != mm.output[0]]
                    if other and other[0] in inits:
                        return inits[other[0]]
            raise fail(f"MatMul {mm.name!r} has no bias Add")

        def ln(n: Any) -> tuple[np.ndarray, np.ndarray, float]:
            eps = next((a.f for a in n.attribute if a.name == "epsilon"), 1e-5)
            eps = float(str(np.float32(eps)))  # the shortest decimal of the float32 attribute: 1e-05
            scale = inits[n.input[1]]
            return scale, inits[n.input[2]] if len(n.input) > 2 else np.zeros_like(scale), eps

        hidden = inits[wte[0].input[0]].shape[1]
        meta = {p.key: p.value for p in model.metadata_props}
        if _META_KEY in meta:
            cfg = json.loads(meta[_META_KEY])
            heads, kv_heads = int(cfg["heads"]), int(cfg["kv_heads"])
        else:  # gpt_block_model: the first Reshape to (B, S, H, Dh) names H
            heads = 0
            for n in g.node:
                if n.op_type == "Concat":
                    consts = [inits[i] for i in n.input if i in inits and inits[i].dtype == np.int64]
                    if len(consts) == 1 and consts[0].shape == (2,) and int(np.prod(consts[0])) == hidden:
                        heads = int(consts[0][0])
                        break
            if not heads:
                raise fail("cannot find the head count (a Reshape to (batch, seq, heads, head_dim))")
            kv_heads = heads
        layers = []
        eps = 1e-5
        for i in range(n_layers):
            (g1, b1, eps), (g2, b2, _) = ln(norms[2 * i]), ln(norms[2 * i + 1])
            qkv, out, fc, proj = mats[4 * i : 4 * i + 4]
            layers.append(
                DecoderLayer(
                    g1,
                    b1,
                    inits[qkv.input[1]],
                    bias(qkv),
                    inits[out.input[1]],
                    bias(out),
                    g2,
                    b2,
                    inits[fc.input[1]],
                    bias(fc),
                    inits[proj.input[1]],
                    bias(proj),
                )
            )
        gf, bf, _ = ln(norms[-1])
        return cls(
            inits[wte[0].input[0]], inits[wpe[0].input[0]], tuple(layers), gf, bf, inits[mats[-1].input[1]],
            heads, kv_heads, float(eps),
        )  # fmt: skip

    # ------------------------------------------------------------------ export

    def to_onnx(self, opset: int = 17) -> Any:
        """The whole-sequence model as ONNX: input ``ids`` (batch, seq) int64, output ``logits`` (batch, seq, V).

        Recomputes every position (no cache): the reference ``generate`` is checked against. GQA
        heads are grouped with 5-D MatMuls that broadcast the shared K/V heads.
        """
        if opset < 17:
            raise InvalidArgument(
                "DecoderWeights.to_onnx", f"needs opset >= 17 (LayerNormalization), got {opset}"
            )
        from opstrata.graph.testing import ModelBuilder

        b = ModelBuilder("decoder", opset)
        h, hkv, dh = self.num_heads, self.num_kv_heads, self.head_dim
        grp = h // hkv
        ids = b.input("ids", ["batch", "seq"], np.int64)
        seq = b.op("Gather", [b.op("Shape", [ids]), b.const(np.array(1, np.int64))], axis=0)
        pos = b.op("Range", [b.const(np.array(0, np.int64)), seq, b.const(np.array(1, np.int64))])
        x = b.op(
            "Add",
            [
                b.op("Gather", [b.const(self.wte, "wte"), ids], axis=0),
                b.op("Gather", [b.const(self.wpe, "wpe"), pos], axis=0),
            ],
        )
        ss = b.op("Concat", [b.unsqueeze(seq, [0]), b.unsqueeze(seq, [0])], axis=0)
        one = b.onnx.helper.make_tensor("one", b.onnx.TensorProto.FLOAT, [1], [1.0])
        causal = b.op(
            "Equal", [b.op("Trilu", [b.op("ConstantOfShape", [ss], value=one)], upper=0), b.scalar(0.0)]
        )

        def norm(t: str, w: np.ndarray, bb: np.ndarray) -> str:
            return b.op(
                "LayerNormalization", [t, b.const(w, "gamma"), b.const(bb, "beta")], axis=-1, epsilon=self.eps
            )

        def linear(t: str, w: np.ndarray, bb: np.ndarray) -> str:
            return b.op("Add", [b.op("MatMul", [t, b.const(w, "w")]), b.const(bb, "b")])

        def heads5(t: str, n_kv: int, g: int) -> str:  # (B, S, n_kv*g*Dh) -> (B, n_kv, g, S, Dh)
            return b.op(
                "Transpose", [b.op("Reshape", [t, b.ints([0, 0, n_kv, g, dh])])], perm=[0, 2, 3, 1, 4]
            )

        for layer in self.layers:
            qkv = linear(norm(x, layer.ln1_weight, layer.ln1_bias), layer.w_qkv, layer.b_qkv)
            q, k, v = b.split(qkv, [h * dh, hkv * dh, hkv * dh], 2, 3)
            q5, k5, v5 = heads5(q, hkv, grp), heads5(k, hkv, 1), heads5(v, hkv, 1)
            scores = b.op(
                "Mul",
                [
                    b.op("MatMul", [q5, b.op("Transpose", [k5], perm=[0, 1, 2, 4, 3])]),
                    b.scalar(1 / math.sqrt(dh)),
                ],
            )
            probs = b.op("Softmax", [b.op("Where", [causal, b.scalar(-np.inf), scores])], axis=-1)
            ctx = b.op("Transpose", [b.op("MatMul", [probs, v5])], perm=[0, 3, 1, 2, 4])  # (B, S, Hkv, G, Dh)
            attn = linear(b.op("Reshape", [ctx, b.ints([0, 0, h * dh])]), layer.w_out, layer.b_out)
            x = b.op("Add", [x, attn])
            mlp = b.gelu_tanh(linear(norm(x, layer.ln2_weight, layer.ln2_bias), layer.w_fc, layer.b_fc))
            x = b.op("Add", [x, linear(mlp, layer.w_proj, layer.b_proj)])
        out = norm(x, self.lnf_weight, self.lnf_bias)
        b.nodes.append(
            b.onnx.helper.make_node(
                "MatMul", [out, b.const(self.lm_head, "lm_head")], ["logits"], name="lm_head"
            )
        )
        b.output("logits")
        model = b.build()
        b.onnx.helper.set_model_props(model, {_META_KEY: json.dumps(self.config())})
        return model
