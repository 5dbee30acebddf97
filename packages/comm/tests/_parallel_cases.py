"""Rank-side bodies of the tensor- and data-parallel tests (module-level so spawned ranks can import them)."""

from __future__ import annotations

from typing import Any

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
    return {"out": sess.run(None, feeds)[0], "wrong_size": wrong_size}
