"""Small seeded ONNX models built with onnx.helper for the quant tests, and run helpers for both runtimes."""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper as h, numpy_helper as nh

from opstrata.runtime import InferenceSession


def _model(
    nodes: list[Any], name: str, x: Any, y: Any, inits: dict[str, np.ndarray], opset: int
) -> onnx.ModelProto:
    g = h.make_graph(nodes, name, [x], [y], [nh.from_array(a, n) for n, a in inits.items()])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def mlp(
    seed: int = 0, opset: int = 17, d_in: int = 64, hidden: int = 128, d_out: int = 16
) -> onnx.ModelProto:
    """x -> MatMul+Add -> Relu -> MatMul -> Relu -> Gemm(transB) -> y (nodes fc1, fc2, fc3)."""
    r = np.random.default_rng(seed)
    inits = {
        "w1": (r.standard_normal((d_in, hidden)) / np.sqrt(d_in)).astype(np.float32),
        "b1": (r.standard_normal(hidden) * 0.1).astype(np.float32),
        "w2": (r.standard_normal((hidden, hidden)) / np.sqrt(hidden)).astype(np.float32),
        "w3": (r.standard_normal((d_out, hidden)) / np.sqrt(hidden)).astype(np.float32),
        "b3": (r.standard_normal(d_out) * 0.1).astype(np.float32),
    }
    nodes = [
        h.make_node("MatMul", ["x", "w1"], ["h1"], name="fc1"),
        h.make_node("Add", ["h1", "b1"], ["h1b"], name="bias1"),
        h.make_node("Relu", ["h1b"], ["a1"], name="relu1"),
        h.make_node("MatMul", ["a1", "w2"], ["h2"], name="fc2"),
        h.make_node("Relu", ["h2"], ["a2"], name="relu2"),
        h.make_node("Gemm", ["a2", "w3", "b3"], ["y"], name="fc3", transB=1, alpha=1.0, beta=1.0),
    ]
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", d_in])
    y = h.make_tensor_value_info("y", T.FLOAT, ["batch", d_out])
    return _model(nodes, "mlp", x, y, inits, opset)


