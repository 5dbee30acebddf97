"""FusedElementwise nodes: the generated kernel (cpu) against step-by-step evaluation on the same ops kernels.

Run: ``OMP_WAIT_POLICY=PASSIVE PYTHONPATH=packages/ops/src:packages/graph/src python
packages/graph/benchmarks/bench_fused_elementwise.py [--quick]``. Each chain is built as the ONNX ops a
framework exports, fused by ``fuse_elementwise`` into one node, and that node is run both ways on the
``cpu`` device: ``steps`` = one opstrata.ops kernel per step (what the node did before code generation,
and what the ``ref`` device still does), ``codegen`` = the kernel the executor now runs. Ratios are
medians of interleaved runs (:func:`opstrata.ops.benchtools.compare`); compile time is measured once.
"""

from __future__ import annotations

import argparse
import math
import platform
import time

import numpy as np

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph import _execute
from opstrata.graph.opdefs import fused_codegen as _fused_codegen
from opstrata.ops.benchtools import compare, format_table
from opstrata.ops.kernels import chunking as _chunking, codegen as cg

K = math.sqrt(2 / math.pi)


class _Chain:
    """A tiny graph builder: ``x`` (rows, cols) and ``b`` (cols,) inputs, scalar constants, ONNX ops."""

    def __init__(self, name: str, rows: int, cols: int) -> None:
        self.g = og.Graph(name, opset_imports={"": 17})
        self.g.add_input("x", np.float32, (rows, cols))
        self.g.add_input("b", np.float32, (cols,))

    def c(self, v: float) -> str:
        name = self.g.fresh_name("k")
        self.g.add_initializer(name, np.array(v, np.float32))
        return name

    def op(self, op: str, *ins: str) -> str:
        out = self.g.fresh_name(op.lower())
        self.g.add_node(op, list(ins), [out])
        return out

    def node(self, y: str) -> og.Node:
        self.g.outputs.append(y)
        fused = og.fuse_elementwise(og.infer_shapes(self.g))
        (n,) = fused.nodes
        return n


def bias_gelu_erf(c: _Chain) -> str:
    h = c.op("Add", "x", "b")
    e = c.op("Erf", c.op("Div", h, c.c(math.sqrt(2.0))))
    return c.op("Mul", c.op("Mul", h, c.op("Add", e, c.c(1.0))), c.c(0.5))


def _gelu_tanh(c: _Chain, h: str, h3: str) -> str:
    inner = c.op("Mul", c.op("Add", h, c.op("Mul", h3, c.c(0.044715))), c.c(K))
    return c.op("Mul", c.op("Mul", h, c.c(0.5)), c.op("Add", c.op("Tanh", inner), c.c(1.0)))


def gelu_tanh_mul(c: _Chain) -> str:
    h = c.op("Add", "x", "b")
    return _gelu_tanh(c, h, c.op("Mul", c.op("Mul", h, h), h))


def gelu_tanh_pow(c: _Chain) -> str:
    h = c.op("Add", "x", "b")
    return _gelu_tanh(c, h, c.op("Pow", h, c.c(3.0)))


def silu(c: _Chain) -> str:
    h = c.op("Add", "x", "b")
    return c.op("Mul", h, c.op("Sigmoid", h))


def tanh_sigmoid(c: _Chain) -> str:
    h = c.op("Add", "x", "b")
    return c.op("Mul", c.op("Tanh", h), c.op("Sigmoid", h))


CHAINS = {
    "bias + GELU (erf)": bias_gelu_erf,
    "bias + tanh-GELU, x*x*x": gelu_tanh_mul,
    "bias + tanh-GELU, Pow(x, 3)": gelu_tanh_pow,
    "bias + SiLU": silu,
    "bias + tanh(x)*sigmoid(x)": tanh_sigmoid,
}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="(256, 1024) and 3 repeats")
    args = ap.parse_args(argv)
    rows, cols = (256, 1024) if args.quick else (2048, 4096)
    repeats = 3 if args.quick else 9
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, cols), dtype=np.float32) * 2
    b = rng.standard_normal(cols, dtype=np.float32) * 0.1
    table = []
    with ops.device("cpu"):
        for name, build in CHAINS.items():
            chain = _Chain(name, rows, cols)
            node = chain.node(build(chain))
            args_ = [x, b][: len(node.inputs)]
            start = time.perf_counter()
            kernel = _fused_codegen.fused_kernel(node, np.float32)
            compile_ms = (time.perf_counter() - start) * 1e3
            steps = _execute.fused_steps(node, args_)
            gen = _fused_codegen.run_fused(node, args_)
            err = float(np.max(np.abs(gen - steps)))
            t = compare(
                {
                    "steps": lambda n=node, a=args_: _execute.fused_steps(n, a),
                    "codegen": lambda n=node, a=args_: _fused_codegen.run_fused(n, a),
                },
                repeats=repeats,
            )
            s, g = t["steps"].median, t["codegen"].median
            table.append(
                [name, len(node.attrs["expr"]), "power" in kernel.source, f"{compile_ms:.1f}",
                 f"{s * 1e3:.1f}", f"{g * 1e3:.1f}", f"{s / g:.2f}x", f"{err:.1e}"]
            )  # fmt: skip
    print(
        f"machine: {platform.machine()}, {platform.python_version()}, numpy {np.__version__}, "
        f"block {_chunking.BLOCK_ELEMS} elements, ({rows}, {cols}) + ({cols},) fp32, repeats={repeats} "
        f"(median, interleaved), kernel cache {cg.cache_info()}"
    )
    headers = ["chain", "steps", "pow in kernel", "compile ms", "step-by-step ms", "codegen ms",
               "steps / codegen", "max abs diff"]  # fmt: skip
    print(format_table(headers, table))


if __name__ == "__main__":
    main()
