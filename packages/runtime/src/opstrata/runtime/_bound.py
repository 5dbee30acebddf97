"""Arena runs as a list of prebuilt zero-argument calls: the per-node Python work is done once per shape.

:meth:`Schedule.exec_arena` rebuilds every step's argument list, re-checks which path it takes and
looks its output views up on every run. For an arena those are fixed for the input shape: every
planned value is one arena view, initializers are constant. So each step is bound once to a call
with its input and output views captured; only steps that read a feed or a view alias (values that
change per run) read their inputs from the run's value list. The kernels are the very same
functions exec_arena calls (``out=`` binaries, the ``_into`` writers, the graph's kernel table), with
the same arguments, so results are bit-identical. An ``out=`` binary calls the native kernel its
public function would dispatch to (``ops.resolve_kernel``, its checks done once here); the program
records ``ops.registry_generation()`` and the session rebinds it after any registry or device change.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import numpy as np

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS, OPSTRATA_DOMAIN

from ._errors import ExecutionError
from ._into import qconv_quantize_kwargs

if TYPE_CHECKING:
    from ._arena import Arena
    from ._executor import Schedule, _Step

__all__ = ["BoundProgram", "bind_arena", "release", "run_bound"]

_BOUND_OPS = ((OPSTRATA_DOMAIN, "Attention"), (OPSTRATA_DOMAIN, "SkipLayerNorm"), (OPSTRATA_DOMAIN, "SkipRMSNorm"),
              (OPSTRATA_DOMAIN, "RMSNorm"), ("", "LayerNormalization"), (OPSTRATA_DOMAIN, "RotaryHalf"),
              ("", "Split"), ("", "Transpose"), ("", "Slice"), ("", "Expand"), ("", "Gather"), ("", "Concat"),
              ("", "Conv"), (OPSTRATA_DOMAIN, "FusedConv"), ("", "MaxPool"), ("", "ReduceMean"),
              ("", "GlobalAveragePool"), ("", "Softmax"), ("", "Relu"), ("", "AveragePool"))  # fmt: skip
#: integer / boolean elementwise steps (RoBERTa's position ids from its input ids, attention masks):
#: numpy's ufunc straight into the arena view. For these dtypes the graph's kernels compute exactly this
#: (no rounding, the same wrap-around), one C call of about a microsecond instead of a kernel call
_EXACT_UFUNCS: dict[tuple[str, str], Callable[..., Any]] = {
    ("", "Equal"): np.equal, ("", "Less"): np.less, ("", "Greater"): np.greater,
    ("", "LessOrEqual"): np.less_equal, ("", "GreaterOrEqual"): np.greater_equal, ("", "Not"): np.logical_not,
    ("", "And"): np.logical_and, ("", "Or"): np.logical_or, ("", "Xor"): np.logical_xor, ("", "Add"): np.add,
    ("", "Sub"): np.subtract, ("", "Mul"): np.multiply, ("", "Neg"): np.negative, ("", "Abs"): np.absolute,
    ("", "Max"): np.maximum, ("", "Min"): np.minimum,
}  # fmt: skip
_BOUND_OPS += (*_EXACT_UFUNCS, ("", "Cast"), ("", "CumSum"))
#: the graph's own kernels of the ops bound below: a node whose kernel was replaced (a test, a user
#: override) is called instead
_STOCK = {k: KERNELS.get(k) for k in _BOUND_OPS}

#: the public ``out=`` binaries the executor uses (``_executor._OUT_KERNELS``) and their registry names
_BINARY_NAMES: dict[Callable[..., np.ndarray], str] = {
    ops.add: "add", ops.sub: "sub", ops.mul: "mul", ops.div: "div",
}  # fmt: skip


class BoundProgram:
    """One arena's steps as zero-argument calls over its own value list ``vals`` (runs take turns)."""

    __slots__ = (
        "calls", "direct", "generation", "index", "owners", "reset", "runner", "stage", "template", "vals",
    )  # fmt: skip

    def __init__(
        self,
        calls: list[Callable[[], object]],
        index: list[int],
        vals: list[Any],
        reset: list[int],
        generation: int,
    ) -> None:
        self.calls, self.index, self.vals = calls, index, vals
        #: ops.registry_generation() when bound: a registry or device change since then means rebinding
        self.generation = generation
        self.template = list(vals)
        #: slots holding per-run values (feeds, view aliases): put back after a run so the program
        #: keeps no reference to the caller's arrays
        self.reset = reset
        #: (feed index, buffer): feeds copied into buffers of the program's own, so the steps that read
        #: them are bound like any other (see :data:`STAGE_MAX_BYTES`)
        self.stage: list[tuple[int, np.ndarray]] = []
        #: (slot, feed index) of the feeds read where the caller keeps them (not staged)
        self.direct: list[tuple[int, int]] = []
        #: what a run calls: ``calls`` with consecutive native calls merged (:func:`merge_native`), and
        #: per runner entry the step of each call inside it
        self.runner: list[Callable[[], object]] = list(calls)
        self.owners: list[list[int]] = [[i] for i in index]


