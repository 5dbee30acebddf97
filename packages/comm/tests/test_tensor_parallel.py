"""Tensor parallel through the runtime: partitioned rank graphs in InferenceSessions across real processes."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.comm.testing import run_ranks

pytest.importorskip("onnx")
if not hasattr(ops, "all_reduce"):  # an opstrata-ops release older than the all_reduce op
    pytest.skip("opstrata.ops has no all_reduce op to fill", allow_module_level=True)

from _parallel_cases import TP_DIMS, tp_model, tp_rank, tp_subgroup_rank

RTOL, ATOL = 1e-5, 1e-6  # fp32 partial sums are added in another order than the whole matmul's


def _single_process(seed: int = 0) -> np.ndarray:
    from opstrata.graph.testing import random_feeds
    from opstrata.runtime import InferenceSession

    g = tp_model()
    return InferenceSession(g).run(None, random_feeds(g, TP_DIMS, seed=seed))[0]


@pytest.mark.parametrize("world", [2, 4])
def test_tp_rank_graphs_in_sessions_give_the_single_process_result(world: int) -> None:
    want = _single_process()
    for r in run_ranks(tp_rank, world, timeout=120):
        v = r.value
        assert v["bindings"] and all(b == ("all_reduce", "native") for b in v["bindings"])
        np.testing.assert_allclose(v["out"]["logits"], want, rtol=RTOL, atol=ATOL)
        assert v["kernels"] == [100, 0]  # comm's kernel above ops' world-of-one kernel while initialised
        assert v["after"] == [0]  # destroy_process_group removed exactly comm's kernel
        assert "AllReduce" in v["error"] and "init_process_group" in v["error"]


def test_tp_over_a_subgroup_and_the_group_size_check() -> None:
    res = run_ranks(tp_subgroup_rank, 4, timeout=120)
    for r in res:
        np.testing.assert_allclose(r.value["out"], _single_process(seed=r.rank // 2), rtol=RTOL, atol=ATOL)
        assert "partitioned for group_size=2 ranks but the default group has 4 ranks" in r.value["wrong_size"]


def test_without_a_process_group_the_rank_graph_names_the_fix() -> None:
    import opstrata.graph as og
    from opstrata.graph.testing import random_feeds
    from opstrata.runtime import ExecutionError, InferenceSession

    g = tp_model()
    sess = InferenceSession(og.partition(g, tp=2, on_unmatched="replicate")[0])
    with pytest.raises(ExecutionError, match=r"AllReduce.*init_process_group"):
        sess.run(None, random_feeds(g, TP_DIMS))


def test_set_tensor_parallel_group_errors() -> None:
    from opstrata import comm

    with pytest.raises(ValueError, match="not a member of that group"):
        comm.set_tensor_parallel_group(comm.NON_GROUP_MEMBER)
    with pytest.raises(TypeError, match="expected a ProcessGroup from new_group"):
        comm.set_tensor_parallel_group("tp")  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="call init_process_group"):
        comm.set_tensor_parallel_group(None)
    assert comm.get_tensor_parallel_group() is None
