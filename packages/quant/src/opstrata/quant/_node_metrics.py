"""Per-node and model-level accuracy of a quantized model against its float original, in opstrata's runtime.

* Which nodes a scheme quantized: the MatMul/Gemm/Conv nodes of the float model whose inputs changed (now
  fed by DequantizeLinear) or that were replaced (the MatMulInteger form); each keeps its output tensor name.
* Output metrics (``sqnr_db``, ``cosine``): that tensor in the quantized model against the same tensor in
  the float model, both exposed as graph outputs: the error accumulated up to the node.
* Local metrics: the node's quantized form (its QDQ / DynamicQuantizeLinear / MatMulInteger subgraph,
  copied out of the quantized model) fed the *float* model's values, against the float node: the error the
  node itself adds. The accuracy budget puts nodes back to float in order of this figure.
* Model outputs: cosine / SQNR / max abs error, top-1 agreement (argmax of the last axis) and perplexity
  (next-token negative log-likelihood from logits and the token ids fed as an input).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import onnx

from ._calibrate import _with_outputs
from ._errors import QuantError
from ._model import QUANTIZABLE, ModelInfo, ensure_opset, opset
from ._report import OutputMetrics, _Acc

__all__ = [
    "FloatReference",
    "LMSpec",
    "Measurement",
    "QNode",
    "initializer_bytes",
    "local_metrics",
    "measure",
    "quantized_nodes",
]

_LOCAL = "__opstrata_local"


@dataclass(frozen=True)
class QNode:
    """One quantized node: its name and op type in the float model and the output tensor compared."""

    name: str
    op: str
    output: str


def quantized_nodes(src: onnx.ModelProto, q: onnx.ModelProto) -> list[QNode]:
    """The MatMul/Gemm/Conv nodes of ``src`` that ``q`` quantized (inputs rewired, or the node replaced)."""
    qnodes = {n.name: n for n in q.graph.node}
    out = []
    for n in src.graph.node:
        if n.op_type not in QUANTIZABLE or n.domain not in ("", "ai.onnx") or not n.output or not n.output[0]:
            continue
        qn = qnodes.get(n.name)
        if qn is None or qn.op_type != n.op_type or list(qn.input) != list(n.input):
            out.append(QNode(n.name, n.op_type, n.output[0]))
    return out


@dataclass(frozen=True)
class LMSpec:
    """Perplexity inputs: the logits output ``[..., T, V]`` and the integer input of token ids ``[..., T]``
    (position t of the logits predicts token t + 1)."""

    logits: str
    labels: str


def _nll(logits: np.ndarray, ids: np.ndarray, spec: LMSpec) -> tuple[float, int]:
    """Summed next-token negative log-likelihood and token count."""
    if logits.ndim < 2 or logits.shape[:-1] != ids.shape:
        raise QuantError(
            "quantize(task='lm')", f"logits {spec.logits!r} of shape {list(logits.shape)} do not line up with "
            f"token ids {spec.labels!r} of shape {list(ids.shape)} (expected logits [..., T, vocab] and ids [..., T])",
            "pass logits= (the output holding next-token logits) and labels= (the input of token ids)",
        )  # fmt: skip
    lg = np.asarray(logits[..., :-1, :], np.float64)
    tgt = np.asarray(ids[..., 1:]).astype(np.int64)
    if tgt.size == 0:
        return 0.0, 0
    vocab = lg.shape[-1]
    if tgt.min() < 0 or tgt.max() >= vocab:
        raise QuantError(
            "quantize(task='lm')", f"token ids in {spec.labels!r} span [{tgt.min()}, {tgt.max()}], outside the "
            f"vocabulary [0, {vocab}) of logits {spec.logits!r}", "feed token ids the model's vocabulary holds",
        )  # fmt: skip
    mx = lg.max(axis=-1, keepdims=True)
    lse = mx[..., 0] + np.log(np.exp(lg - mx).sum(axis=-1))
    picked = np.take_along_axis(lg, tgt[..., None], axis=-1)[..., 0]
    return float((lse - picked).sum()), int(tgt.size)


def _ppl(nll: float, count: int) -> float:
    return float(np.exp(nll / count)) if count else float("nan")


@dataclass
class Measurement:
    """One quantized model measured against the float reference."""

    outputs: dict[str, OutputMetrics]
    top1: dict[str, float]
    nodes: dict[str, OutputMetrics]  # by output tensor name
    perplexity: tuple[float, float] | None  # (float, quantized)


class FloatReference:
    """The float model run once over ``data``: its outputs and the tensors the quantized nodes write,
    kept per batch so each re-quantization is compared without running float again."""

    def __init__(
        self,
        src: onnx.ModelProto,
        data: list[dict[str, np.ndarray]],
        tensors: list[str],
        *,
        top1: Callable[[str, np.ndarray], bool],
        lm: LMSpec | None,
    ) -> None:
        from opstrata.runtime import InferenceSession

        self.data, self.lm = data, lm
        self.outputs = [o.name for o in src.graph.output]
        self.tensors = [t for t in tensors if t not in self.outputs]
        fetch = self.outputs + self.tensors
        sess = InferenceSession(_with_outputs(src, self.tensors, ModelInfo(src)))
        self.values = [dict(zip(fetch, sess.run(fetch, feeds), strict=True)) for feeds in data]
        first = self.values[0]
        self.float_outputs = [n for n in self.outputs if np.asarray(first[n]).dtype.kind == "f"]
        if not self.float_outputs:
            raise QuantError("quantize(model)", "the model has no float output to compare against",
                             "quantize a model with float outputs")  # fmt: skip
        self.top1_outputs = [n for n in self.float_outputs if top1(n, np.asarray(first[n]))]
        self.float_nll = (0.0, 0)
        if lm is not None:
            nll, cnt = 0.0, 0
            for feeds, vals in zip(data, self.values, strict=True):
                a, b = _nll(np.asarray(vals[lm.logits]), feeds[lm.labels], lm)
                nll, cnt = nll + a, cnt + b
            self.float_nll = (nll, cnt)


def measure(ref: FloatReference, q: onnx.ModelProto, nodes: list[QNode]) -> Measurement:
    """Run ``q`` over the reference data; compare its outputs and the quantized nodes' outputs."""
    from opstrata.runtime import InferenceSession

    tensors = [n.output for n in nodes if n.output not in ref.outputs]
    fetch = ref.outputs + tensors
    sess = InferenceSession(_with_outputs(q, tensors, ModelInfo(q)))
    out_acc = {n: _Acc() for n in ref.float_outputs}
    node_acc = {n.output: _Acc() for n in nodes}
    agree = {n: [0, 0] for n in ref.top1_outputs}
    nll, cnt = 0.0, 0
    for feeds, fvals in zip(ref.data, ref.values, strict=True):
        got = dict(zip(fetch, sess.run(fetch, feeds), strict=True))
        for n, acc in out_acc.items():
            acc.add(fvals[n], got[n])
        for t, acc in node_acc.items():
            if np.asarray(fvals[t]).dtype.kind == "f":
                acc.add(fvals[t], got[t])
        for n, a in agree.items():
            fa, qa = np.asarray(fvals[n]).argmax(axis=-1), np.asarray(got[n]).argmax(axis=-1)
            a[0] += int((fa == qa).sum())
            a[1] += int(fa.size)
        if ref.lm is not None:
            x, c = _nll(np.asarray(got[ref.lm.logits]), feeds[ref.lm.labels], ref.lm)
            nll, cnt = nll + x, cnt + c
    ppl = (_ppl(*ref.float_nll), _ppl(nll, cnt)) if ref.lm is not None else None
    return Measurement(
        outputs={n: a.metrics(n) for n, a in out_acc.items()},
        top1={n: (a[0] / a[1] if a[1] else float("nan")) for n, a in agree.items()},
        nodes={t: a.metrics(t) for t, a in node_acc.items() if a.n},
        perplexity=ppl,
    )