def merge_native(prog: BoundProgram) -> None:
    """Run consecutive bound native calls (the VM, norms, depthwise / im2col, pooling, attention) as one
    ``ops.NativeBatch`` each: one C call for the run instead of one Python call per step (ops >= 0.4.20;
    with an older ops the calls stay as they are)."""
    merge = getattr(ops, "merge_bound_calls", None)
    if merge is None:  # the calls as they are now (with_switches may have wrapped some since binding)
        prog.runner, prog.owners = list(prog.calls), [[i] for i in prog.index]
        return
    runner, owners = merge(prog.calls)
    prog.runner = runner
    prog.owners = [[prog.index[p] for p in o] for o in owners]


def _resolved_binary(
    public: Callable[..., np.ndarray], a: Any, b: Any, dst: np.ndarray, device: str
) -> Callable[..., np.ndarray] | None:
    """The registered kernel ``ops.add(a, b, out=dst)`` (or sub/mul/div) ends in, when the public
    function's checks pass for these shapes and dtypes (fixed per arena: checked here once) and it
    would hand ``a``, ``b``, ``dst`` to that kernel unchanged: same dtype throughout, ``dst`` of the
    broadcast shape, a native kernel (a fallback keeps the public, audited path)."""
    name = _BINARY_NAMES.get(public)
    if name is None or not (type(a) is np.ndarray and type(b) is np.ndarray and type(dst) is np.ndarray):
        return None
    if not (a.dtype == b.dtype == dst.dtype) or dst.shape != np.broadcast_shapes(a.shape, b.shape):
        return None
    if (np.may_share_memory(dst, a) and not _same_view(dst, a)) or (
        np.may_share_memory(dst, b) and not _same_view(dst, b)
    ):
        return None  # a partial overlap: leave it to the public function's checks
    return ops.resolve_kernel(name, a.dtype, device=device)


def _same_view(x: np.ndarray, y: np.ndarray) -> bool:
    ix, iy = x.__array_interface__, y.__array_interface__
    return ix["data"] == iy["data"] and x.shape == y.shape and x.strides == y.strides


def _args_of(ins: tuple[int, ...], vals: list[Any]) -> list[Any]:
    return [vals[s] if s >= 0 else None for s in ins]


def _dyn_out(
    fn: Callable[..., np.ndarray], i: int, j: int, dst: np.ndarray, vals: list[Any]
) -> Callable[[], object]:
    def call() -> object:
        return fn(vals[i], vals[j], out=dst)

    return call


def _dyn_into(
    into: Callable[[list[Any], list[np.ndarray]], object],
    ins: tuple[int, ...],
    dsts: list[np.ndarray],
    vals: list[Any],
) -> Callable[[], object]:
    def call() -> object:
        return into([vals[s] if s >= 0 else None for s in ins], dsts)

    return call


