"""GEMM nodes write their arena slot directly (out=): no copy-in, same numbers, errors still name the node."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph import EXECUTOR_KERNELS as KERNELS
from opstrata.graph.testing import random_feeds
from opstrata.runtime import ExecutionError, InferenceSession, SessionOptions
from opstrata.runtime._executor import Schedule


def _stored_ops(monkeypatch, sess: InferenceSession, feeds: dict) -> list[str]:
    """Op types whose results the executor copied into the arena during one run."""
    seen: list[str] = []
    real = Schedule._store

    def spy(st, k, dst, r, arena):
        seen.append(st.node.op_type)
        return real(st, k, dst, r, arena)

    monkeypatch.setattr(Schedule, "_store", staticmethod(spy))
    sess.run(None, feeds)
    return seen


@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_linear_and_matmul_results_are_not_copied_in(monkeypatch, models, name: str) -> None:
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    plain = [
        n for n in sess.graph.nodes if n.op_type in ("Linear", "MatMul") and not n.attrs.get("activation")
    ]
    assert plain
    stored = _stored_ops(monkeypatch, sess, feeds)
    assert stored and not {"MatMul"} & set(stored)
    assert stored.count("Linear") == sum(1 for n in sess.graph.nodes if n.attrs.get("activation"))
    want = og.run_graph(sess.graph, feeds)
    for got, w in zip(sess.run(None, feeds), want.values(), strict=True):
        np.testing.assert_allclose(got, w, rtol=1e-5, atol=1e-6)


def test_an_overridden_kernel_is_respected(monkeypatch, models) -> None:
    calls = []
    real = KERNELS[("", "MatMul")]
    monkeypatch.setitem(KERNELS, ("", "MatMul"), lambda n, x: calls.append(n.name) or real(n, x))
    model, dims = models["gpt"]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))
    sess.run(None, random_feeds(model, dims))
    assert calls, "a replaced MatMul kernel is called, not bypassed by the out= writer"


def test_a_failing_gemm_names_the_node(monkeypatch, models) -> None:
    model, dims = models["gpt"]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=3))

    def broken(*args, **kwargs):
        raise FloatingPointError("simulated BLAS fault")

    monkeypatch.setattr(ops, "matmul", broken)
    with pytest.raises(
        ExecutionError, match=r"node 'lm_head' \(MatMul\): kernel .* FloatingPointError: simulated BLAS fault"
    ):
        sess.run(None, random_feeds(model, dims))
