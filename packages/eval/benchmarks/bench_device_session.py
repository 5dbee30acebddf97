"""Eager device sessions on the zoo: host steps kept per input shape vs computed every run; device arenas.

A torch.onnx export of a transformer runs most of its nodes on the host (Shape / Gather / Unsqueeze /
Concat / Range shape arithmetic); a device session computes them once per input shape and skips them
afterwards (``runtime/_device_fold.py``). This times one eager ``run`` of the zoo's transformers with and
without that (``DeviceProgram.fold_shapes``), in interleaved rounds (``ops.benchtools.compare``:
alternating which goes first), medians. On the CPU it runs on the stand-in device (the cuda kernels over
numpy), where the ratio is the host work saved per run; ``--device cuda`` times the GPU session.

A second table gives each zoo model's device arena after a few runs (``sess.device_arenas``): the one
planned allocation against the traced allocations' total (one buffer each) and the trace's lower bound
(the most bytes live at once)::

    python packages/eval/benchmarks/bench_device_session.py [--models gpt2,bert,llama] [--device cuda] [--quick]
"""

# bench-needs: torch torchvision transformers onnxscript

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import warnings

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="gpt2,bert,llama")
    p.add_argument("--exporters", default="torchscript,dynamo")
    p.add_argument("--device", default="stand-in", help="'stand-in' (CPU) or a device with its own memory")
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument(
        "--arena-models", default="resnet18,mobilenet_v3_small,efficientnet_b0,vit_b_16,gpt2,bert,llama"
    )
    p.add_argument("--quick", action="store_true", help="GPT-2's TorchScript export, 5 rounds, two arenas")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.exporters, args.rounds, args.arena_models = (
            "gpt2",
            "torchscript",
            5,
            "resnet18,gpt2",
        )
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    import opstrata.ops as ops
    import opstrata.ops.testing as ot
    from opstrata.eval.zoo import MODELS, export_model
    from opstrata.ops.benchtools import compare
    from opstrata.runtime import InferenceSession

    warnings.simplefilter("ignore", ops.FallbackWarning)
    device = ot.register_standin_device("_standin") if args.device == "stand-in" else args.device
    if ops.device_memory(device) is None:
        why = [d.reason for d in ops.device_status() if d.name == device and d.reason]
        print(f"bench_device_session: --device {device!r} is no device with its own memory here"
              f"{': ' + why[0] if why else ''}; use 'stand-in' or one of {ops.list_devices()}", file=sys.stderr)  # fmt: skip
        return 2
    sync = ops.device_memory(device).synchronize
    print(f"device: {device}; one eager run per call, medians of {args.rounds} interleaved rounds")
    print("| model | exporter | steps | skipped | kept ms | every run ms | kept / every run |")
    print("|---|---|---|---|---|---|---|", flush=True)
    tmp = tempfile.mkdtemp(prefix="opstrata_fold_")
    for name in args.models.split(","):
        spec = MODELS[name]
        x = np.random.default_rng(0).integers(0, spec.vocab, spec.shapes[0]).astype(np.int64)
        for exporter in args.exporters.split(","):
            path = export_model(name, exporter, f"{tmp}/{exporter}")
            runs = {}
            for kept in (True, False):
                sess = InferenceSession(str(path), device=device)
                sess._device_program.fold_shapes = kept
                feeds = {sess.get_inputs()[0].name: x}

                def call(sess=sess, feeds=feeds) -> None:
                    sess.run(None, feeds)
                    sync()

                runs["kept" if kept else "every"] = (call, sess)
            timed = compare({k: v[0] for k, v in runs.items()}, repeats=args.rounds, number=5, warmup=3)
            kept_sess = runs["kept"][1]
            skipped = max(kept_sess.device_folded_steps.values(), default=0)
            a, b = timed["kept"].median * 1e3, timed["every"].median * 1e3
            print(
                f"| {name} | {exporter} | {len(kept_sess.graph.nodes)} | {skipped} | {a:.3f} | {b:.3f} | {a / b:.2f}x |",
                flush=True,
            )
    print(
        "\n| model (torchscript, batch 2) | allocations | arena KiB | one buffer each KiB | lower bound KiB | arena / lower bound |"
    )
    print("|---|---|---|---|---|---|", flush=True)
    for name in args.arena_models.split(","):
        spec = MODELS[name]
        path = export_model(name, "torchscript", f"{tmp}/torchscript")
        sess = InferenceSession(str(path), device=device)
        rng = np.random.default_rng(0)
        for _ in range(3):
            if spec.input_kind == "image":
                x = rng.standard_normal((2, 3, 64, 64)).astype(np.float32)
            else:
                x = rng.integers(0, spec.vocab, spec.shapes[-1]).astype(np.int64)
            sess.run(None, {sess.get_inputs()[0].name: x})
        (st,) = sess.device_arenas.values()
        kib = lambda b: f"{b / 1024:.0f}"  # noqa: E731
        print(f"| {name} | {st.planned} | {kib(st.arena_bytes)} | {kib(st.traced_bytes)} | {kib(st.lower_bound_bytes)} "
              f"| {st.arena_bytes / max(1, st.lower_bound_bytes):.2f} |", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