def _prebound(
    sch: Schedule, st: _Step, static: list[Any], dsts: list[np.ndarray]
) -> Callable[[], object] | None:
    """A step whose inputs are all fixed for this arena, bound to these arrays once:

    * FusedElementwise on cpu: the generated kernel (the native VM's C call with its pointers resolved:
      one ctypes call per run);
    * MatMul, an activation-free Linear, Attention, the norms (RMSNorm, LayerNormalization and the
      Skip forms, the residual sum then the norm), RotaryHalf and the fused QDQ QConv / QMatMul /
      QuantizeLinear: ``ops.bind`` (the kernel's checks done
      once: the BLAS call and the in-place bias add, or the native C call; the same arithmetic as the
      path it replaces, so the same bits).
    """
    node = st.node
    if any(a is None or type(a) is not np.ndarray for a in static):
        return None
    key = ("" if node.domain == "ai.onnx" else node.domain, node.op_type)
    if len(dsts) != 1 and key not in (
        (OPSTRATA_DOMAIN, "SkipLayerNorm"),
        (OPSTRATA_DOMAIN, "SkipRMSNorm"),
        ("", "Split"),
    ):
        return None
    if key == (OPSTRATA_DOMAIN, "FusedElementwise"):
        if sch.device != "cpu" or not hasattr(og, "bind_fused"):
            return None
        return og.bind_fused(node, static, dsts[0])
    if not hasattr(ops, "bind"):
        return None
    if key in (("", "MatMul"), (OPSTRATA_DOMAIN, "Linear")) and st.into is None:
        return None  # the graph's kernel for it was replaced (a test, a user override): that one runs
    if key == ("", "MatMul") and len(static) == 2:
        return ops.bind("matmul", static[0], static[1], out=dsts[0], device=sch.device)
    if key == (OPSTRATA_DOMAIN, "Linear") and len(static) in (2, 3):
        bias = static[2] if len(static) == 3 else None
        act = node.attrs.get("activation") or ""
        if not act:
            return ops.bind("linear", static[0], static[1], bias, out=dsts[0], device=sch.device)
        if act not in ("relu", "gelu", "gelu_tanh", "silu"):  # the writer's bias_act epilogues
            return None
        gemm = ops.bind("linear", static[0], static[1], None, out=dsts[0], device=sch.device)
        epi = ops.bind("bias_act", dsts[0], bias, None, out=dsts[0], act=act, device=sch.device)
        return None if gemm is None or epi is None else _chain(gemm, epi)
    if key in _STOCK and KERNELS.get(key) is not _STOCK[key]:
        return None
    if key in ((OPSTRATA_DOMAIN, "SkipLayerNorm"), (OPSTRATA_DOMAIN, "SkipRMSNorm")):
        return _bind_skip_norm(sch, node, static, dsts)
    a = node.attrs
    if key == (OPSTRATA_DOMAIN, "RMSNorm") and 1 <= len(static) <= 2:
        w = static[1] if len(static) > 1 else None
        return ops.bind(
            "rms_norm", static[0], w, out=dsts[0], axis=a.get("axis", -1), eps=a.get("epsilon", 1e-6),
            device=sch.device,
        )  # fmt: skip
    if key == ("", "LayerNormalization") and 2 <= len(static) <= 3 and len(node.outputs) == 1:
        b = static[2] if len(static) > 2 else None
        return ops.bind(
            "layer_norm", static[0], static[1], b, out=dsts[0], axis=a.get("axis", -1),
            eps=a.get("epsilon", 1e-5), device=sch.device,
        )  # fmt: skip

    if key == ("", "Conv") and 2 <= len(static) <= 3 and static[1].ndim == 4:
        return _bind_conv(sch, node, static, dsts[0])
    if key == ("", "MaxPool") and len(static) == 1 and static[0].ndim == 4 and static[0].dtype.kind == "f":
        return _bind_max_pool(sch, node, static[0], dsts[0])
    if (
        key == ("", "AveragePool")
        and len(static) == 1
        and static[0].ndim == 4
        and static[0].dtype.kind == "f"
    ):
        return _bind_avg_pool(sch, node, static[0], dsts[0])
    if key == ("", "ReduceMean") and static[0].dtype.kind == "f":
        return _bind_mean(sch, node, static, dsts[0])
    if key == ("", "Softmax") and len(static) == 1 and static[0].ndim >= 1:
        axis = int(a.get("axis", -1))  # over the last axis the opset < 13 (2-D) and later forms agree
        if axis % static[0].ndim == static[0].ndim - 1:
            return ops.bind("softmax", static[0], out=dsts[0], axis=-1, device=sch.device)
    if (
        key == ("", "GlobalAveragePool")
        and len(static) == 1
        and static[0].ndim >= 3
        and static[0].dtype == np.float32
    ):
        # the TorchScript exporter's form of ReduceMean over the image: the same float32 sum and divide
        axes = tuple(range(2, static[0].ndim))
        return ops.bind("mean", static[0], out=dsts[0], axis=axes, keepdims=True, device=sch.device)
    if key == (OPSTRATA_DOMAIN, "FusedConv") and static[1].ndim == 4 and sch.device == "cpu":
        k = int(a.get("conv_inputs", 0))
        if k not in (2, 3) or not hasattr(og, "bind_fused"):
            return None
        epilogue = _gemm_epilogue(node, static[k:], dsts[0])
        if epilogue is not None:  # the conv's GEMM applies it as it stores each output (ops >= 0.4.32)
            fused = _bind_conv(sch, node, static[:k], dsts[0], epilogue)
            if fused is not None:
                return fused
        conv = _bind_conv(sch, node, static[:k], dsts[0])
        if conv is None or any(np.may_share_memory(t, dsts[0]) for t in static):
            return None
        epilogue = og.bind_fused(node, [dsts[0], *static[k:]], dsts[0])  # in place, as the graph's kernel
        return _chain(conv, epilogue)
    if key in (("", "Split"), ("", "Transpose"), ("", "Slice"), ("", "Expand")):
        return _bind_views(key, node, static, dsts)
    if (
        key == ("", "Gather")
        and len(static) == 2
        and static[1].dtype.kind in "iu"
        and static[0].dtype == dsts[0].dtype
    ):
        axis = int(node.attrs.get("axis", 0))
        if np.take(static[0], np.zeros_like(static[1]), axis=axis).shape != dsts[0].shape:
            return None
        take = getattr(ops, "bind_take", None)  # a copy by index, as gather: natively with ops >= 0.4.20
        if take is not None:
            return take(static[0], static[1], axis, dsts[0])
        return partial(np.take, static[0], static[1], axis=axis, out=dsts[0])
    if key == ("", "Concat") and all(t.dtype == dsts[0].dtype for t in static):
        try:
            if np.concatenate(static, axis=int(node.attrs["axis"])).shape != dsts[0].shape:
                return None
        except ValueError:
            return None
        concat = getattr(ops, "bind_concat", None)  # a native copy per piece with ops >= 0.4.20
        if concat is not None:
            return concat(static, int(node.attrs["axis"]), dsts[0])
        return partial(np.concatenate, static, axis=int(node.attrs["axis"]), out=dsts[0])
    if (
        key == ("", "QuantizeLinear")
        and len(static) in (2, 3)
        and dsts[0].dtype in (np.int8, np.uint8)
        and not ({"block_size", "output_dtype", "precision"} & set(node.attrs))
    ):  # int8 / uint8 QDQ activations: the registered kernel's bound call where it has one (float8 and
        # blocked forms keep the per-node path)
        return ops.bind(
            "quantize_linear", *static, axis=node.attrs.get("axis", 1), saturate=bool(node.attrs.get("saturate", 1)),
            out=dsts[0], device=sch.device,
        )  # fmt: skip
    if key == (OPSTRATA_DOMAIN, "QConv") and len(static) == 4 and "scale" in node.attrs:
        return _bind_qconv(sch, node, static, dsts[0])
    if key == (OPSTRATA_DOMAIN, "QConvQuantize") and len(static) in (6, 7) and "scale" in node.attrs:
        return _bind_qconv(sch, node, static, dsts[0])
    if key == ("", "Relu") and len(static) == 1 and static[0].dtype == np.float32:
        return ops.bind(
            "relu", static[0], out=dsts[0], device=sch.device
        )  # the native loop where ops has one
    if key == (OPSTRATA_DOMAIN, "QMatMul") and len(static) == 4 and "scale" in node.attrs:
        if not hasattr(ops, "qmatmul"):  # opstrata-ops < 0.4.57: the per-node path
            return None
        return ops.bind(
            "qmatmul", *static, node.attrs["scale"], node.attrs.get("bias"), out=dsts[0], device=sch.device
        )
    if key == (OPSTRATA_DOMAIN, "RotaryHalf") and len(static) == 3:
        return ops.bind("rope_rotate_half", *static, out=dsts[0], device=sch.device)
    if key == (OPSTRATA_DOMAIN, "Attention") and 3 <= len(static) <= 4:
        into = {int(i) for i in a.get("bshd") or ()}
        q, k, v = (np.swapaxes(t, 1, 2) if i in into else t for i, t in enumerate(static[:3]))
        dst = np.swapaxes(dsts[0], 1, 2) if a.get("bshd_out") else dsts[0]
        mask = static[3] if len(static) > 3 else None
        return ops.bind(
            "attention", q, k, v, out=dst, causal=bool(a.get("causal", 0)), mask=mask, scale=a.get("scale"),
            device=sch.device,
        )  # fmt: skip
    return None


