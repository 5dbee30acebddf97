"""Data-parallel training of a small MLP with opstrata.ops training kernels and opstrata.comm.

    python packages/comm/examples/train_mlp.py --out w1.npz                       # one process, full batch
    opstrata-launch --nproc 4 packages/comm/examples/train_mlp.py --out w4.npz    # 4 ranks, batch split

Model: ``logits = linear(gelu(linear(x, w1, b1)), w2, b2)``, loss ``cross_entropy`` (mean). Backward
uses ``cross_entropy_backward``, ``linear_backward`` and ``gelu_backward``; the update is the fused
``adamw_step``. Under the launcher every rank takes its contiguous shard of the same global batch and a
``GradientBucketer`` averages the gradients in async buckets as backward produces them, so each rank
applies the full-batch gradient and ends with the weights single-process training reaches.
"""

from __future__ import annotations

import argparse
import os
import tempfile

import numpy as np

import opstrata.ops as ops
from opstrata import comm

PARAMS = ("w1", "b1", "w2", "b2")  # forward order


def init_params(d_in: int, hidden: int, classes: int, dtype: np.dtype, seed: int) -> dict[str, np.ndarray]:
    """Seeded weights (scaled normal) and zero biases."""
    rng = np.random.default_rng(seed)
    return {
        "w1": (rng.standard_normal((hidden, d_in)) / np.sqrt(d_in)).astype(dtype),
        "b1": np.zeros(hidden, dtype),
        "w2": (rng.standard_normal((classes, hidden)) / np.sqrt(hidden)).astype(dtype),
        "b2": np.zeros(classes, dtype),
    }


def batch(
    step: int, size: int, d_in: int, classes: int, dtype: np.dtype, seed: int
) -> tuple[np.ndarray, np.ndarray]:
    """The global batch of ``step`` (the same on every rank): inputs and the labels a fixed teacher gives them."""
    teacher = np.random.default_rng(seed + 12345).standard_normal((d_in, classes))
    x = np.random.default_rng(seed + 1 + step).standard_normal((size, d_in)).astype(dtype)
    return x, np.argmax(np.tanh(x @ teacher), axis=1).astype(np.int64)


def train_step(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray, on_grad: object) -> float:
    """Forward and backward on (x, y); hands each gradient to ``on_grad(name, grad)`` as backward makes it."""
    a = ops.linear(x, p["w1"], p["b1"])
    h = ops.gelu(a)
    logits = ops.linear(h, p["w2"], p["b2"])
    loss = float(ops.cross_entropy(logits, y))
    dlogits = ops.cross_entropy_backward(logits, y)
    dh, dw2, db2 = ops.linear_backward(h, p["w2"], dlogits)
    on_grad("b2", db2)  # type: ignore[operator]
    on_grad("w2", dw2)  # type: ignore[operator]
    da = ops.gelu_backward(a, dh)
    _, dw1, db1 = ops.linear_backward(x, p["w1"], da)
    on_grad("b1", db1)  # type: ignore[operator]
    on_grad("w1", dw1)  # type: ignore[operator]
    return loss


def save_atomic(path: str, arrays: dict[str, np.ndarray]) -> None:
    """np.savez to a temp file in the target directory, then rename (never a half-written file)."""
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix=".train_mlp.", suffix=".npz", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def main(argv: list[str] | None = None) -> dict[str, np.ndarray]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64, help="global batch (split across ranks)")
    ap.add_argument("--d-in", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--dtype", default="float32", choices=["float32", "float64"])
    ap.add_argument("--bucket-cap-mb", type=float, default=25.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write the final weights here (rank 0, .npz)")
    args = ap.parse_args(argv)
    dtype = np.dtype(args.dtype)

    distributed = "WORLD_SIZE" in os.environ  # set by opstrata-launch / torchrun
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if args.batch % world:
        raise SystemExit(f"train_mlp: --batch {args.batch} must divide evenly across {world} ranks")
    if distributed:
        comm.init_process_group("shm")
    rank = comm.get_rank() if distributed else 0
    shard = slice(rank * args.batch // world, (rank + 1) * args.batch // world)

    p = init_params(args.d_in, args.hidden, args.classes, dtype, args.seed)
    m = {k: np.zeros_like(v) for k, v in p.items()}
    v = {k: np.zeros_like(v) for k, v in p.items()}
    bucketer = None
    if distributed:
        comm.broadcast_parameters(p, src=0)  # replicas start identical even with per-rank init
        bucketer = comm.GradientBucketer([(k, p[k]) for k in PARAMS], bucket_cap_mb=args.bucket_cap_mb)
    try:
        for step in range(1, args.steps + 1):
            x, y = batch(step, args.batch, args.d_in, args.classes, dtype, args.seed)
            if bucketer is None:
                grads: dict[str, np.ndarray] = {}
                loss = train_step(p, x, y, grads.__setitem__)
            else:
                loss = train_step(p, x[shard], y[shard], bucketer.add_grad)
                grads = bucketer.wait(timeout=120)
                loss_arr = np.array([loss], np.float64)
                comm.all_reduce(loss_arr, "avg")
                loss = float(loss_arr[0])
            for k in PARAMS:
                ops.adamw_step(p[k], grads[k], m[k], v[k], lr=args.lr, weight_decay=0.01, step=step)
            if rank == 0 and (step == 1 or step % 10 == 0 or step == args.steps):
                print(f"step {step:4d}  loss {loss:.6f}  (world {world})", flush=True)
        if rank == 0 and args.out:
            save_atomic(args.out, p)
    finally:
        if distributed:
            comm.destroy_process_group()
    return p


if __name__ == "__main__":
    main()