@dataclass
class _Copy:
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    seen: set[str] = field(default_factory=set)


def _probe(src: onnx.ModelProto, q: onnx.ModelProto, nodes: list[QNode]) -> tuple[onnx.ModelProto, list[str]]:
    """The float model (at ``q``'s opset) plus, per quantized node, a copy of its quantized subgraph read
    from ``q`` and fed the float values; outputs: each node's float output and its ``__opstrata_local<i>``
    twin."""
    base = ensure_opset(src, opset(q), "quantize")
    p = onnx.ModelProto()
    p.CopyFrom(base)
    versions = {o.domain: o.version for o in p.opset_import}
    for o in q.opset_import:
        versions[o.domain] = max(versions.get(o.domain, 0), o.version)
    del p.opset_import[:]
    p.opset_import.extend(onnx.helper.make_opsetid(d, v) for d, v in versions.items())
    p.ir_version = max(p.ir_version, q.ir_version)
    g = p.graph
    known = (
        {i.name for i in g.input} | {t.name for t in g.initializer} | {o for n in g.node for o in n.output}
    )
    qprod = {o: n for n in q.graph.node for o in n.output if o}
    qinit = {t.name: t for t in q.graph.initializer}
    added: set[str] = set()
    outs: list[str] = []
    for i, qn in enumerate(nodes):
        start = qprod.get(qn.output)
        if start is None:  # pragma: no cover - quantized_nodes only lists outputs q writes
            continue
        suffix = f"{_LOCAL}{i}"
        cp = _Copy()

        def need(t: str, cp: _Copy = cp) -> None:
            if not t or t in known:
                return
            if t in qinit:
                if t not in added:
                    g.initializer.append(qinit[t])
                    added.add(t)
                return
            n = qprod.get(t)
            if n is None:
                raise QuantError("quantize(report)", f"tensor {t!r} of the quantized model has no producer",
                                 "report this with the model")  # fmt: skip
            visit(n, cp)

        def visit(n: onnx.NodeProto, cp: _Copy = cp) -> None:
            if n.name in cp.seen:
                return
            cp.seen.add(n.name)
            for x in n.input:
                need(x, cp)
            cp.nodes.append(n)

        visit(start, cp)
        made = {o for n in cp.nodes for o in n.output if o}
        for n in cp.nodes:
            c = onnx.NodeProto()
            c.CopyFrom(n)
            c.name = f"{n.name}{suffix}"
            c.input[:] = [f"{x}{suffix}" if x in made else x for x in n.input]
            c.output[:] = [f"{o}{suffix}" if o else o for o in n.output]
            g.node.append(c)
        outs += [qn.output, f"{qn.output}{suffix}"]
    del g.output[:]
    g.output.extend(onnx.helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outs)
    return p, outs