def _chain(*calls: Callable[[], object]) -> Callable[[], object]:
    """``calls`` in order as one step (an ``ops.BoundSteps``, which merge_native opens up, when ops has it)."""
    steps = getattr(ops, "BoundSteps", None)
    if steps is not None:
        return steps(calls)

    def run() -> None:
        for call in calls:
            call()

    return run


#: FusedConv epilogue programs (the graph's ``expr``, constants as ``c<i>``) the conv GEMM applies itself
#: (``ops.CONV_EPILOGUES``): the VM's instructions in the VM's order, so the bits are the same
_GEMM_EPILOGUES: dict[str, str] = {
    "[['Relu', ['x0']]]": "relu",
    "[['Max', ['x0', 'c0']], ['Min', ['t0', 'c1']]]": "clip",
    "[['Mul', ['x0', 'c0']], ['Add', ['t0', 'c1']], ['Max', ['t1', 'c2']], ['Min', ['t2', 'c3']], "
    "['Mul', ['t3', 'x0']]]": "hardswish",
    "[['Add', ['x0', 'x1']]]": "add",
    "[['Add', ['x0', 'x1']], ['Relu', ['t0']]]": "add_relu",
}


def _gemm_epilogue(node: Any, extra: list[Any], dst: np.ndarray) -> tuple[Any, ...] | None:
    """The ``ops.CONV_EPILOGUES`` form of a FusedConv's epilogue, or None (the VM pass runs it)."""
    supported = getattr(ops, "CONV_EPILOGUES", None)
    name = _GEMM_EPILOGUES.get(str(node.attrs.get("expr")))
    if not supported or name not in supported:
        return None
    consts = list(node.attrs.get("consts") or ())
    if name in ("add", "add_relu"):
        if len(extra) != 1 or consts or extra[0].shape != dst.shape or extra[0].dtype != dst.dtype:
            return None  # a broadcast residual stays with the VM
        return (name, extra[0])
    return (name, *consts) if not extra else None


def _window_helpers() -> tuple[Callable[..., Any], Callable[..., bool]] | None:
    """The graph kernels' own window arithmetic: (strides, dilations, pads) of a Conv / pool node and whether
    a 2-D pool's pads fit its window. graph < 0.4.20 has them under private names; older ones not at all
    (None: the per-run path)."""
    try:
        from opstrata.graph.opdefs.conv import conv_geometry, pool_fits_2d
    except ImportError:
        try:
            from opstrata.graph.opdefs.conv import (  # graph 0.4.x before 0.4.20
                _fits_2d as pool_fits_2d,
                _geom as conv_geometry,
            )
        except ImportError:
            return None
    return conv_geometry, pool_fits_2d


def _bind_conv(
    sch: Schedule, node: Any, static: list[Any], dst: np.ndarray, epilogue: tuple[Any, ...] | None = None
) -> Callable[[], object] | None:
    """A 2-D Conv: ``ops.bind("conv2d")`` with the window the graph's kernel derives from the attributes
    (a graph without that arithmetic keeps the per-run path), and ``epilogue`` when given."""
    helpers = _window_helpers()
    if helpers is None:
        return None
    w = static[1]
    kernel = node.attrs.get("kernel_shape") or w.shape[2:]
    s, d, pads = helpers[0](node, static[0], kernel)
    b = static[2] if len(static) > 2 else None
    more = {} if epilogue is None else {"epilogue": epilogue}
    try:
        return ops.bind(
            "conv2d", static[0], w, b, out=dst, stride=tuple(s), padding=tuple(pads), dilation=tuple(d),
            groups=node.attrs.get("group", 1), device=sch.device, **more,
        )  # fmt: skip
    except TypeError:  # a conv2d kernel (another device's) whose binder takes no epilogue
        if epilogue is None:
            raise
        return None


