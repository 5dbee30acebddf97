"""Generated float32 elementwise chains: the native VM (one C call) vs the numpy generator (blocked ufuncs).

Eager calls and, for the tiny shape, the bound call the runtime makes once per input shape. Rounds
rotate which candidate runs first; medians. Run:

    PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_codegen_vm.py [--quick]
"""

from __future__ import annotations

import argparse

import numpy as np

from opstrata.ops import codegen as cg
from opstrata.ops.benchtools import compare, format_table


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds, no 2048x2048 shape")
    args = ap.parse_args()
    x, y = cg.var("x"), cg.var("y")
    chains = {
        "silu(x) * y": (cg.silu(x) * y, "full"),
        "gelu(x + b)": (cg.gelu(x + y), "row"),
        "tanh-GELU chain + b": (0.5 * x * (1.0 + cg.tanh(0.79788 * (x + 0.044715 * x * x * x))) + y, "row"),
    }
    shapes = [(32, 64), (128, 1536)] + ([] if args.quick else [(2048, 2048)])
    rows = []
    rng = np.random.default_rng(0)
    for name, (expr, ylayout) in chains.items():
        k = cg.compile_expr(expr, "float32")
        prog = k.program
        for shape in shapes:
            a = rng.standard_normal(shape).astype(np.float32)
            b = rng.standard_normal(shape if ylayout == "full" else shape[-1:]).astype(np.float32)
            out = np.empty(shape, np.float32)
            bound = k.bind(out, {"x": a, "y": b})

            def numpy_path(k=k, a=a, b=b, prog=prog) -> object:
                k.program = None
                try:
                    return k(x=a, y=b)
                finally:
                    k.program = prog

            number = max(1, int(2e6 // a.size))
            t = compare(
                {"vm": lambda k=k, a=a, b=b: k(x=a, y=b), "numpy": numpy_path, "bound": bound},
                repeats=5 if args.quick else 11, number=number,
            )  # fmt: skip
            vm, npy, bd = (t[n].median * 1e6 for n in ("vm", "numpy", "bound"))
            rows.append((name, shape, f"{vm:.1f}", f"{npy:.1f}", f"{npy / vm:.2f}x", f"{bd:.1f}"))
    print(format_table(["chain", "shape", "VM us", "numpy-generated us", "numpy / VM", "bound VM us"], rows))


if __name__ == "__main__":
    main()
