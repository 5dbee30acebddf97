"""Profiler: Chrome trace (one event per node per run), summary table, FLOP estimates."""

from __future__ import annotations

import json

import pytest

import opstrata.graph as og
from opstrata.graph.testing import random_feeds
from opstrata.runtime import InferenceSession, InvalidArgument, SessionOptions, node_flops


@pytest.mark.parametrize("name", ["mlp", "bert", "gpt"])
def test_trace_is_valid_chrome_json_with_one_event_per_node(tmp_path, models, name: str) -> None:
    model, dims = models[name]
    opts = SessionOptions(enable_profiling=True, profile_file_prefix=str(tmp_path / "prof"))
    sess = InferenceSession(model, opts)
    sess.run(None, random_feeds(model, dims))
    path = sess.end_profiling()
    assert path.startswith(str(tmp_path / "prof_")) and path.endswith(".json")
    trace = json.loads(open(path).read())
    nodes = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["cat"] != "session"]
    assert sorted(e["name"] for e in nodes) == sorted(n.name for n in sess.graph.nodes)
    for e in nodes:
        assert {"ts", "dur", "pid", "tid"} <= set(e) and e["dur"] >= 0
        a = e["args"]
        assert {"kernels", "device", "fallback", "input_shapes", "output_shapes", "bytes", "flops"} <= set(a)
        assert a["device"] == "cpu" and a["fallback"] is False and a["bytes"] > 0
    runs = [e for e in trace["traceEvents"] if e.get("cat") == "session"]
    assert len(runs) == 1
    assert not list(tmp_path.glob(".*.tmp"))  # atomic write left no temp file
    with pytest.raises(InvalidArgument, match="profiling is off"):
        sess.end_profiling()  # ended


def test_summary_lists_hot_ops_and_shares(models) -> None:
    model, dims = models["bert"]
    sess = InferenceSession(model, SessionOptions(enable_profiling=True))
    feeds = random_feeds(model, dims)
    for _ in range(3):
        sess.run(None, feeds)
    text = sess.profile_summary()
    assert "3 runs" in text and "hottest nodes:" in text and "time per op type:" in text
    assert "Linear" in text and "Attention" in text and "%" in text


def test_profile_summary_without_profiling(models) -> None:
    with pytest.raises(InvalidArgument, match="enable_profiling=True"):
        InferenceSession(models["mlp"][0]).profile_summary()


def test_flop_formulas() -> None:
    mm = og.Node("MatMul", ["a", "b"], ["y"], name="mm")
    assert node_flops(mm, [(2, 3, 4), (4, 5)], [(2, 3, 5)]) == 2 * 2 * 3 * 5 * 4
    gemm = og.Node("Gemm", ["a", "b", "c"], ["y"], name="g", attrs={"transB": 1})
    assert node_flops(gemm, [(8, 16), (32, 16), (32,)], [(8, 32)]) == 2 * 8 * 32 * 16 + 8 * 32
    lin = og.Node("Linear", ["x", "w"], ["y"], name="l", domain=og.OPSTRATA_DOMAIN)
    assert node_flops(lin, [(4, 16), (32, 16)], [(4, 32)]) == 2 * 4 * 32 * 16
    conv = og.Node("Conv", ["x", "w"], ["y"], name="c")
    assert node_flops(conv, [(1, 3, 8, 8), (8, 3, 3, 3)], [(1, 8, 8, 8)]) == 2 * 512 * 27
    att = og.Node("Attention", ["q", "k", "v"], ["y"], name="a", domain=og.OPSTRATA_DOMAIN)
    assert (
        node_flops(att, [(1, 2, 4, 8), (1, 2, 6, 8), (1, 2, 6, 8)], [(1, 2, 4, 8)])
        == 4 * 2 * 4 * 6 * 8 + 5 * 2 * 4 * 6
    )
    add = og.Node("Add", ["a", "b"], ["y"], name="add")
    assert node_flops(add, [(3, 4), (4,)], [(3, 4)]) == 12
    assert node_flops(og.Node("Transpose", ["a"], ["y"], name="t"), [(3, 4)], [(4, 3)]) == 0


@pytest.fixture
def softmax_without_cpu_kernel():
    """Take the cpu softmax kernel away for one test (it falls back), then put it back."""
    import opstrata.ops as ops

    saved = [e for e in ops.kernels("softmax") if e.device == "cpu"]
    ops.unregister("softmax", device="cpu")
    try:
        yield
    finally:
        for e in reversed(saved):
            ops.register(
                "softmax", device="cpu", dtypes=e.dtypes, priority=e.priority, dtype_arg=e.dtype_arg
            )(e.fn)


def test_fallback_nodes_are_flagged_and_policy_error_refuses(models, softmax_without_cpu_kernel) -> None:
    from opstrata.runtime import InvalidModel

    model, dims = models["mlp"]
    with pytest.raises(InvalidModel, match=r"node 'softmax' \(Softmax\): softmax float32 -> "):
        InferenceSession(model, SessionOptions(fallback_policy="error"))
    sess = InferenceSession(model, SessionOptions(fallback_policy="allow", enable_profiling=True))
    assert [b.node for b in sess.plan.fallbacks] == ["softmax"]
    sess.run(None, random_feeds(model, dims))
    flags = {e.name: e.fallback for e in sess.profiler.events}
    assert flags["softmax"] is True and not any(v for k, v in flags.items() if k != "softmax")
    assert "FALLBACK" in sess.profile_summary()