def _bind_qconv(sch: Schedule, node: Any, static: list[Any], dst: np.ndarray) -> Callable[[], object] | None:
    """A fused QDQ Conv (``QConv``: x_q, x_zp, w_q, w_zp; per-channel scale and bias as attributes):
    ``ops.bind("qconv")`` with the window the graph's kernel derives, so the registered int8 kernel (when
    one is) runs without the per-node path. ``QConvQuantize`` (+ y_scale, y_zp[, residual]; attrs activation, alpha,
    beta) binds ``qconv_quantize`` the same way."""
    helpers = _window_helpers()
    if helpers is None or static[2].ndim != 4:
        return None
    a = node.attrs
    kernel = a.get("kernel_shape") or static[2].shape[2:]
    s, d, pads = helpers[0](node, static[0], kernel)
    window = {"stride": list(s), "pads": list(pads), "dilation": list(d), "groups": a.get("group", 1)}
    if len(static) >= 6:
        return ops.bind(
            "qconv_quantize", *static[:4], a["scale"], a.get("bias"), static[4], static[5], out=dst,
            device=sch.device, **qconv_quantize_kwargs(node, static), **window,
        )  # fmt: skip
    return ops.bind("qconv", *static, a["scale"], a.get("bias"), out=dst, device=sch.device, **window)


def _bind_max_pool(sch: Schedule, node: Any, x: np.ndarray, dst: np.ndarray) -> Callable[[], object] | None:
    """A 2-D MaxPool without Indices that the graph's kernel runs on ``max_pool2d``: bound to it."""
    helpers = _window_helpers()
    if helpers is None:
        return None
    k = list(node.attrs.get("kernel_shape") or ())
    if len(k) != 2:
        return None
    s, d, pads = helpers[0](node, x, k)
    if not helpers[1](k, d, pads):
        return None
    return ops.bind(
        "max_pool2d", x, out=dst, kernel_size=tuple(k), stride=tuple(s), padding=tuple(pads), dilation=tuple(d),
        ceil_mode=bool(node.attrs.get("ceil_mode", 0)), device=sch.device,
    )  # fmt: skip


def _bind_avg_pool(sch: Schedule, node: Any, x: np.ndarray, dst: np.ndarray) -> Callable[[], object] | None:
    """A 2-D AveragePool the graph's kernel runs on ``avg_pool2d`` (no dilation): bound to it."""
    helpers = _window_helpers()
    k = list(node.attrs.get("kernel_shape") or ())
    if helpers is None or len(k) != 2:
        return None
    s, d, pads = helpers[0](node, x, k)
    if any(v != 1 for v in d) or not helpers[1](k, d, pads):
        return None
    return ops.bind(
        "avg_pool2d", x, out=dst, kernel_size=tuple(k), stride=tuple(s), padding=tuple(pads),
        ceil_mode=bool(node.attrs.get("ceil_mode", 0)),
        count_include_pad=bool(node.attrs.get("count_include_pad", 0)), device=sch.device,
    )  # fmt: skip


def _bind_mean(sch: Schedule, node: Any, static: list[Any], dst: np.ndarray) -> Callable[[], object] | None:
    """ReduceMean over constant axes (the attribute, or an initializer input): ``ops.bind("mean")``."""
    if len(static) == 2:
        if node.inputs[1] not in sch.graph.initializers:
            return None  # axes computed at run time
        axes = tuple(int(a) % static[0].ndim for a in np.asarray(static[1]).ravel())
    elif len(static) == 1:
        axes = tuple(int(a) % static[0].ndim for a in node.attrs.get("axes") or ()) or None
    else:
        return None
    if axes is None and node.attrs.get("noop_with_empty_axes", 0):
        return None
    keep = bool(node.attrs.get("keepdims", 1))
    return ops.bind("mean", static[0], out=dst, axis=axes, keepdims=keep, device=sch.device)


def _bind_views(
    key: tuple[str, str], node: Any, static: list[Any], dsts: list[np.ndarray]
) -> Callable[[], object] | None:
    """Split / Transpose / Slice / Expand whose graph kernel returns views of its input's arena bytes
    (fixed per shape): the views are taken once here and each run copies them into the output views."""
    try:
        pieces = KERNELS[key](node, list(static))
    except Exception:
        return None  # the per-run path raises it, naming the node
    if len(pieces) != len(dsts) or any(
        type(p) is not np.ndarray or not np.may_share_memory(p, static[0]) or np.may_share_memory(p, d)
        or p.shape != d.shape or p.dtype != d.dtype
        for p, d in zip(pieces, dsts, strict=True)
    ):  # fmt: skip
        return None
    copy = getattr(ops, "bind_copy", None) or (
        lambda d, p: partial(np.copyto, d, p)
    )  # native with ops >= 0.4.20
    copies = [copy(d, p) for d, p in zip(dsts, pieces, strict=True)]
    return copies[0] if len(copies) == 1 else _chain(*copies)