def convnet(seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """x[N,3,16,16] -> Conv -> Relu -> Conv(stride 2) -> Relu -> GlobalAveragePool -> Flatten -> MatMul."""
    r = np.random.default_rng(seed)
    inits = {
        "c1": (r.standard_normal((8, 3, 3, 3)) / np.sqrt(27)).astype(np.float32),
        "cb1": (r.standard_normal(8) * 0.1).astype(np.float32),
        "c2": (r.standard_normal((16, 8, 3, 3)) / np.sqrt(72)).astype(np.float32),
        "fc": (r.standard_normal((16, 10)) / 4).astype(np.float32),
    }
    nodes = [
        h.make_node("Conv", ["x", "c1", "cb1"], ["y1"], name="conv1", pads=[1, 1, 1, 1]),
        h.make_node("Relu", ["y1"], ["r1"], name="relu1"),
        h.make_node("Conv", ["r1", "c2"], ["y2"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
        h.make_node("Relu", ["y2"], ["r2"], name="relu2"),
        h.make_node("GlobalAveragePool", ["r2"], ["p"], name="gap"),
        h.make_node("Flatten", ["p"], ["f"], name="flatten"),
        h.make_node("MatMul", ["f", "fc"], ["logits"], name="head"),
    ]
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", 3, 16, 16])
    y = h.make_tensor_value_info("logits", T.FLOAT, ["batch", 10])
    return _model(nodes, "convnet", x, y, inits, opset)


def feeds(shape: tuple[int, ...], n: int, seed: int) -> list[dict[str, np.ndarray]]:
    """``n`` seeded standard-normal batches for input ``x``."""
    r = np.random.default_rng(seed)
    return [{"x": r.standard_normal(shape).astype(np.float32)} for _ in range(n)]


def run_opstrata(
    m: onnx.ModelProto, data: list[dict[str, np.ndarray]], names: list[str] | None = None
) -> Any:
    """Every batch through opstrata's InferenceSession; outputs concatenated per name."""
    s = InferenceSession(m)
    outs = [s.run(names, f) for f in data]
    return [np.concatenate(o) for o in zip(*outs, strict=True)]


def run_ort(
    m: onnx.ModelProto,
    data: list[dict[str, np.ndarray]],
    names: list[str] | None = None,
    level: str = "basic",
) -> Any:
    """Every batch through onnxruntime (skips when it is not installed); ``level`` 'basic', 'all' or
    'none' (graph optimizations disabled)."""
    ort = pytest.importorskip("onnxruntime")
    so = ort.SessionOptions()
    so.graph_optimization_level = {
        "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
        "none": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
    }.get(level, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    s = ort.InferenceSession(m.SerializeToString(), so, providers=["CPUExecutionProvider"])
    outs = [s.run(names, f) for f in data]
    return [np.concatenate(o) for o in zip(*outs, strict=True)]


def needs_onnx_float8_decode() -> None:
    """Skip the calling test when the installed onnx cannot decode raw FLOAT8E4M3FN bytes >= 0x80 (the
    negative values): onnx 1.16's numpy_helper.to_array reads them as int8 and refuses them ("-64 is not a
    float8."), and opstrata.graph's importer and onnx's ReferenceEvaluator read initializers through it."""
    t = h.make_tensor("probe", T.FLOAT8E4M3FN, [1], b"\xc0", raw=True)  # -2.0
    try:
        nh.to_array(t)
    except ValueError as exc:
        pytest.skip(
            f"installed onnx {onnx.__version__}'s numpy_helper.to_array cannot decode raw FLOAT8E4M3FN bytes "
            f">= 0x80 (negative values: {exc}), through which opstrata.graph's importer and onnx's "
            "ReferenceEvaluator read the model's float8 initializers"
        )


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = a.ravel().astype(np.float64), b.ravel().astype(np.float64)
    return float(a64 @ b64 / (np.linalg.norm(a64) * np.linalg.norm(b64)))


def with_outputs(m: onnx.ModelProto, names: list[str], elem: int) -> onnx.ModelProto:
    """A copy of ``m`` that also outputs ``names`` (all of element type ``elem``)."""
    out = onnx.ModelProto()
    out.CopyFrom(m)
    for n in names:
        out.graph.output.append(h.make_tensor_value_info(n, elem, None))
    return out


def mixed(seed: int = 0, opset: int = 17) -> onnx.ModelProto:
    """The less common shapes: a Constant-node weight in Gemm(alpha, beta, activation C), an
    activation x activation MatMul, a batched 3-D weight, and one weight shared by two MatMuls."""
    r = np.random.default_rng(seed)
    wc = (r.standard_normal((16, 8)) / 4).astype(np.float32)
    inits = {
        "w3": (r.standard_normal((2, 8, 4)) / 3).astype(np.float32),
        "wt": (r.standard_normal((16, 6)) / 4).astype(np.float32),
    }
    nodes = [
        h.make_node("Constant", [], ["wc"], name="const_wc", value=nh.from_array(wc, "wc")),
        h.make_node("Gemm", ["x", "wc", "c"], ["g1"], name="gemm", alpha=0.5, beta=2.0),
        h.make_node("Transpose", ["g1"], ["g1t"], name="transpose"),
        h.make_node("MatMul", ["g1", "g1t"], ["s"], name="scores"),
        h.make_node("MatMul", ["g1", "w3"], ["y2"], name="batched"),
        h.make_node("MatMul", ["x", "wt"], ["t1"], name="tied1"),
        h.make_node("Relu", ["x"], ["xr"], name="relu"),
        h.make_node("MatMul", ["xr", "wt"], ["t2"], name="tied2"),
    ]
    g = h.make_graph(
        nodes, "mixed",
        [h.make_tensor_value_info("x", T.FLOAT, ["batch", 16]), h.make_tensor_value_info("c", T.FLOAT, ["batch", 8])],
        [
            h.make_tensor_value_info(n, T.FLOAT, shp)
            for n, shp in (("s", ["batch", "batch"]), ("y2", [2, "batch", 4]), ("t1", ["batch", 6]), ("t2", ["batch", 6]))
        ],
        [nh.from_array(a, n) for n, a in inits.items()],
    )  # fmt: skip
    m = h.make_model(g, opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def mixed_feeds(n: int, seed: int) -> list[dict[str, np.ndarray]]:
    r = np.random.default_rng(seed)
    return [
        {
            "x": r.standard_normal((5, 16)).astype(np.float32),
            "c": r.standard_normal((5, 8)).astype(np.float32),
        }
        for _ in range(n)
    ]


def run_reference(m: onnx.ModelProto, data: list[dict[str, np.ndarray]]) -> Any:
    """Every batch through onnx.reference (the spec's literal numpy semantics), at opset >= 21 (the ops
    these models use mean the same from opset 13 on; the reference has no DequantizeLinear below 19)."""
    from onnx.reference import ReferenceEvaluator

    out = onnx.ModelProto()
    out.CopyFrom(m)
    for o in out.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = max(o.version, 21)
    ev = ReferenceEvaluator(out)
    outs = [ev.run(None, f) for f in data]
    return [np.concatenate(o) for o in zip(*outs, strict=True)]


def ln_qkv(
    seed: int = 0, opset: int = 17, d: int = 64, d_out: int = 16, outliers: dict[int, float] | None = None
) -> onnx.ModelProto:
    """x[batch, d] -> LayerNormalization "ln" (gamma x ``outliers`` {channel: factor}) feeding Q/K/V-like
    MatMul "q_proj", MatMul "k_proj", Gemm(transB) "v_proj"; q*k + v -> Relu -> Mul(const) "affine_mul"
    -> Add(const) "affine_add" -> MatMul "o_proj" -> y[batch, d_out]."""
    r = np.random.default_rng(seed)
    gamma = (1.0 + 0.1 * r.standard_normal(d)).astype(np.float32)
    for ch, f in (outliers or {}).items():
        gamma[ch] *= f
    inits = {
        "ln_g": gamma,
        "ln_b": (0.1 * r.standard_normal(d)).astype(np.float32),
        "wq": (r.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32),
        "wk": (r.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32),
        "wv": (r.standard_normal((d, d)) / np.sqrt(d)).astype(np.float32),
        "bv": (0.1 * r.standard_normal(d)).astype(np.float32),
        "aff_g": (0.5 + r.random(d)).astype(np.float32),
        "aff_b": (0.1 * r.standard_normal(d)).astype(np.float32),
        "wo": (r.standard_normal((d, d_out)) / np.sqrt(d)).astype(np.float32),
    }
    nodes = [
        h.make_node("LayerNormalization", ["x", "ln_g", "ln_b"], ["hn"], name="ln", axis=-1, epsilon=1e-5),
        h.make_node("MatMul", ["hn", "wq"], ["q"], name="q_proj"),
        h.make_node("MatMul", ["hn", "wk"], ["k"], name="k_proj"),
        h.make_node("Gemm", ["hn", "wv", "bv"], ["v"], name="v_proj", transB=1),
        h.make_node("Mul", ["q", "k"], ["qk"], name="qk"),
        h.make_node("Add", ["qk", "v"], ["mix"], name="mix"),
        h.make_node("Relu", ["mix"], ["r"], name="relu"),
        h.make_node("Mul", ["r", "aff_g"], ["rg"], name="affine_mul"),
        h.make_node("Add", ["rg", "aff_b"], ["rb"], name="affine_add"),
        h.make_node("MatMul", ["rb", "wo"], ["y"], name="o_proj"),
    ]
    x = h.make_tensor_value_info("x", T.FLOAT, ["batch", d])
    y = h.make_tensor_value_info("y", T.FLOAT, ["batch", d_out])
    return _model(nodes, "ln_qkv", x, y, inits, opset)


def outlier_feeds(
    shape: tuple[int, ...], n: int, seed: int, channels: dict[int, float]
) -> list[dict[str, np.ndarray]]:
    """:func:`feeds` with the last-axis ``channels`` {channel: factor} scaled (activation outliers)."""
    out = feeds(shape, n, seed)
    for f in out:
        for ch, k in channels.items():
            f["x"][..., ch] *= np.float32(k)
    return out
