"""Weights of a decoder-only language model for ``generate``: read from ONNX or transformers, random, or exported.

Two layouts share one class. GPT-2's (``gpt_block_model``): token + learned position embeddings;
per layer pre-LayerNorm, fused QKV projection with bias, causal attention, output projection,
pre-LayerNorm tanh-GELU MLP, residuals; a final LayerNorm and the LM head. Llama's: no position
table but rotary embeddings (``rope_theta``), RMSNorm (``norm="rms"``), no biases and a gated MLP
``down(silu(gate(x)) * up(x))`` (``w_gate``). Weights are stored as the graph multiplies them,
``x @ W + b``. ``num_kv_heads < num_heads`` gives grouped-query attention (the fused projection then
holds ``H + 2 Hkv`` heads).
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
NORMS = ("layer", "rms")
ACTIVATIONS = ("gelu_tanh", "gelu", "silu", "relu")


@dataclass(frozen=True)
class DecoderLayer:
    """One pre-norm block: ``x += out(attn(norm1(x)))``, ``x += proj(act(fc(norm2(x))))``.

    A bias or LayerNorm shift of ``None`` is absent (Llama has none). With ``w_gate`` the MLP is gated:
    ``proj(act(x @ w_gate) * (x @ w_fc))`` (Llama's gate / up / down projections).
    """

    ln1_weight: np.ndarray  # (D,)
    ln1_bias: np.ndarray | None  # (D,)
    w_qkv: np.ndarray  # (D, (H + 2 Hkv) * Dh): q heads, then k heads, then v heads
    b_qkv: np.ndarray | None  # ((H + 2 Hkv) * Dh,)
    w_out: np.ndarray  # (H * Dh, D)
    b_out: np.ndarray | None  # (D,)
    ln2_weight: np.ndarray
    ln2_bias: np.ndarray | None
    w_fc: np.ndarray  # (D, F)
    b_fc: np.ndarray | None  # (F,)
    w_proj: np.ndarray  # (F, D)
    b_proj: np.ndarray | None  # (D,)
    w_gate: np.ndarray | None = None  # (D, F): gated MLP


@dataclass(frozen=True)
class DecoderWeights:
    """A decoder-only LM: embeddings, ``layers``, final norm and LM head, plus the head counts and layout.

    ``wpe`` is the learned position table (GPT-2); ``None`` with ``rope_theta`` set means rotary
    positions (rotate-half form, as Llama) up to ``context`` tokens. ``norm`` is ``"layer"`` or
    ``"rms"``; ``activation`` is the MLP's (``"gelu_tanh"`` is GPT-2's gelu_new).
    """

    wte: np.ndarray  # (V, D) token embeddings
    wpe: np.ndarray | None  # (P, D) position embeddings: sequences up to P tokens
    layers: tuple[DecoderLayer, ...]
    lnf_weight: np.ndarray
    lnf_bias: np.ndarray | None
    lm_head: np.ndarray  # (D, V)
    num_heads: int
    num_kv_heads: int
    eps: float = 1e-5
    norm: str = "layer"
    activation: str = "gelu_tanh"
    rope_theta: float | None = None
    context: int | None = None  # rotary models: the longest sequence (no position table to say it)

    def __post_init__(self) -> None:
        d, h, hkv = self.hidden, self.num_heads, self.num_kv_heads

        def bad(problem: str, fix: str | None = None) -> InvalidArgument:
            return InvalidArgument("DecoderWeights", problem, fix)

        if h < 1 or hkv < 1 or h % hkv or d % h:
            raise bad(
                f"need num_heads % num_kv_heads == 0 and hidden % num_heads == 0, got "
                f"hidden {d}, num_heads {h}, num_kv_heads {hkv}"
            )
        if self.norm not in NORMS:
            raise bad(f"norm must be one of {NORMS}, got {self.norm!r}")
        if self.activation not in ACTIVATIONS:
            raise bad(f"activation must be one of {ACTIVATIONS}, got {self.activation!r}")
        if (self.wpe is None) == (self.rope_theta is None):
            raise bad(
                "exactly one of wpe (learned positions) and rope_theta (rotary positions) must be given, got "
                f"wpe {'None' if self.wpe is None else 'set'}, rope_theta {self.rope_theta!r}",
                "pass wpe=None with rope_theta and context for a rotary model, or a (P, D) wpe without them",
            )
        if self.rope_theta is not None:
            if not self.rope_theta > 0 or not self.context or self.context < 1 or (d // h) % 2:
                raise bad(
                    f"rotary positions need rope_theta > 0, context >= 1 and an even head_dim, got rope_theta "
                    f"{self.rope_theta!r}, context {self.context!r}, head_dim {d // h}"
                )
        elif self.context is not None:
            raise bad(f"context is for rotary models (the position table gives it), got {self.context!r}")
        dh = d // h
        want: dict[str, tuple[Any, tuple[int, ...]]] = {
            "lm_head": (self.lm_head, (d, self.wte.shape[0])), "lnf_weight": (self.lnf_weight, (d,)),
            "lnf_bias": (self.lnf_bias, (d,)),
        }  # fmt: skip
        if self.wpe is not None:
            want["wpe"] = (self.wpe, (self.wpe.shape[0], d))
        gated = {layer.w_gate is not None for layer in self.layers}
        if len(gated) > 1:
            raise bad("every layer's MLP must be gated (w_gate) or none, got a mix")
        for i, layer in enumerate(self.layers):
            f = layer.w_fc.shape[-1]
            qkv = (h + 2 * hkv) * dh
            for name, shape in {
                "ln1_weight": (d,), "ln1_bias": (d,), "w_qkv": (d, qkv), "b_qkv": (qkv,), "w_out": (h * dh, d),
                "b_out": (d,), "ln2_weight": (d,), "ln2_bias": (d,), "w_fc": (d, f), "b_fc": (f,),
                "w_proj": (f, d), "b_proj": (d,), "w_gate": (d, f),
            }.items():  # fmt: skip
                want[f"layers[{i}].{name}"] = (getattr(layer, name), shape)
        for name, (value, shape) in want.items():
            if value is not None and tuple(value.shape) != shape:
                raise bad(f"{name} must have shape {shape}, got {tuple(value.shape)}")
        if self.norm == "rms" and any(
            v is not None for k, (v, _) in want.items() if k.endswith(("ln1_bias", "ln2_bias", "lnf_bias"))
        ):
            raise bad("an RMSNorm has no shift: ln1_bias, ln2_bias and lnf_bias must be None with norm='rms'")

    # ------------------------------------------------------------------ sizes

    @property
    def hidden(self) -> int:
        return int(self.wte.shape[1])

    @property
    def vocab_size(self) -> int:
        return int(self.wte.shape[0])

    @property
    def max_positions(self) -> int:
        return int(self.wpe.shape[0]) if self.wpe is not None else int(self.context or 0)

    @property
    def gated(self) -> bool:
        """Whether the MLP is gated (``w_gate``, Llama's SwiGLU)."""
        return bool(self.layers) and self.layers[0].w_gate is not None

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
            "norm": self.norm, "activation": self.activation, "rope_theta": self.rope_theta, "gated": self.gated,
        }  # fmt: skip

    # ------------------------------------------------------------------ constructors

    @classmethod
    def random(
        cls, *, vocab: int = 50, hidden: int = 32, heads: int = 4, kv_heads: int | None = None, layers: int = 1,
        ffn: int | None = None, max_pos: int = 64, seed: int = 0, dtype: Any = np.float32,
        layout: str = "gpt2", rope_theta: float = 10000.0,
    ) -> DecoderWeights:  # fmt: skip
        """Seeded weights scaled like a fan-in init (GPT-2 sized activations).

        ``layout="gpt2"`` (learned positions, LayerNorm, biases, GELU MLP) or ``"llama"`` (rotary
        positions up to ``max_pos``, RMSNorm, no biases, SiLU-gated MLP).
        """
        if layout not in ("gpt2", "llama"):
            raise InvalidArgument(
                "DecoderWeights.random", f"layout must be 'gpt2' or 'llama', got {layout!r}"
            )
        llama = layout == "llama"
        rng = np.random.default_rng(seed)
        kv_heads = heads if kv_heads is None else kv_heads
        ffn = 4 * hidden if ffn is None else ffn
        dh = hidden // max(heads, 1)

        def w(*shape: int, scale: float | None = None) -> np.ndarray:
            s = 1 / math.sqrt(shape[0]) if scale is None else scale
            return (rng.standard_normal(shape) * s).astype(dtype)

        def bias(n: int) -> np.ndarray | None:
            return None if llama else w(n, scale=0.1)

        def ln() -> tuple[np.ndarray, np.ndarray | None]:
            return (1 + 0.1 * rng.standard_normal(hidden)).astype(dtype), bias(hidden)

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
                    bias(qkv),
                    w(heads * dh, hidden),
                    bias(hidden),
                    g2,
                    b2,
                    w(hidden, ffn),
                    bias(ffn),
                    w(ffn, hidden),
                    bias(hidden),
                    w(hidden, ffn) if llama else None,
                )
            )
        gf, bf = ln()
        wte = w(vocab, hidden, scale=0.5)
        if llama:
            return cls(
                wte, None, tuple(blocks), gf, bf, w(hidden, vocab), heads, kv_heads, 1e-6, "rms", "silu",
                float(rope_theta), max_pos,
            )  # fmt: skip
        return cls(
            wte, w(max_pos, hidden, scale=0.5), tuple(blocks), gf, bf, w(hidden, vocab), heads, kv_heads
        )

    def rotary_tables(self, positions: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``cos``, ``sin`` ``(positions, head_dim)`` of the rotate-half rotary embedding (halves repeated).

        As transformers computes them: inverse frequencies ``theta ** -(2i / Dh)`` in float32, angles
        ``position * inv_freq``, then cos / sin in float32.
        """
        if self.rope_theta is None:
            raise InvalidArgument(
                "DecoderWeights.rotary_tables", "this model has learned positions (wpe), not rotary"
            )
        n = self.max_positions if positions is None else positions
        dh = self.head_dim
        inv = (
            1.0 / (np.float32(self.rope_theta) ** (np.arange(0, dh, 2, dtype=np.float32) / np.float32(dh)))
        ).astype(np.float32)
        angles = np.arange(n, dtype=np.float32)[:, None] * inv[None, :]
        angles = np.concatenate([angles, angles], axis=-1)
        dt = self.wte.dtype
        return np.cos(angles).astype(dt), np.sin(angles).astype(dt)

    @classmethod
    def from_transformers(cls, model: Any, dtype: Any = np.float32) -> DecoderWeights:
        """Read a transformers ``GPT2LMHeadModel`` or ``LlamaForCausalLM`` (its config and state dict).

        No torch import here: the model is read by duck typing. Architectures or options the decoder
        cannot run exactly (rope scaling, other activations, another head dim) are refused by name.
        """
        from ._decoder_hf import decoder_from_transformers

        return decoder_from_transformers(model, dtype)

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

        meta = {p.key: p.value for p in model.metadata_props}
        layout = json.loads(meta.get(_META_KEY, "{}"))
        if layout.get("norm", "layer") != "layer" or layout.get("rope_theta") or layout.get("gated"):
            raise InvalidModel(
                where, "the model is a Llama-style decoder (RMSNorm / rotary / gated MLP); this reader takes the "
                "GPT-2 layout only", "keep the DecoderWeights that wrote it, or read a transformers model with "
                "DecoderWeights.from_transformers",
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
        heads are grouped with 5-D MatMuls that broadcast the shared K/V heads. RMSNorm, rotary
        embeddings and the gated MLP are written as the primitive ops torch.onnx emits for them.
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
        x = b.op("Gather", [b.const(self.wte, "wte"), ids], axis=0)
        if self.wpe is not None:
            x = b.op("Add", [x, b.op("Gather", [b.const(self.wpe, "wpe"), pos], axis=0)])
            cos = sin = ""
        else:  # (S, Dh) rows of the tables, broadcast over (B, Hkv, G, S, Dh)
            tcos, tsin = self.rotary_tables()
            cos = b.op("Gather", [b.const(tcos, "rope_cos"), pos], axis=0)
            sin = b.op("Gather", [b.const(tsin, "rope_sin"), pos], axis=0)
        ss = b.op("Concat", [b.unsqueeze(seq, [0]), b.unsqueeze(seq, [0])], axis=0)
        one = b.onnx.helper.make_tensor("one", b.onnx.TensorProto.FLOAT, [1], [1.0])
        causal = b.op(
            "Equal", [b.op("Trilu", [b.op("ConstantOfShape", [ss], value=one)], upper=0), b.scalar(0.0)]
        )

        def norm(t: str, w: np.ndarray, bb: np.ndarray | None) -> str:
            if self.norm == "rms":  # x * 1/sqrt(mean(x^2) + eps) * w
                ms = b.reduce("ReduceMean", b.op("Mul", [t, t]), [-1])
                inv = b.op("Reciprocal", [b.op("Sqrt", [b.op("Add", [ms, b.scalar(self.eps)])])])
                return b.op("Mul", [b.op("Mul", [t, inv]), b.const(w, "gamma")])
            shift = [] if bb is None else [b.const(bb, "beta")]
            return b.op("LayerNormalization", [t, b.const(w, "gamma"), *shift], axis=-1, epsilon=self.eps)

        def linear(t: str, w: np.ndarray, bb: np.ndarray | None) -> str:
            y = b.op("MatMul", [t, b.const(w, "w")])
            return y if bb is None else b.op("Add", [y, b.const(bb, "b")])

        def act(t: str) -> str:
            if self.activation == "gelu_tanh":
                return b.gelu_tanh(t)
            if self.activation == "gelu":
                return b.gelu_erf(t)
            if self.activation == "silu":
                return b.op("Mul", [t, b.op("Sigmoid", [t])])
            return b.op("Relu", [t])

        def heads5(t: str, n_kv: int, g: int) -> str:  # (B, S, n_kv*g*Dh) -> (B, n_kv, g, S, Dh)
            return b.op(
                "Transpose", [b.op("Reshape", [t, b.ints([0, 0, n_kv, g, dh])])], perm=[0, 2, 3, 1, 4]
            )

        def rotate(t: str) -> str:  # t * cos + rotate_half(t) * sin
            lo, hi = b.split(t, [dh // 2, dh // 2], 4, 2)
            half = b.op("Concat", [b.op("Neg", [hi]), lo], axis=-1)
            return b.op("Add", [b.op("Mul", [t, cos]), b.op("Mul", [half, sin])])

        for layer in self.layers:
            qkv = linear(norm(x, layer.ln1_weight, layer.ln1_bias), layer.w_qkv, layer.b_qkv)
            q, k, v = b.split(qkv, [h * dh, hkv * dh, hkv * dh], 2, 3)
            q5, k5, v5 = heads5(q, hkv, grp), heads5(k, hkv, 1), heads5(v, hkv, 1)
            if cos:
                q5, k5 = rotate(q5), rotate(k5)
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
            t = norm(x, layer.ln2_weight, layer.ln2_bias)
            up = linear(t, layer.w_fc, layer.b_fc)
            hid = act(up) if layer.w_gate is None else b.op("Mul", [act(linear(t, layer.w_gate, None)), up])
            x = b.op("Add", [x, linear(hid, layer.w_proj, layer.b_proj)])
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