def _bind_skip_norm(
    sch: Schedule, node: Any, static: list[Any], dsts: list[np.ndarray]
) -> Callable[[], object] | None:
    """``SkipLayerNorm`` / ``SkipRMSNorm``: the residual sum into its view (the output's when no one else
    reads it), then the norm of it, both bound (the same ops the graph's kernel and the writer run)."""
    if len(static) < 3:
        return None
    s_view = dsts[1] if len(dsts) > 1 else dsts[0]
    x, skip = static[0], static[1]
    if not (x.dtype == skip.dtype == s_view.dtype and x.shape == skip.shape == s_view.shape):
        return None
    if sch.device != "cpu" or ops.resolve_kernel("add", x.dtype, device=sch.device) is None:
        return None
    add = ops.bind("add", x, skip, out=s_view, device=sch.device) or partial(
        np.add, x, skip, out=s_view
    )  # the cpu add kernel's (native) call for equal shapes
    a = node.attrs
    if node.op_type == "SkipLayerNorm":
        beta = static[3] if len(static) > 3 else None
        norm = ops.bind(
            "layer_norm", s_view, static[2], beta, out=dsts[0], axis=a.get("axis", -1),
            eps=a.get("epsilon", 1e-5), device=sch.device,
        )  # fmt: skip
    else:
        norm = ops.bind(
            "rms_norm", s_view, static[2], out=dsts[0], axis=a.get("axis", -1), eps=a.get("epsilon", 1e-6),
            device=sch.device,
        )  # fmt: skip
    return None if norm is None else _chain(add, norm)


def _generic(
    sch: Schedule, st: _Step, ins: tuple[int, ...], static: list[Any] | None, vals: list[Any],
    alias: frozenset[int], arena: Arena,
) -> Callable[[], object]:  # fmt: skip
    """The kernel table's ``fn(node, args)`` and the copy of its results into the output views."""
    fn, node, store = st.fn, st.node, sch._store
    outs = [(k, s, s in alias) for k, s in enumerate(st.outs) if s >= 0]

    def call() -> object:
        res = fn(node, list(static) if static is not None else [vals[s] if s >= 0 else None for s in ins])
        for k, s, is_alias in outs:
            if is_alias:  # a checked view of its input's bytes (see view_aliases)
                r, dst = res[k], vals[s]
                if r.shape != dst.shape or r.dtype != dst.dtype:
                    store(st, k, dst, r, arena)  # raises the shape/dtype error
                vals[s] = r
            elif k < len(res):
                store(st, k, vals[s], res[k], arena)
        return None

    return call


def _bind_exact(sch: Schedule, st: _Step, static: list[Any], dst: np.ndarray) -> Callable[[], object] | None:
    """An integer / boolean elementwise step, an integer-source Cast or an inclusive forward CumSum of
    integers as one numpy call into ``dst`` (see :data:`_EXACT_UFUNCS`); None for anything else."""
    n = st.node
    key = ("" if n.domain == "ai.onnx" else n.domain, n.op_type)
    if key not in _STOCK or KERNELS.get(key) is not _STOCK[key] or type(dst) is not np.ndarray:
        return None
    if any(a is None or type(a) is not np.ndarray or a.dtype.kind not in "biu" for a in static):
        return None
    if key == ("", "Cast"):
        if len(static) != 1 or dst.shape != static[0].shape or dst.dtype.kind not in "biuf":
            return None
        if dst.dtype.kind == "f" and dst.dtype not in (np.float16, np.float32, np.float64):
            return None  # ml_dtypes' floats: the kernel's own cast
        return partial(np.copyto, dst, static[0], casting="unsafe")  # what astype computes
    if key == ("", "CumSum"):
        a, x = n.attrs, static[0]
        if a.get("exclusive", 0) or a.get("reverse", 0) or x.ndim == 0:
            return None
        if len(static) == 2 and static[1].size == 1 and n.inputs[1] in sch.graph.initializers:
            axis = int(static[1].reshape(-1)[0])  # a constant axis input (a run-time one may change)
        elif len(static) == 1 and "axis" in a:
            axis = int(a["axis"])
        else:
            return None
        if dst.shape != x.shape or dst.dtype != x.dtype or not -x.ndim <= axis < x.ndim:
            return None
        axis %= x.ndim
        return partial(np.cumsum, x, axis=axis, dtype=dst.dtype, out=dst)  # wraps as the kernel's cast does
    fn = _EXACT_UFUNCS.get(key)
    if fn is None or len(static) != fn.nin:
        return None
    try:
        want = fn(*[np.zeros((), a.dtype) for a in static])
        shape = np.broadcast_shapes(*(a.shape for a in static))
    except (TypeError, ValueError):
        return None
    if want.dtype != dst.dtype or shape != dst.shape:
        return None
    return partial(fn, *static, out=dst)


