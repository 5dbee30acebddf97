"""Per-call dispatch overhead: ``call("add", ...)`` against the kernel called directly and raw ``np.add``.

Run: ``PYTHONPATH=packages/ops/src python packages/ops/benchmarks/bench_dispatch.py [--quick]``.
Small arrays, so the figure is the dispatcher's own cost (cache lookup, dtype read, audit on the
fallback path). Candidates are interleaved with rotating order; medians and ratios to raw numpy
are printed as a markdown table (absolute times on a shared machine are noise; ratios are not).
"""

from __future__ import annotations

import argparse
import platform
import sys

import numpy as np

import opstrata.ops as ops
from opstrata.ops.benchtools import compare, format_table


def candidates() -> dict[str, object]:
    """Name -> zero-argument thunk, all adding two 8-element float32 arrays (or negating one)."""
    a = np.arange(8, dtype=np.float32)
    b = np.ones(8, dtype=np.float32)
    # Bare kernels: the dispatcher's cost alone, independent of what the real add kernel validates.
    ops.register("_bench_add", device="cpu", dtypes=[np.float32])(np.add)
    ops.register("_bench_neg", device="ref", dtypes=[np.float32])(np.negative)
    out: dict[str, object] = {
        "np.add(a, b)": lambda: np.add(a, b),
        'call("_bench_add") -> np.add': lambda: ops.call("_bench_add", a, b),
        'call("_bench_neg") cpu->ref fallback': lambda: ops.call("_bench_neg", a),
    }
    if "add" in ops.list_ops("cpu"):
        kernel = next(k.fn for k in ops.kernels("add") if k.device == "cpu")
        out["add cpu kernel, direct"] = lambda: kernel(a, b)
        out['call("add", a, b)'] = lambda: ops.call("add", a, b)
        if hasattr(ops, "add"):
            out["ops.add(a, b)"] = lambda: ops.add(a, b)
    return out


def run(quick: bool = False) -> str:
    """Time every candidate and return the markdown table (medians, ratios to np.add)."""
    ops.set_fallback_policy("allow")  # the fallback row measures the audited path, not warnings
    cands = candidates()
    number, repeats = (500, 7) if quick else (3000, 21)
    timings = compare(cands, repeats=repeats, number=number, warmup=50)  # type: ignore[arg-type]
    base = timings["np.add(a, b)"].median
    direct = timings.get("add cpu kernel, direct")
    rows = []
    for name, t in timings.items():
        over = ""
        if name == 'call("add", a, b)' and direct is not None:
            over = f"+{(t.median - direct.median) * 1e6:.2f} us over direct kernel"
        elif name == 'call("_bench_add") -> np.add':
            over = f"+{(t.median - base) * 1e6:.2f} us over np.add"
        rows.append((name, f"{t.median * 1e6:.2f}", f"{t.median / base:.2f}x", over))
    report = ops.fallback_report()
    audited = report.count("_bench_neg")
    ops.set_fallback_policy(None)
    head = (
        f"dispatch overhead, 8-element float32, median of {repeats} x {number} calls "
        f"(python {platform.python_version()}, numpy {np.__version__}); "
        f"fallback row audited {audited} calls"
    )
    return head + "\n\n" + format_table(("candidate", "us/call", "vs np.add", "note"), rows)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (CI smoke run)")
    args = parser.parse_args(argv)
    print(run(args.quick))
    return 0


if __name__ == "__main__":
    sys.exit(main())
