"""Memory plan quality on the test models: arena vs lower bound vs one buffer per value, per level.

Run: ``PYTHONPATH=packages/ops/src:packages/graph/src python packages/graph/benchmarks/bench_memory.py``
(``--quick`` for small dims). Byte counts are deterministic, so the ratios are exact: ``arena/LB``
is how far greedy-by-size is from the best any static plan can do (1.000 = optimal), ``no-reuse/arena``
how many times less memory the plan needs than a buffer per value; ``no in-place`` is the same
planner without in-place reuse (the baseline measured in the same run).
"""

from __future__ import annotations

import argparse

import opstrata.graph as og
from opstrata.graph.testing import bert_block_model, cnn_model, gpt_block_model, mlp_model


def _models(quick: bool) -> dict[str, tuple[object, dict[str, int]]]:
    if quick:
        return {
            "mlp": (mlp_model(), {"batch": 8}),
            "cnn": (cnn_model(), {"batch": 4}),
            "bert": (bert_block_model(), {"batch": 2, "seq": 16}),
            "gpt": (gpt_block_model(opset=14), {"batch": 2, "seq": 16}),
        }
    return {
        "mlp": (mlp_model(d_in=256, hidden=1024, d_out=64), {"batch": 64}),
        "cnn": (cnn_model(size=64), {"batch": 16}),
        "bert": (bert_block_model(hidden=256, heads=8, ffn=1024), {"batch": 8, "seq": 128}),
        "gpt": (
            gpt_block_model(opset=14, hidden=256, heads=8, vocab=512, max_pos=128),
            {"batch": 8, "seq": 128},
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small dims")
    args = ap.parse_args()
    header = "| model | level | dims | values | no reuse (KiB) | lower bound (KiB) | arena (KiB) | arena/LB | no-reuse/arena | arena, no in-place (KiB) |"
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    worst = 0.0
    for name, (model, dims) in _models(args.quick).items():
        g = og.from_onnx(model)
        for level in (0, 1, 2, 3):
            h, _ = og.optimize(g, level)
            mp = og.plan_memory(h, dims)
            base = og.plan_memory(h, dims, inplace=False)
            worst = max(worst, mp.ratio_to_lower_bound)
            kib = lambda b: f"{b / 1024:.1f}"  # noqa: E731
            print(
                f"| {name} | {level} | {dims} | {len(mp.offsets)} | {kib(mp.no_reuse_bytes)} | "
                f"{kib(mp.lower_bound_bytes)} | {kib(mp.arena_bytes)} | {mp.ratio_to_lower_bound:.3f} | "
                f"{mp.reuse_saving:.2f} | {kib(base.arena_bytes)} |"
            )
    print(f"\nworst arena / lower bound: {worst:.3f} (target <= 1.05)")


if __name__ == "__main__":
    main()