def _bind_step(
    sch: Schedule, st: _Step, vals: list[Any], dynamic: frozenset[int], alias: frozenset[int], arena: Arena
) -> Callable[[], object]:
    """A zero-argument call doing what ``sch.exec_arena(st, vals, alias, arena)`` does for this arena."""
    ins = list(st.ins)
    while ins and ins[-1] < 0:  # exec_arena drops trailing absent inputs
        ins.pop()
    t = tuple(ins)
    if any(s >= 0 and s not in dynamic and vals[s] is None for s in t) or any(
        s >= 0 and vals[s] is None for s in st.outs
    ):  # an unplanned value: keep the general per-run path
        return partial(sch.exec_arena, st, vals, alias, arena)
    is_dyn = any(s in dynamic for s in t)
    static = None if is_dyn else _args_of(t, vals)
    if static is not None and len(st.outs) == 1 and st.outs[0] >= 0 and st.outs[0] not in alias:
        exact = _bind_exact(sch, st, static, vals[st.outs[0]])
        if exact is not None:
            return exact
    if st.out_fn is not None and len(t) == 2:
        if t[0] < 0 or t[1] < 0 or st.outs[0] < 0 or st.outs[0] in alias:
            return partial(sch.exec_arena, st, vals, alias, arena)
        dst = vals[st.outs[0]]
        fn = _resolved_binary(st.out_fn, vals[t[0]], vals[t[1]], dst, sch.device) or st.out_fn
        if static is not None:
            binder = getattr(fn, "binder", None) if fn is not st.out_fn else None
            bound = binder(static[0], static[1], out=dst) if binder is not None else None
            return bound if bound is not None else partial(fn, static[0], static[1], out=dst)
        return _dyn_out(fn, t[0], t[1], dst, vals)
    if static is not None and all(s >= 0 and s not in alias for s in st.outs):
        bound = _prebound(sch, st, static, [vals[s] for s in st.outs])
        if bound is not None:
            return bound
    if st.into is not None and all(s >= 0 and s not in alias for s in st.outs):
        dsts = [vals[s] for s in st.outs]
        if static is not None:
            return partial(st.into, static, dsts)
        return _dyn_into(st.into, t, dsts, vals)
    return _generic(sch, st, t, static, vals, alias, arena)


#: ops whose result is not a function of their inputs: never folded
NOT_PURE = frozenset(
    {
        "RandomNormal",
        "RandomUniform",
        "RandomNormalLike",
        "RandomUniformLike",
        "Multinomial",
        "Bernoulli",
        "Dropout",
    }
)
#: ops that read only their input's shape
SHAPE_ONLY = frozenset({"Shape", "Size"})
#: a shape-derived value above this size is recomputed per run rather than held beside the arena
FOLD_MAX_BYTES = 1 << 20


def shape_static_steps(sch: Schedule, vals: list[Any], unplanned: frozenset[int]) -> list[int]:
    """Steps whose results are fixed once the input shapes are: ``Shape`` / ``Size`` of a planned value
    and every deterministic node reading only initializers and such results (the Shape -> Gather ->
    Concat -> Reshape / Expand / mask-building subgraphs exporters emit). Only results of a planned
    shape of at most :data:`FOLD_MAX_BYTES` qualify."""
    static = {sch.slot[x] for x in sch.graph.initializers}
    found = []
    for i, st in enumerate(sch.steps):
        n = st.node
        ins = [s for s in st.ins if s >= 0]
        if not ins or n.op_type in NOT_PURE or not all(s >= 0 for s in st.outs):
            continue
        if n.domain in ("", "ai.onnx") and n.op_type in SHAPE_ONLY:  # a view alias has its planned shape too
            ok = ins[0] not in unplanned
        else:
            ok = all(s in static for s in ins)
        ok = ok and all(isinstance(vals[s], np.ndarray) and vals[s].nbytes <= FOLD_MAX_BYTES for s in st.outs)
        if ok:
            found.append(i)
            static.update(st.outs)
    return found


def _fold(sch: Schedule, steps: list[int], vals: list[Any], feeds: list[np.ndarray]) -> list[int]:
    """Compute ``steps`` once (feeds give the Shape nodes their shapes) and put their results into
    ``vals`` as read-only arrays of their own; returns the steps folded (one whose result does not match
    its planned shape or dtype stays a step, where the run names the disagreement)."""
    work = list(vals)
    for s, f in zip(sch.input_slots, feeds, strict=True):
        work[s] = f
    done = []
    for i in steps:
        st = sch.steps[i]
        ins = list(st.ins)
        while ins and ins[-1] < 0:
            ins.pop()
        if any(s >= 0 and work[s] is None for s in ins):
            continue
        res = sch._compute(st, _args_of(tuple(ins), work))
        outs = []
        for k, s in enumerate(st.outs):
            r = np.asarray(res[k]) if k < len(res) else None
            planned = vals[s]
            if r is None or r.shape != planned.shape or r.dtype != planned.dtype:
                break
            own = np.array(r, copy=True, order="C")  # kernels bind to C-order operands once
            own.flags.writeable = False
            outs.append((s, own))
        else:
            for s, own in outs:
                vals[s] = work[s] = own
            done.append(i)
    return done


