"""Zoo models on the GPU: an opstrata session on ``cuda`` against torch eager on the same GPU, batch 8.

For each model (random weights, built in code, exported by the TorchScript exporter): outputs compared
(max relative error against torch), the nodes the session runs on the host, and the latency of both in
interleaved rounds (``ops.benchtools.compare``: alternating which goes first; each call synchronised),
medians; float32 and bfloat16 (the module cast to bfloat16 and wrapped so it takes and returns float32:
the exported Casts run on the device too); also the session with ``enable_device_graph`` (a CUDA graph
recorded on its second run, then replayed) against the same session without it. Needs CuPy, torch (CUDA),
torchvision and transformers; run by ``tools/gpu_check.sh``::

    python packages/eval/benchmarks/bench_cuda_zoo.py [--models resnet18,gpt2,bert] [--dtypes float32,bfloat16] [--quick]
"""

# bench-needs: cupy torch torchvision transformers

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from typing import Any

import numpy as np


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default="resnet18,gpt2,bert")
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json")
    p.add_argument("--quick", action="store_true", help="ResNet-18 in float32, 2 rounds (a smoke run)")
    args = p.parse_args(argv)
    if args.quick:
        args.models, args.dtypes, args.rounds = "resnet18", "float32", 2
    import cupy as cp
    import torch

    import opstrata.ops as ops
    from opstrata.eval.zoo import MODELS, export_model
    from opstrata.eval.zoo._builders import build
    from opstrata.ops.benchtools import compare
    from opstrata.runtime import InferenceSession, SessionOptions

    if "cuda" not in ops.list_devices():
        print(
            f"bench_cuda_zoo: no cuda device: {[s.reason for s in ops.device_status() if s.name == 'cuda']}",
            file=sys.stderr,
        )
        return 2
    ops.set_fallback_policy("allow")
    rows = []
    tmp = tempfile.mkdtemp(prefix="opstrata_cuda_zoo_")

    class InBf16(torch.nn.Module):
        """``inner`` in bfloat16, taking and returning float32 (token ids pass as they are)."""

        def __init__(self, inner: Any, image: bool) -> None:
            super().__init__()
            self.inner, self.image = inner.to(torch.bfloat16), image

        def forward(self, x: Any) -> Any:
            y = self.inner(x.to(torch.bfloat16) if self.image else x)
            return (y if isinstance(y, torch.Tensor) else y[0]).float()

    print(f"device: {torch.cuda.get_device_name()}; torch {torch.__version__}; batch {args.batch}")
    print("| model | ours ms | torch eager ms | ours / torch | graph ms | graph / torch | graph / ours "
          "| max rel err | graph vs eager (rel err or why none) | host nodes (ops) | eager arena |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|", flush=True)
    for name, dtype in ((m, d) for m in args.models.split(",") for d in args.dtypes.split(",")):
        spec = MODELS[name]
        module = build(spec.builder)
        if dtype == "bfloat16":
            module = InBf16(module, spec.input_kind == "image").eval()
        path = export_model(name, "torchscript", f"{tmp}/{dtype}", model=module)
        seq = max(s[1] for s in spec.shapes) if spec.input_kind == "tokens" else 0
        rng = np.random.default_rng(0)
        if spec.input_kind == "image":
            x = rng.standard_normal((args.batch, 3, 64, 64)).astype(np.float32)
        else:
            x = rng.integers(0, spec.vocab, (args.batch, seq)).astype(np.int64)
        sess = InferenceSession(str(path), device="cuda")
        feeds = {sess.get_inputs()[0].name: x}
        dev_feeds = {k: cp.asarray(v) for k, v in feeds.items()}
        tmod = module.to("cuda")
        tx = torch.from_numpy(x).to("cuda")
        with torch.no_grad():
            want = tmod(tx)
            want = (want if isinstance(want, torch.Tensor) else want[0]).float().cpu().numpy()
        got = sess.run(None, feeds)[0]
        err = float(np.max(np.abs(got - want)) / max(1e-12, float(np.max(np.abs(want)))))

        def ours(sess: Any = sess, dev_feeds: Any = dev_feeds) -> None:
            sess.run_on_device(None, dev_feeds)
            cp.cuda.Device().synchronize()

        def theirs(tmod: Any = tmod, tx: Any = tx) -> None:
            with torch.no_grad():
                tmod(tx)
            torch.cuda.synchronize()

        cands = {"ours": ours, "torch": theirs}
        graph_note = ""
        try:  # the same plan recorded as one CUDA graph (its second run records it; later runs replay)
            gsess = InferenceSession(str(path), SessionOptions(enable_device_graph=True), device="cuda")
            for _ in range(2):
                gsess.run_on_device(None, dev_feeds)
            ggot = gsess.run(None, feeds)[0]
            graph_note = f"{float(np.max(np.abs(ggot - got)) / max(1e-12, float(np.max(np.abs(got))))):.1e}"

            def graphed(gsess: Any = gsess, dev_feeds: Any = dev_feeds) -> None:
                gsess.run_on_device(None, dev_feeds)
                cp.cuda.Device().synchronize()

            cands["graph"] = graphed
        except Exception as exc:  # reported in the table: the reason the graph could not be used
            graph_note = f"no graph: {type(exc).__name__}: {str(exc)[:160]}"
        # interleaved rounds, alternating which goes first; each call ends synchronised (its latency)
        timed = compare(cands, repeats=args.rounds, number=10)
        o, t = timed["ours"].median * 1e3, timed["torch"].median * 1e3
        g = timed["graph"].median * 1e3 if "graph" in timed else float("nan")
        host = sess.device_fallbacks()
        arenas = list(getattr(sess, "device_arenas", {}).values())  # the eager runs' planned device memory
        arena = (
            f"{arenas[0].arena_bytes / 2**20:.1f} of {arenas[0].traced_bytes / 2**20:.1f} MiB, "
            f"{arenas[0].unplanned} off plan" if arenas and arenas[0].state == "serving"
            else (arenas[0].summary() if arenas else "none")
        )  # fmt: skip
        rows.append({"model": f"{name} {dtype}", "ours_ms": o, "torch_ms": t, "ratio": o / t, "max_rel_err": err,
                     "graph_ms": g, "graph_ratio": g / t, "graph_vs_eager": g / o, "graph_note": graph_note,
                     "host_nodes": len(host), "host_ops": sorted({h.op_type for h in host}), "arena": arena})  # fmt: skip
        r = rows[-1]  # printed as it completes: a run cut short by its time limit keeps the rows so far
        hosted = f"{r['host_nodes']} ({', '.join(r['host_ops'])})" if r["host_nodes"] else "0"
        print(
            f"| {r['model']} | {o:.3f} | {t:.3f} | {r['ratio']:.2f}x | {g:.3f} | {r['graph_ratio']:.2f}x "
            f"| {r['graph_vs_eager']:.2f}x | {err:.1e} | {graph_note} | {hosted} | {arena} |",
            flush=True,
        )
    print(ops.fallback_report().table())
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
