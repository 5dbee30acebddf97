"""Test helpers: small ONNX models built with onnx.helper (MLP, CNN, BERT and GPT blocks), feeds, onnxruntime.

Reused by the runtime and eval tests, so the models are deterministic (seeded weights) and take
their dims as keyword arguments. Needs the ``onnx`` package; onnxruntime only for :func:`ort_run`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ._ir import OPSTRATA_DOMAIN, Graph
from ._shape_infer import infer_shapes
from .onnx.types import require_onnx

__all__ = [
    "ModelBuilder",
    "bert_block_model",
    "cnn_model",
    "fused_llama",
    "gpt_block_model",
    "gpt_gqa_model",
    "mlp_model",
    "mobile_cnn_model",
    "opset_variant_model",
    "ort_run",
    "random_feeds",
]


class ModelBuilder:
    """Build an ONNX model node by node, writing opset-dependent forms (axes attr vs input) for you."""

    def __init__(self, name: str, opset: int = 17, seed: int = 0) -> None:
        self.onnx = require_onnx()
        self.name, self.opset = name, opset
        self.rng = np.random.default_rng(seed)
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.inputs: list[Any] = []
        self.outputs: list[Any] = []
        self._n = 0

    def _fresh(self, hint: str) -> str:
        self._n += 1
        return f"{hint}_{self._n}"

    def input(self, name: str, shape: Sequence[int | str], dtype: Any = np.float32) -> str:
        """Declare a graph input."""
        elem = self.onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.inputs.append(self.onnx.helper.make_tensor_value_info(name, elem, list(shape)))
        return name

    def output(self, name: str, dtype: Any = np.float32, shape: Sequence[int | str] | None = None) -> None:
        """Declare a graph output (shape left to inference unless given)."""
        elem = self.onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
        self.outputs.append(
            self.onnx.helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))
        )

    def const(self, array: Any, hint: str = "c") -> str:
        """An initializer holding ``array``."""
        name = self._fresh(hint)
        self.inits.append(self.onnx.numpy_helper.from_array(np.asarray(array), name))
        return name

    def weight(self, shape: Sequence[int], hint: str = "w", scale: float | None = None) -> str:
        """A seeded random float32 initializer (scaled like a fan-in init)."""
        s = (
            scale
            if scale is not None
            else 1.0 / math.sqrt(shape[0] if len(shape) < 2 else int(np.prod(shape[1:])))
        )
        return self.const((self.rng.standard_normal(shape) * s).astype(np.float32), hint)

    def ints(self, values: Sequence[int]) -> str:
        """An int64 1-D initializer."""
        return self.const(np.array(list(values), np.int64), "ints")

    def op(self, op_type: str, inputs: Sequence[str], n_out: int = 1, **attrs: Any) -> Any:
        """Append a node; returns its output name (a list when ``n_out > 1``)."""
        outs = [self._fresh(op_type.lower()) for _ in range(n_out)]
        self.nodes.append(
            self.onnx.helper.make_node(op_type, list(inputs), outs, name=self._fresh(op_type), **attrs)
        )
        return outs[0] if n_out == 1 else outs

    def reduce(self, op_type: str, x: str, axes: Sequence[int], keepdims: int = 1) -> str:
        """Reduce* with axes as an attribute (opset < 18; ReduceSum < 13) or an input."""
        if self.opset >= 18 or (op_type == "ReduceSum" and self.opset >= 13):
            return self.op(op_type, [x, self.ints(axes)], keepdims=keepdims)
        return self.op(op_type, [x], axes=list(axes), keepdims=keepdims)

    def squeeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Squeeze", [x, self.ints(axes)])

    def unsqueeze(self, x: str, axes: Sequence[int]) -> str:
        return self.op("Unsqueeze", [x, self.ints(axes)])

    def split(self, x: str, sizes: Sequence[int] | None, axis: int, n: int) -> list[str]:
        """Split by ``sizes`` (an input), or into ``n`` equal parts (num_outputs from opset 18)."""
        if sizes is not None:
            return self.op("Split", [x, self.ints(sizes)], n_out=n, axis=axis)
        if self.opset >= 18:
            return self.op("Split", [x], n_out=n, axis=axis, num_outputs=n)
        return self.op("Split", [x], n_out=n, axis=axis)

    def scalar(self, value: float, dtype: Any = np.float32) -> str:
        return self.const(np.array(value, dtype), "s")

    def linear(self, x: str, d_in: int, d_out: int) -> str:
        """``x @ W + b`` as torch exports it (MatMul + Add)."""
        return self.op(
            "Add", [self.op("MatMul", [x, self.weight([d_in, d_out])]), self.weight([d_out], "b", 0.1)]
        )

    def layer_norm(self, x: str, d: int, *, decomposed: bool, eps: float = 1e-5) -> str:
        """LayerNormalization (opset >= 17) or the ReduceMean/Sub/Pow/Sqrt/Div pattern torch emits."""
        gamma = self.const((1 + 0.1 * self.rng.standard_normal(d)).astype(np.float32), "gamma")
        beta = self.weight([d], "beta", 0.1)
        if not decomposed:
            return self.op("LayerNormalization", [x, gamma, beta], axis=-1, epsilon=eps)
        mu = self.reduce("ReduceMean", x, [-1])
        xc = self.op("Sub", [x, mu])
        var = self.reduce("ReduceMean", self.op("Pow", [xc, self.scalar(2.0)]), [-1])
        std = self.op("Sqrt", [self.op("Add", [var, self.scalar(eps)])])
        return self.op("Add", [self.op("Mul", [self.op("Div", [xc, std]), gamma]), beta])

    def gelu_erf(self, x: str) -> str:
        """``x * 0.5 * (1 + erf(x / sqrt(2)))`` as torch exports ``F.gelu``."""
        e = self.op("Erf", [self.op("Div", [x, self.scalar(math.sqrt(2.0))])])
        return self.op("Mul", [self.op("Mul", [x, self.op("Add", [e, self.scalar(1.0)])]), self.scalar(0.5)])

    def gelu_tanh(self, x: str) -> str:
        """The tanh approximation ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (GPT-2)."""
        x3 = self.op("Pow", [x, self.scalar(3.0)])
        inner = self.op("Add", [x, self.op("Mul", [x3, self.scalar(0.044715)])])
        t = self.op("Tanh", [self.op("Mul", [inner, self.scalar(math.sqrt(2 / math.pi))])])
        return self.op("Mul", [self.op("Mul", [x, self.scalar(0.5)]), self.op("Add", [t, self.scalar(1.0)])])

    def build(self, check: bool = True) -> Any:
        """The ModelProto (checked with onnx.checker)."""
        helper = self.onnx.helper
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        model.ir_version = max(8, helper.find_min_ir_version_for(model.opset_import))
        inferred = self.onnx.shape_inference.infer_shapes(model, strict_mode=True)
        model.graph.ClearField("output")
        model.graph.output.extend(inferred.graph.output)  # declared output types, as exporters write them
        if check:
            self.onnx.checker.check_model(model)
        return model


def mlp_model(*, opset: int = 17, d_in: int = 16, hidden: int = 32, d_out: int = 8, seed: int = 0) -> Any:
    """``softmax(relu(x W1^T + b1) W2^T + b2)`` with Gemm(transB=1); input ``x`` (batch, d_in)."""
    b = ModelBuilder("mlp", opset, seed)
    x = b.input("x", ["batch", d_in])
    h = b.op("Relu", [b.op("Gemm", [x, b.weight([hidden, d_in]), b.weight([hidden], "b", 0.1)], transB=1)])
    y = b.op("Gemm", [h, b.weight([d_out, hidden]), b.weight([d_out], "b", 0.1)], transB=1)
    b.nodes.append(b.onnx.helper.make_node("Softmax", [y], ["probs"], name="softmax", axis=-1))
    b.output("probs")
    return b.build()


def cnn_model(*, opset: int = 17, channels: int = 3, size: int = 16, classes: int = 10, seed: int = 0) -> Any:
    """Conv/BatchNorm/Relu/MaxPool/Conv/Relu/GlobalAveragePool/Flatten/Gemm on ``x`` (batch, C, H, W)."""
    b = ModelBuilder("cnn", opset, seed)
    x = b.input("x", ["batch", channels, size, size])
    c1 = b.op(
        "Conv",
        [x, b.weight([8, channels, 3, 3]), b.weight([8], "b", 0.1)],
        kernel_shape=[3, 3],
        pads=[1, 1, 1, 1],
    )
    stats = [
        b.const((1 + 0.1 * b.rng.standard_normal(8)).astype(np.float32), "bn_scale"),
        b.weight([8], "bn_bias", 0.1),
        b.weight([8], "bn_mean", 0.1),
        b.const((0.5 + b.rng.random(8)).astype(np.float32), "bn_var"),
    ]
    bn = b.op("BatchNormalization", [c1, *stats], epsilon=1e-5)
    p = b.op("MaxPool", [b.op("Relu", [bn])], kernel_shape=[2, 2], strides=[2, 2])
    c2 = b.op(
        "Conv",
        [p, b.weight([16, 8, 3, 3]), b.weight([16], "b", 0.1)],
        kernel_shape=[3, 3],
        strides=[2, 2],
        pads=[1, 1, 1, 1],
    )
    a = b.op("AveragePool", [b.op("Relu", [c2])], kernel_shape=[2, 2], strides=[1, 1], pads=[0, 0, 1, 1])
    f = b.op("Flatten", [b.op("GlobalAveragePool", [a])], axis=1)
    b.nodes.append(
        b.onnx.helper.make_node(
            "Gemm",
            [f, b.weight([classes, 16]), b.weight([classes], "b", 0.1)],
            ["logits"],
            name="fc",
            transB=1,
        )
    )
    b.output("logits")
    return b.build()


def mobile_cnn_model(*, opset: int = 17, size: int = 16, classes: int = 10, seed: int = 0) -> Any:
    """The idioms of MobileNetV3 / EfficientNet exports on ``x`` (batch, 3, H, W): Conv + HardSwish, a
    depthwise Conv + Clip(0, 6), squeeze-excitation (ReduceMean, 1x1 Conv, Relu, 1x1 Conv, HardSigmoid,
    Mul), a residual Add, SiLU, MaxPool (ceil mode), Conv + LeakyRelu, a bias-free Conv, Gemm."""
    b = ModelBuilder("mobile_cnn", opset, seed)
    x = b.input("x", ["batch", 3, size, size])

    def conv(
        x: str, c_in: int, c_out: int, k: int, *, stride: int = 1, groups: int = 1, bias: bool = True
    ) -> str:
        ins = [x, b.weight([c_out, c_in // groups, k, k])] + ([b.weight([c_out], "b", 0.1)] if bias else [])
        p = k // 2
        return b.op("Conv", ins, kernel_shape=[k, k], strides=[stride] * 2, pads=[p] * 4, group=groups)

    h = b.op("HardSwish", [conv(x, 3, 8, 3, stride=2, bias=False)])
    lo, hi = b.scalar(0.0), b.scalar(6.0)
    d = b.op("Clip", [conv(h, 8, 8, 3, groups=8), lo, hi])
    s = b.reduce("ReduceMean", d, [2, 3])
    s = b.op("Relu", [conv(s, 8, 4, 1)])
    s = b.op("HardSigmoid", [conv(s, 4, 8, 1)], alpha=1 / 6, beta=0.5)
    r = b.op("Add", [conv(b.op("Mul", [d, s]), 8, 8, 1), h])
    c = conv(r, 8, 16, 3)
    m = b.op(
        "MaxPool", [b.op("Mul", [c, b.op("Sigmoid", [c])])], kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1
    )
    y = b.op("LeakyRelu", [conv(m, 16, 16, 3)], alpha=0.1)
    f = b.op("Flatten", [b.reduce("ReduceMean", y, [2, 3])], axis=1)
    b.nodes.append(
        b.onnx.helper.make_node(
            "Gemm",
            [f, b.weight([classes, 16]), b.weight([classes], "b", 0.1)],
            ["logits"],
            name="fc",
            transB=1,
        )
    )
    b.output("logits")
    return b.build()


def _heads(b: ModelBuilder, x: str, heads: int, head_dim: int) -> str:
    """(B, S, H*D) -> (B, H, S, D) with the Shape/Gather/Concat/Reshape chain torch exports."""
    shape = b.op("Shape", [x])
    bs = b.op("Gather", [shape, b.ints([0, 1])], axis=0)
    target = b.op("Concat", [bs, b.ints([heads, head_dim])], axis=0)
    return b.op("Transpose", [b.op("Reshape", [x, target])], perm=[0, 2, 1, 3])


def _merge_heads(b: ModelBuilder, x: str, hidden: int) -> str:
    """(B, H, S, D) -> (B, S, H*D)."""
    t = b.op("Transpose", [x], perm=[0, 2, 1, 3])
    return b.op("Reshape", [t, b.ints([0, 0, hidden])])


def bert_block_model(
    *,
    opset: int = 17,
    hidden: int = 32,
    heads: int = 4,
    ffn: int = 64,
    decomposed_ln: bool = True,
    seed: int = 0,
) -> Any:
    """A BERT encoder layer: attention with an additive padding mask, residual + LayerNorm, Erf-GELU FFN.

    Inputs ``x`` (batch, seq, hidden) float32 and ``mask`` (batch, seq) float32 of 1 (keep) / 0 (pad).
    """
    if not decomposed_ln and opset < 17:
        raise ValueError("LayerNormalization needs opset >= 17; pass decomposed_ln=True")
    b = ModelBuilder("bert_block", opset, seed)
    d = hidden // heads
    x = b.input("x", ["batch", "seq", hidden])
    mask = b.input("mask", ["batch", "seq"])
    ext = b.unsqueeze(b.unsqueeze(mask, [1]), [2])  # (B, 1, 1, S)
    add_mask = b.op("Mul", [b.op("Sub", [b.scalar(1.0), ext]), b.scalar(-10000.0)])
    q, k, v = (_heads(b, b.linear(x, hidden, hidden), heads, d) for _ in range(3))
    kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
    scores = b.op("Div", [b.op("MatMul", [q, kt]), b.scalar(math.sqrt(d))])
    probs = b.op("Softmax", [b.op("Add", [scores, add_mask])], axis=-1)
    ctx = _merge_heads(b, b.op("MatMul", [probs, v]), hidden)
    h1 = b.layer_norm(b.op("Add", [b.linear(ctx, hidden, hidden), x]), hidden, decomposed=decomposed_ln)
    f = b.linear(b.gelu_erf(b.linear(h1, hidden, ffn)), ffn, hidden)
    out = b.layer_norm(b.op("Add", [f, h1]), hidden, decomposed=decomposed_ln)
    b.nodes.append(b.onnx.helper.make_node("Identity", [out], ["y"], name="out"))
    b.output("y")
    return b.build()


def gpt_block_model(
    *, opset: int = 17, hidden: int = 32, heads: int = 4, vocab: int = 50, max_pos: int = 16, seed: int = 0
) -> Any:
    """A GPT-2 decoder layer on token ids: embeddings (Gather, Range positions), pre-LN, fused QKV + Split,
    causal mask from Trilu/Where, tanh-GELU MLP, final LN and tied-free LM head.

    Input ``ids`` (batch, seq) int64 with seq <= ``max_pos``; output ``logits`` (batch, seq, vocab).
    Needs opset >= 14 (Trilu).
    """
    if opset < 14:
        raise ValueError("gpt_block_model builds its causal mask with Trilu, which needs opset >= 14")
    b = ModelBuilder("gpt_block", opset, seed)
    d = hidden // heads
    ids = b.input("ids", ["batch", "seq"], np.int64)
    seq = b.op("Gather", [b.op("Shape", [ids]), b.const(np.array(1, np.int64))], axis=0)  # scalar S
    pos = b.op("Range", [b.const(np.array(0, np.int64)), seq, b.const(np.array(1, np.int64))])
    tok = b.op("Gather", [b.weight([vocab, hidden], "wte", 0.5), ids], axis=0)
    x = b.op("Add", [tok, b.op("Gather", [b.weight([max_pos, hidden], "wpe", 0.5), pos], axis=0)])
    decomposed = opset < 17
    qkv = b.linear(b.layer_norm(x, hidden, decomposed=decomposed), hidden, 3 * hidden)
    q, k, v = (_heads(b, t, heads, d) for t in b.split(qkv, None, 2, 3))
    scores = b.op(
        "Mul", [b.op("MatMul", [q, b.op("Transpose", [k], perm=[0, 1, 3, 2])]), b.scalar(1 / math.sqrt(d))]
    )
    ss = b.op("Concat", [b.unsqueeze(seq, [0]), b.unsqueeze(seq, [0])], axis=0)
    ones = b.op(
        "ConstantOfShape", [ss], value=b.onnx.helper.make_tensor("one", b.onnx.TensorProto.FLOAT, [1], [1.0])
    )
    causal = b.op("Equal", [b.op("Trilu", [ones], upper=0), b.scalar(0.0)])  # True above the diagonal
    masked = b.op("Where", [causal, b.scalar(-np.inf), scores])
    attn = _merge_heads(b, b.op("MatMul", [b.op("Softmax", [masked], axis=-1), v]), hidden)
    h = b.op("Add", [x, b.linear(attn, hidden, hidden)])
    mlp = b.linear(
        b.gelu_tanh(b.linear(b.layer_norm(h, hidden, decomposed=decomposed), hidden, 4 * hidden)),
        4 * hidden,
        hidden,
    )
    out = b.layer_norm(b.op("Add", [h, mlp]), hidden, decomposed=decomposed)
    b.nodes.append(
        b.onnx.helper.make_node(
            "MatMul", [out, b.weight([hidden, vocab], "lm_head")], ["logits"], name="lm_head"
        )
    )
    b.output("logits")
    return b.build()


def _repeat_kv(b: ModelBuilder, x: str, kv: int, rep: int, d: int) -> str:
    """(B, Hkv, S, D) -> (B, Hkv*rep, S, D) as torch exports ``repeat_kv`` (Unsqueeze, Expand, Reshape)."""
    shape = b.op("Shape", [x])
    bb = b.op("Gather", [shape, b.ints([0])], axis=0)
    ss = b.op("Gather", [shape, b.ints([2])], axis=0)
    e = b.op(
        "Expand", [b.unsqueeze(x, [2]), b.op("Concat", [bb, b.ints([kv, rep]), ss, b.ints([d])], axis=0)]
    )
    return b.op("Reshape", [e, b.op("Concat", [bb, b.ints([kv * rep]), ss, b.ints([d])], axis=0)])


def gpt_gqa_model(
    *, layers: int = 2, hidden: int = 32, heads: int = 8, kv_heads: int = 4, seed: int = 0
) -> Any:
    """A decoder of ``layers`` pre-LN blocks with grouped-query attention (separate Q/K/V MatMul+Add,
    repeat_kv, Trilu/Where causal mask) and an Erf-GELU MLP; input ``x`` (batch, seq, hidden)."""
    b = ModelBuilder("gpt_gqa", 17, seed)
    d = hidden // heads
    x = b.input("x", ["batch", "seq", hidden])
    seq = b.op("Gather", [b.op("Shape", [x]), b.const(np.array(1, np.int64))], axis=0)
    ss = b.op("Concat", [b.unsqueeze(seq, [0]), b.unsqueeze(seq, [0])], axis=0)
    ones = b.op(
        "ConstantOfShape", [ss], value=b.onnx.helper.make_tensor("one", b.onnx.TensorProto.FLOAT, [1], [1.0])
    )
    future = b.op("Equal", [b.op("Trilu", [ones], upper=0), b.scalar(0.0)])
    for _ in range(layers):
        h = b.layer_norm(x, hidden, decomposed=False)
        q = _heads(b, b.linear(h, hidden, heads * d), heads, d)
        k = _repeat_kv(
            b, _heads(b, b.linear(h, hidden, kv_heads * d), kv_heads, d), kv_heads, heads // kv_heads, d
        )
        v = _repeat_kv(
            b, _heads(b, b.linear(h, hidden, kv_heads * d), kv_heads, d), kv_heads, heads // kv_heads, d
        )
        kt = b.op("Transpose", [k], perm=[0, 1, 3, 2])
        s = b.op("Mul", [b.op("MatMul", [q, kt]), b.scalar(1 / math.sqrt(d))])
        p = b.op("Softmax", [b.op("Where", [future, b.scalar(-np.inf), s])], axis=-1)
        ctx = b.op("Transpose", [b.op("MatMul", [p, v])], perm=[0, 2, 1, 3])
        attn = b.linear(b.op("Reshape", [ctx, b.ints([0, 0, heads * d])]), heads * d, hidden)
        x = b.op("Add", [x, attn])
        mlp = b.linear(
            b.gelu_erf(b.linear(b.layer_norm(x, hidden, decomposed=False), hidden, 2 * hidden)),
            2 * hidden,
            hidden,
        )
        x = b.op("Add", [x, mlp])
    b.nodes.append(b.onnx.helper.make_node("Identity", [x], ["y"], name="out"))
    b.output("y")
    return b.build()


def fused_llama(
    *,
    layers: int = 2,
    hidden: int = 32,
    heads: int = 4,
    kv_heads: int = 2,
    ffn: int = 48,
    fused_qkv: bool = False,
    seed: int = 0,
) -> Graph:
    """The fused form the passes produce: RMSNorm, ai.opstrata::Linear (W (out, in)), fused GQA Attention
    (causal) behind Reshape/Transpose, SwiGLU MLP; built directly in the IR. Input ``x`` (batch, seq, hidden)."""
    rng = np.random.default_rng(seed)
    d = hidden // heads
    g = Graph("llama", opset_imports={"": 17, OPSTRATA_DOMAIN: 1})
    g.add_input("x", np.float32, ("batch", "seq", hidden))

    def w(name: str, *shape: int) -> str:
        g.add_initializer(name, (rng.standard_normal(shape) / math.sqrt(shape[-1])).astype(np.float32))
        return name

    def linear(x: str, name: str, d_in: int, d_out: int, bias: bool = True) -> str:
        ins = [x, w(f"{name}.w", d_out, d_in)] + ([w(f"{name}.b", d_out)] if bias else [])
        g.add_node("Linear", ins, [name], name=name, domain=OPSTRATA_DOMAIN)
        return name

    def node(op: str, ins: list[str], out: str, **attrs: Any) -> str:
        g.add_node(
            op, ins, [out], attrs, name=out, domain=OPSTRATA_DOMAIN if op in ("RMSNorm", "Attention") else ""
        )
        return out

    x = "x"
    for i in range(layers):
        p = f"l{i}"
        h = node("RMSNorm", [x, w(f"{p}.norm1", hidden)], f"{p}.norm1_out", epsilon=1e-6)
        qkv, parts = [], [("q", heads), ("k", kv_heads), ("v", kv_heads)]
        if fused_qkv:  # one projection, then Split into unequal (GQA) parts
            both = linear(h, f"{p}.qkv", hidden, (heads + 2 * kv_heads) * d)
            g.add_node(
                "Split",
                [both],
                [f"{p}.{nm}" for nm, _ in parts],
                {"axis": 2, "split": [nh * d for _, nh in parts]},
            )
        for nm, nh in parts:
            t = f"{p}.{nm}" if fused_qkv else linear(h, f"{p}.{nm}", hidden, nh * d)
            g.add_initializer(f"{p}.{nm}_shape", np.array([0, 0, nh, d], np.int64))
            r = node("Reshape", [t, f"{p}.{nm}_shape"], f"{p}.{nm}_heads")
            qkv.append(node("Transpose", [r], f"{p}.{nm}_bhsd", perm=[0, 2, 1, 3]))
        a = node("Attention", qkv, f"{p}.attn", causal=1)
        g.add_initializer(f"{p}.merge_shape", np.array([0, 0, heads * d], np.int64))
        m = node(
            "Reshape",
            [node("Transpose", [a], f"{p}.attn_bshd", perm=[0, 2, 1, 3]), f"{p}.merge_shape"],
            f"{p}.merged",
        )
        x = node("Add", [x, linear(m, f"{p}.o", heads * d, hidden)], f"{p}.res1")
        h2 = node("RMSNorm", [x, w(f"{p}.norm2", hidden)], f"{p}.norm2_out", epsilon=1e-6)
        gate = linear(h2, f"{p}.gate", hidden, ffn, bias=False)
        silu = node("Mul", [gate, node("Sigmoid", [gate], f"{p}.sig")], f"{p}.silu")
        act = node("Mul", [silu, linear(h2, f"{p}.up", hidden, ffn, bias=False)], f"{p}.swiglu")
        x = node("Add", [x, linear(act, f"{p}.down", ffn, hidden)], f"{p}.res2")
    g.outputs.append(x)
    return infer_shapes(g)


def opset_variant_model(opset: int, *, seed: int = 0) -> Any:
    """Split / Squeeze / Unsqueeze / ReduceSum / ReduceMean / ReduceMax written in ``opset``'s own form.

    Input ``x`` (batch, 6, 4); outputs ``a`` (batch, 4), ``b`` (batch, 1, 4), ``c`` (batch, 2).
    """
    b = ModelBuilder(f"opset{opset}_variants", opset, seed)
    x = b.input("x", ["batch", 6, 4])
    p1, p2 = b.split(x, [2, 4], 1, 2)
    s = b.reduce("ReduceSum", p1, [1], keepdims=1)  # (B, 1, 4)
    m = b.reduce("ReduceMean", p2, [1], keepdims=1)  # (B, 1, 4)
    b.nodes.append(b.onnx.helper.make_node("Add", [b.squeeze(s, [1]), b.squeeze(m, [1])], ["a"], name="a"))
    halves = b.split(x, None, 2, 2)  # 2 x (B, 6, 2)
    mx = b.reduce("ReduceMax", halves[0], [1], keepdims=0)  # (B, 2)
    b.nodes.append(
        b.onnx.helper.make_node("Identity", [b.unsqueeze(b.squeeze(s, [1]), [1])], ["b"], name="b")
    )
    b.nodes.append(
        b.onnx.helper.make_node(
            "Sub", [mx, b.reduce("ReduceMin", halves[1], [1], keepdims=0)], ["c"], name="c"
        )
    )
    for o in "abc":
        b.output(o)
    return b.build()


def random_feeds(
    model: Any, dims: Mapping[str, int] | None = None, *, seed: int = 0, int_high: int = 10
) -> dict[str, np.ndarray]:
    """Seeded random feeds for a ModelProto's or Graph's inputs; symbolic dims from ``dims`` (default 2).

    Float inputs are standard normal; int inputs uniform in ``[0, int_high)``; an input named ``mask``
    gets 1s with the last position of each row set to 0 (padding).
    """
    rng = np.random.default_rng(seed)
    dims = dict(dims or {})
    specs: list[tuple[str, np.dtype, list[Any]]] = []
    if hasattr(model, "graph") and hasattr(model.graph, "input"):
        from .onnx.types import shape_from_type

        inits = {t.name for t in model.graph.initializer}
        for vi in model.graph.input:
            if vi.name not in inits:
                dt, shape = shape_from_type(vi.type, vi.name)
                specs.append((vi.name, dt, list(shape or [])))  # type: ignore[arg-type]
    else:
        specs = [(n, model.values[n].dtype, list(model.values[n].shape)) for n in model.inputs]
    feeds = {}
    for name, dt, shape in specs:
        concrete = [d if isinstance(d, int) else dims.get(d, 2) for d in shape]
        if np.dtype(dt).kind in "iu":
            arr = rng.integers(0, int_high, concrete).astype(dt)
        elif np.dtype(dt).kind == "b":
            arr = rng.random(concrete) < 0.5
        else:
            arr = rng.standard_normal(concrete).astype(dt)
        if name == "mask":
            arr = np.ones(concrete, dt)
            arr[..., -1] = 0
        feeds[name] = arr
    return feeds


def ort_run(model: Any, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run a ModelProto in onnxruntime (CPU) and return ``{output name: array}``."""
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(names, dict(feeds)), strict=True))