def local_metrics(
    src: onnx.ModelProto, q: onnx.ModelProto, nodes: list[QNode], data: list[dict[str, np.ndarray]]
) -> dict[str, OutputMetrics]:
    """Per quantized node (by name): its quantized form on float inputs against the float node."""
    from opstrata.runtime import InferenceSession

    if not nodes:
        return {}
    p, outs = _probe(src, q, nodes)
    sess = InferenceSession(p)
    accs = [_Acc() for _ in nodes]
    for feeds in data:
        vals = sess.run(outs, feeds)
        for i, acc in enumerate(accs):
            f, lq = vals[2 * i], vals[2 * i + 1]
            if np.asarray(f).dtype.kind == "f":
                acc.add(f, lq)
    return {n.name: a.metrics(n.name) for n, a in zip(nodes, accs, strict=True) if a.n}


def initializer_bytes(m: onnx.ModelProto) -> int:
    """Bytes of every initializer as stored (4-bit types packed two per byte)."""
    total = 0
    for t in m.graph.initializer:
        if t.raw_data:
            total += len(t.raw_data)
            continue
        count = int(np.prod(t.dims)) if len(t.dims) else 1
        if t.data_type in _FOUR_BIT:
            total += (count + 1) // 2
        else:
            try:
                total += count * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
            except Exception:  # strings and types numpy cannot size: the serialized size
                total += t.ByteSize()
    return total


_FOUR_BIT = {
    getattr(onnx.TensorProto, n) for n in ("INT4", "UINT4", "FLOAT4E2M1") if hasattr(onnx.TensorProto, n)
}