def bind_arena(
    sch: Schedule, arena: Arena, template: list[Any], feeds: list[np.ndarray] | None = None
) -> BoundProgram:
    """The arena's steps (reshape-likes already on their input's bytes left out) as bound calls. With the
    run's ``feeds``, steps fixed by the input shapes (:func:`shape_static_steps`) are computed here once
    and left out too: their results are constants of this arena."""
    generation = ops.registry_generation()
    vals = list(template)
    alias = sch.alias_slots(arena)
    unplanned = frozenset(
        s for st in sch.steps for s in st.outs if s >= 0 and vals[s] is None
    )  # dynamic shapes
    folded = _fold(sch, shape_static_steps(sch, vals, unplanned), vals, feeds) if feeds is not None else []
    constants = frozenset(o for i in folded for o in sch.steps[i].node.outputs if o)
    skip = set(folded) | sch.view_steps(arena, constants)  # reshapes to a folded target are views too
    # per-run values: feeds, and aliases a running step sets (a skipped step's alias stays its arena view)
    set_by_skipped = {s for i in skip for s in sch.steps[i].outs}
    dynamic = frozenset(sch.input_slots) | (alias - set_by_skipped) | unplanned
    stage = _stage_feeds(sch, vals, feeds) if feeds is not None else []
    dynamic = dynamic - {sch.input_slots[k] for k, _ in stage}
    views = _views_of_staged(sch, vals, {sch.input_slots[k] for k, _ in stage}, skip, constants)
    skip |= set(views)
    dynamic = dynamic - {sch.steps[i].outs[0] for i in views}
    calls, index = [], []
    for i, st in enumerate(sch.steps):
        if i not in skip:
            calls.append(_bind_step(sch, st, vals, dynamic, alias, arena))
            index.append(i)
    prog = BoundProgram(calls, index, vals, sorted(dynamic), generation)
    prog.stage = stage
    staged = {k for k, _ in stage}
    prog.direct = [(s, k) for k, s in enumerate(sch.input_slots) if k not in staged]
    return prog


def _views_of_staged(
    sch: Schedule, vals: list[Any], staged: set[int], skip: set[int], constants: frozenset[str]
) -> list[int]:
    """Reshape-likes (Reshape, Squeeze, Flatten, ...) of a staged feed -- or of such a view -- to a
    constant target: their result is a fixed view of the program's own buffer, taken here once and
    placed in ``vals`` (the step is left out, its readers bind to the view). GPT-2's ``input_ids`` ->
    Reshape -> Gather. Returns the steps so replaced."""
    from ._arena import _RESHAPES

    fixed, out = set(staged), []
    for i, st in enumerate(sch.steps):
        n = st.node
        if i in skip or not (n.domain in ("", "ai.onnx") and n.op_type in _RESHAPES and len(st.outs) == 1):
            continue
        if not st.ins or st.ins[0] not in fixed or st.outs[0] < 0:
            continue
        if not all(not c or c in sch.graph.initializers or c in constants for c in n.inputs[1:]):
            continue
        kernel = KERNELS.get(("", n.op_type))
        try:
            (view,) = kernel(n, [vals[s] if s >= 0 else None for s in st.ins])  # type: ignore[misc]
        except Exception:
            continue  # the per-run path raises it, naming the node
        base = vals[st.ins[0]]
        if type(view) is not np.ndarray or view.size != base.size or not np.shares_memory(view, base):
            continue  # a copy would freeze this run's values
        vals[st.outs[0]] = view
        fixed.add(st.outs[0])
        out.append(i)
    return out


#: feeds up to this size are copied into a buffer of the bound program each run (a few microseconds)
#: so that the steps reading them are bound too; a larger feed is read where the caller keeps it
STAGE_MAX_BYTES = 4 << 20


def _stage_feeds(sch: Schedule, vals: list[Any], feeds: list[np.ndarray]) -> list[tuple[int, np.ndarray]]:
    """Buffers for the feeds (plain numeric arrays of at most STAGE_MAX_BYTES) placed in ``vals``."""
    stage = []
    for k, (s, f) in enumerate(zip(sch.input_slots, feeds, strict=True)):
        if type(f) is np.ndarray and f.dtype.kind in "biuf" and f.nbytes <= STAGE_MAX_BYTES:
            vals[s] = np.empty(f.shape, f.dtype)
            stage.append((k, vals[s]))
    return stage


def run_bound(sch: Schedule, prog: BoundProgram, feeds: list[np.ndarray]) -> list[Any]:
    """Run ``prog`` on ``feeds`` (in graph input order); returns its value list (read the outputs, then
    call :func:`release`). A failing kernel raises ExecutionError naming its node."""
    vals = prog.vals
    for s, i in prog.direct:
        vals[s] = feeds[i]
    for i, buf in prog.stage:  # same shape (the program's key) and dtype (the session checked it)
        np.copyto(buf, feeds[i], casting="no")  # the slot holds buf for good (the template has it)
    k = 0
    try:
        for k, call in enumerate(prog.runner):  # noqa: B007  (k names the failing step)
            call()
    except ExecutionError:
        release(prog)
        raise
    except Exception as err:
        exc, j = err, 0
        batch_error = getattr(ops, "NativeBatchError", None)  # ops >= 0.4.20 merges native calls
        if batch_error is not None and isinstance(err, batch_error):  # a call inside a merged run
            j, exc = err.index, err.__cause__ or err
        st = sch.steps[prog.owners[k][j]]
        ins = list(st.ins)
        while ins and ins[-1] < 0:
            ins.pop()
        failure = sch._fail(st, _args_of(tuple(ins), vals), exc)
        release(prog)
        raise failure from exc
    return vals


def release(prog: BoundProgram) -> None:
    """Drop the run's feeds and alias values from the program's value list."""
    vals, template = prog.vals, prog.template
    for s in prog.reset:
        vals[s] = template[s]
