"""Rank-side bodies of the tensor- and data-parallel tests (module-level so spawned ranks can import them)."""

from __future__ import annotations

from typing import Any

import numpy as np

TP_DIMS = {"batch": 2, "seq": 5}


def tp_model() -> Any:
    """The GPT-style test model (embeddings, causal attention, tanh-GELU MLP, LM head) as a graph."""
    import opstrata.graph as og
    from opstrata.graph.testing import gpt_block_model

    return og.from_onnx(gpt_block_model(hidden=32, heads=4))


def tp_rank(rank: int, world: int) -> dict[str, Any]:
    """Run this rank's partition of the model in an InferenceSession; then check destroy removes the kernel."""
    import opstrata.graph as og
    import opstrata.ops as ops
    from opstrata import comm
    from opstrata.graph.testing import random_feeds
    from opstrata.runtime import ExecutionError, InferenceSession

    g = tp_model()
    feeds = random_feeds(g, TP_DIMS)
    rank_graph = og.partition(g, tp=world, on_unmatched="replicate")[rank]
    sess = InferenceSession(rank_graph)
    bindings = [(b.kernel, b.path) for b in sess.plan.bindings if b.op_type.endswith("::AllReduce")]
    names = [o.name for o in sess.get_outputs()]
    out = dict(zip(names, sess.run(None, feeds), strict=True))
    comm_kernels = [k.priority for k in ops.kernels("all_reduce") if k.device == "cpu"]
    comm.destroy_process_group()
    after = [k.priority for k in ops.kernels("all_reduce") if k.device == "cpu"]
    try:
        sess.run(None, feeds)
        error = ""
    except ExecutionError as exc:
        error = str(exc)
    return {"out": out, "bindings": bindings, "kernels": comm_kernels, "after": after, "error": error}


def tp_subgroup_rank(rank: int, world: int) -> dict[str, Any]:
    """tp=2 inside a world of 4: ranks {0,1} and {2,3} each run the model over their own group."""
    import opstrata.graph as og
    from opstrata import comm
    from opstrata.graph.testing import random_feeds
    from opstrata.runtime import InferenceSession

    groups = [comm.new_group([0, 1]), comm.new_group([2, 3])]
    mine = groups[rank // 2]
    g = tp_model()
    feeds = random_feeds(g, TP_DIMS, seed=rank // 2)  # the two replicas see different batches
    sess = InferenceSession(og.partition(g, tp=2, on_unmatched="replicate")[rank % 2])
    try:
        sess.run(None, feeds)
        wrong_size = ""
    except Exception as exc:  # the world has 4 ranks, the graph was partitioned for 2
        wrong_size = str(exc)
    comm.set_tensor_parallel_group(mine)
    assert comm.get_tensor_parallel_group() is mine
    out = sess.run(None, feeds)[0]
    comm.destroy_process_group(mine)
    assert comm.get_tensor_parallel_group() is not mine  # back to the default group
    return {"out": out, "wrong_size": wrong_size}


# --------------------------------------------------------------------------- data parallel

DP_SHAPES: list[tuple[str, tuple[int, ...], str]] = [
    ("emb", (50, 16), "float32"),
    ("w1", (64, 16), "float32"),
    ("b1", (64,), "float32"),
    ("w2", (8, 64), "float64"),  # a dtype change starts a new bucket
    ("b2", (8,), "float64"),
    ("scale", (), "float32"),
]


def dp_params() -> dict[str, np.ndarray]:
    return {n: np.zeros(s, d) for n, s, d in DP_SHAPES}


def dp_grad(name: str, step: int, rank: int) -> np.ndarray:
    """Rank- and step-dependent gradient of parameter ``name``."""
    _, shape, dtype = next(x for x in DP_SHAPES if x[0] == name)
    seed = 1000 * step + 10 * rank + [x[0] for x in DP_SHAPES].index(name)
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def dp_rank(rank: int, world: int, cap_mb: float, steps: int, overlap: bool = True) -> dict[str, Any]:
    """Bucketed async averaging of gradients; odd ranks add their gradients in a shuffled order."""
    from opstrata import comm

    replica = {n: np.full(p.shape, rank + 1, p.dtype) for n, p in dp_params().items()}
    comm.broadcast_parameters(replica, src=world - 1)
    synced = all(np.all(p == world) for p in replica.values())
    b = comm.GradientBucketer(dp_params(), bucket_cap_mb=cap_mb, overlap=overlap)
    names = [n for n, _, _ in DP_SHAPES][::-1]  # backward order
    out: list[dict[str, np.ndarray]] = []
    early: list[int] = []
    for step in range(steps):
        order = list(names)
        if rank % 2:
            np.random.default_rng(step).shuffle(order)
        first = set(b.buckets[0].names)
        for n in order:
            b.add_grad(n, dp_grad(n, step, rank))
            if rank % 2 == 0 and first and n in first:
                first.discard(n)
                if not first:
                    early.append(b.launched)  # launched before the remaining grads were added
        out.append({k: v.copy() for k, v in b.wait(timeout=60).items()})
    return {"grads": out, "early": early, "nbuckets": len(b.buckets), "synced": synced}


def dp_timeout_rank(rank: int, world: int, flag: str) -> dict[str, Any]:
    """Rank 1 withholds its gradients until rank 0's wait(timeout) raised (it then creates ``flag``)."""
    import os
    import time

    from opstrata import comm

    b = comm.GradientBucketer(dp_params(), bucket_cap_mb=1.0)
    msg, elapsed = "", 0.0
    if rank == 1:
        deadline = time.monotonic() + 60
        while not os.path.exists(flag) and time.monotonic() < deadline:
            time.sleep(0.01)
    for n, _, _ in DP_SHAPES[::-1]:
        b.add_grad(n, dp_grad(n, 0, rank))
    t0 = time.monotonic()
    try:
        b.wait(timeout=0.5)
    except comm.CommTimeoutError as exc:
        msg, elapsed = str(exc), time.monotonic() - t0
    if rank == 0:
        open(flag, "w").close()
    comm.barrier()  # queued behind the late all-reduces: both ranks leave together
    return {"msg": msg, "elapsed": elapsed}
