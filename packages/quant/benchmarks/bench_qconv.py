"""quant's native int8 convolution (ops' ``qconv``: the dequantizing QDQ Conv) against ops' fp32
``conv2d`` on the same shapes, both as the bound calls a session makes (checks done once, outputs
preallocated), with onnxruntime's fp32 Conv and int8 QLinearConv beside them.

Run: ``python packages/quant/benchmarks/bench_qconv.py [--quick] [--repeats N]``.
One thread everywhere (set before numpy / onnxruntime load). Shapes: ResNet-18's and MobileNet's
convolutions at the zoo's 64x64 input, batch 8 (stem 7x7/2, 3x3 of each stage, 1x1 projections,
depthwise 3x3 and 5x5). Each cell is a median of interleaved rounds with rotating order; ratios are
the figures (absolute times on a shared machine are noise). Every int8 result is checked against ops'
reference kernel first.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "OPSTRATA_NUM_THREADS"):
    os.environ[_var] = "1"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import platform  # noqa: E402
from collections.abc import Callable  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

import opstrata.ops as ops  # noqa: E402
import opstrata.quant as oq  # noqa: E402
from opstrata.ops.benchtools import compare, format_table  # noqa: E402

try:
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper
except ImportError:  # the onnxruntime columns are optional
    ort = None  # type: ignore[assignment]

#: (name, N, C, H, OC, k, stride, pad, groups)
SHAPES = [
    ("resnet stem 7x7/2", 8, 3, 64, 64, 7, 2, 3, 1),
    ("resnet 3x3 c64", 8, 64, 16, 64, 3, 1, 1, 1),
    ("resnet 3x3 c128", 8, 128, 8, 128, 3, 1, 1, 1),
    ("resnet 3x3 c256", 8, 256, 4, 256, 3, 1, 1, 1),
    ("resnet 1x1/2 proj", 8, 64, 16, 128, 1, 2, 0, 1),
    ("mobilenet 1x1 c16->72", 8, 16, 16, 72, 1, 1, 0, 1),
    ("depthwise 3x3/2 c72", 8, 72, 16, 72, 3, 2, 1, 72),
    ("depthwise 5x5 c96", 8, 96, 8, 96, 5, 1, 2, 96),
]


def _ort_conv(
    w: np.ndarray, b: np.ndarray, stride: int, pad: int, groups: int, int8: bool
) -> Callable[..., Any]:
    """An onnxruntime session of one fp32 Conv or one QLinearConv (uint8 x, int8 w, uint8 y)."""
    attrs = {"strides": [stride] * 2, "pads": [pad] * 4, "group": groups}
    if int8:
        inits = [numpy_helper.from_array(np.array(0.05, np.float32), "xs"), numpy_helper.from_array(np.array(3, np.uint8), "xz"),
                 numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.full(w.shape[0], 0.01, np.float32), "ws"),
                 numpy_helper.from_array(np.zeros(w.shape[0], np.int8), "wz"), numpy_helper.from_array(np.array(0.1, np.float32), "ys"),
                 numpy_helper.from_array(np.array(128, np.uint8), "yz")]  # fmt: skip
        node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz"], ["y"], **attrs)
        x_t, y_t = TensorProto.UINT8, TensorProto.UINT8
    else:
        inits = [numpy_helper.from_array(w.astype(np.float32), "w"), numpy_helper.from_array(b, "b")]
        node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
        x_t, y_t = TensorProto.FLOAT, TensorProto.FLOAT
    g = helper.make_graph([node], "c", [helper.make_tensor_value_info("x", x_t, None)],
                          [helper.make_tensor_value_info("y", y_t, None)], inits)  # fmt: skip
    so = ort.SessionOptions()
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString(),
                                so, providers=["CPUExecutionProvider"])  # fmt: skip
    return lambda x: sess.run(None, {"x": x})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="two shapes, 3 rounds (a smoke run)")
    ap.add_argument("--repeats", type=int, default=21)
    args = ap.parse_args()
    rounds = 3 if args.quick else args.repeats
    r = np.random.default_rng(0)
    rows = []
    for name, n, c, h, oc, k, s, p, g in SHAPES[:2] if args.quick else SHAPES:
        xq = r.integers(0, 256, (n, c, h, h)).astype(np.uint8)
        w = r.integers(-127, 128, (oc, c // g, k, k)).astype(np.int8)
        w.flags.writeable = False  # as a session's weights: packed once, trusted
        scale, bias = np.full(oc, 0.01, np.float32), r.standard_normal(oc).astype(np.float32)
        xf, wf = (xq.astype(np.float32) - 3) * 0.05, w.astype(np.float32) * 0.01
        geo = {"stride": s, "pads": p, "groups": g}
        got = ops.qconv(xq, np.uint8(3), w, np.int8(0), scale, bias, **geo)
        want = ops.qconv(xq, np.uint8(3), w, np.int8(0), scale, bias, device="ref", **geo)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))
        # bound calls into preallocated outputs, as a session runs them (read-only weights and zero points)
        x_zp, w_zp = np.array(3, np.uint8), np.zeros(oc, np.int8)
        wf.flags.writeable = w_zp.flags.writeable = False
        int8 = ops.bind("qconv", xq, x_zp, w, w_zp, scale, bias, out=np.empty_like(got), stride=[s] * 2,
                        pads=[p] * 4, dilation=[1, 1], groups=g)  # fmt: skip
        fp32 = ops.bind("conv2d", xf, wf, bias, out=np.empty_like(got), stride=s, padding=p, groups=g)
        assert int8 is not None and fp32 is not None
        np.testing.assert_array_equal(int8(), got)
        cands: dict[str, Callable[[], object]] = {"int8": int8, "fp32": fp32}
        if ort is not None:
            ort_f, ort_q = _ort_conv(wf, bias, s, p, g, False), _ort_conv(w, bias, s, p, g, True)
            cands["ort fp32"] = lambda f=ort_f, xf=xf: f(xf)
            cands["ort int8"] = lambda f=ort_q, xq=xq: f(xq)
        ms = {k: t.median * 1e3 for k, t in compare(cands, repeats=rounds).items()}
        row = [name, f"{ms['int8']:.3f}", f"{ms['fp32']:.3f}", f"{ms['fp32'] / ms['int8']:.2f}x"]
        if ort is not None:
            row += [f"{ms['ort int8']:.3f}", f"{ms['int8'] / ms['ort int8']:.2f}x", f"{ms['ort fp32']:.3f}"]
        rows.append(row)
    print(f"int8 conv (ops.bind('qconv') -> opstrata.quant) vs fp32 (ops.bind('conv2d')), bound calls, one thread, "
          f"{rounds} interleaved rounds; "
          f"{platform.machine()}, native paths {oq.native_status().paths}")  # fmt: skip
    head = ["shape", "int8 ms", "fp32 ms", "int8 speed-up"]
    if ort is not None:
        head += ["ort QLinearConv ms", "int8 / ort int8", "ort fp32 ms"]
    print(format_table(head, rows))
    print()
    _depthwise_calls(rounds)


#: (N, C, H, k, stride): depthwise layers of MobileNet / EfficientNet at the zoo's 64x64 input
DEPTHWISE = [
    (8, 72, 16, 3, 2), (8, 96, 8, 5, 1), (8, 72, 32, 3, 2), (8, 96, 16, 5, 1), (1, 32, 32, 3, 1),
    (1, 96, 32, 3, 2), (1, 144, 16, 3, 1), (1, 240, 8, 5, 1), (1, 672, 4, 5, 1), (1, 1152, 2, 5, 1),
]  # fmt: skip


def _depthwise_calls(rounds: int) -> None:
    """The int8 depthwise C call (arguments made once, as a session's bound call) against ops' bound
    float32 depthwise call on the same shape: the kernels without Python dispatch on either side."""
    from opstrata.quant._conv import conv_geometry, qconv_call

    r = np.random.default_rng(1)
    rows = []
    for n, c, h, k, s in DEPTHWISE:
        xq = r.integers(0, 256, (n, c, h, h)).astype(np.uint8)
        w = r.integers(-128, 128, (c, 1, k, k)).astype(np.int8)
        packed = oq.prepack_conv(w, None, c)
        scale, bias = np.full(c, 0.01, np.float32), r.standard_normal(c).astype(np.float32)
        geo = conv_geometry(xq.shape, packed, s, k // 2, 1)
        out = np.empty((n, c, *geo[3]), np.float32)
        fn, head, tail = qconv_call(xq, packed, scale, bias, geo, 1, None, out)
        xf = r.standard_normal((n, c, h, h)).astype(np.float32)
        wf = (w.astype(np.float32) * 0.01).copy()
        wf.flags.writeable = False  # as a session's weight
        fp32 = ops.bind("conv2d", xf, wf, bias, stride=s, padding=k // 2, groups=c, out=np.empty_like(out))
        assert fp32 is not None and fn(*head, 128, *tail) == 0
        t = compare(
            {"int8": lambda fn=fn, head=head, tail=tail: fn(*head, 128, *tail), "fp32": fp32}, repeats=rounds
        )
        us = {key: v.median * 1e6 for key, v in t.items()}
        rows.append([f"{n}x{c}x{h}x{h} {k}x{k}/{s}", f"{geo[3][1]}", f"{us['int8']:.1f}", f"{us['fp32']:.1f}",
                     f"{us['int8'] / us['fp32']:.2f}x"])  # fmt: skip
    print(f"depthwise kernels alone (bound calls), one thread, {rounds} interleaved rounds")
    print(
        format_table(
            ["shape (N x C x H x W, k/stride)", "out cols", "int8 us", "fp32 us", "int8 / fp32"], rows
        )
    )


if __name__ == "__main__":
    main()
