"""Tensor-parallel partitioning (Megatron-LM): rank graphs equal the whole model, shards, AllReduce, errors."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import opstrata.graph as og
from opstrata.graph import OPSTRATA_DOMAIN, Graph, GraphError, Node
from opstrata.graph.testing import (
    ModelBuilder,
    bert_block_model,
    fused_llama,
    gpt_block_model,
    gpt_gqa_model,
    mlp_model,
    ort_run,
    random_feeds,
)

onnx = pytest.importorskip("onnx")

RTOL, ATOL = 1e-4, 1e-5
DIMS = {"batch": 2, "seq": 5}


# --------------------------------------------------------------------------- models


# --------------------------------------------------------------------------- helpers


def _linears(g: Graph) -> dict[str, str]:
    """Node name -> weight initializer of every linear layer."""
    return {
        n.name: n.inputs[1]
        for n in g.nodes
        if n.op_type in ("MatMul", "Gemm", "Linear") and len(n.inputs) > 1 and n.inputs[1] in g.initializers
    }


def _check(g: Graph, tp: int, feeds: dict[str, np.ndarray], **kw: Any) -> list[Graph]:
    ranks = og.partition(g, tp, **kw)
    assert len(ranks) == tp
    want = og.run_graph(g, feeds)
    outs = og.simulate_tensor_parallel(ranks, feeds)
    for out in outs:  # every rank holds the replicated result
        assert set(out) == set(want)
        for k, v in want.items():
            np.testing.assert_allclose(out[k], v, rtol=RTOL, atol=ATOL, err_msg=f"output {k}, tp={tp}")
    return ranks


def _sharded_weights(g: Graph, ranks: list[Graph], tp: int, whole: set[str] = frozenset()) -> None:
    """Every linear weight is 1/tp of the whole along exactly one axis (``whole`` ones are untouched)."""
    for name, w in _linears(g).items():
        full = g.initializers[w].shape
        for rg in ranks:
            got = rg.initializers[rg.node(name).inputs[1]].shape
            if name in whole or tp == 1:
                assert got == full, name
            else:
                diff = [i for i in range(2) if got[i] != full[i]]
                assert len(diff) == 1 and got[diff[0]] * tp == full[diff[0]], (name, full, got)


def _allreduces(rg: Graph) -> list[Node]:
    return [n for n in rg.nodes if n.domain == OPSTRATA_DOMAIN and n.op_type == "AllReduce"]


# --------------------------------------------------------------------------- equality with the whole model


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_gpt_block_matches_whole_model(tp: int) -> None:
    g = og.from_onnx(gpt_block_model())
    ranks = _check(g, tp, random_feeds(g, DIMS), on_unmatched="replicate")
    _sharded_weights(g, ranks, tp, whole={"lm_head"})
    for rg in ranks:
        assert len(_allreduces(rg)) == 2  # one per row-parallel layer: attention output, MLP down
        assert all(n.attrs == {"op": "sum", "group_size": tp} for n in _allreduces(rg))
        assert "replicated linear layers ['lm_head']" in rg.doc_string


def test_gpt_block_rewrites_head_counts_and_fused_qkv_split() -> None:
    g = og.from_onnx(gpt_block_model(hidden=32, heads=4))
    r1 = og.partition(g, 2, on_unmatched="replicate")[1]
    reshapes = [n for n in r1.nodes if n.op_type == "Reshape"]
    assert [r1.value(n.outputs[0]).shape for n in reshapes] == [("batch", "seq", 2, 8)] * 3 + [
        ("batch", "seq", 16)
    ]
    qkv_w = g.initializers[g.node("MatMul_24").inputs[1]]  # (32, 96) = [q | k | v]
    got = r1.initializers[r1.node("MatMul_24").inputs[1]]
    want = np.concatenate(
        [qkv_w[:, 16:32], qkv_w[:, 48:64], qkv_w[:, 80:96]], axis=1
    )  # rank 1's heads of each
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("tp", [2, 4])
def test_mlp_gemm_column_then_row(tp: int) -> None:
    g = og.from_onnx(mlp_model(hidden=32))
    ranks = _check(g, tp, random_feeds(g, DIMS))
    _sharded_weights(g, ranks, tp)
    fc2 = [n.name for n in g.nodes if n.op_type == "Gemm"][1]
    assert len(ranks[0].node(fc2).inputs) == 3  # the bias is added once: on rank 0 ...
    assert all(len(rg.node(fc2).inputs) == 2 for rg in ranks[1:])  # ... and nowhere else
    assert [len(_allreduces(rg)) for rg in ranks] == [1] * tp


@pytest.mark.parametrize("tp", [2, 4])
def test_bert_block_separate_qkv_and_padding_mask(tp: int) -> None:
    g = og.from_onnx(bert_block_model(hidden=32, heads=4, ffn=64))
    ranks = _check(g, tp, random_feeds(g, DIMS))
    _sharded_weights(g, ranks, tp)
    assert len(_allreduces(ranks[0])) == 2


@pytest.mark.parametrize("tp", [2, 4])
def test_two_layer_gpt_with_gqa(tp: int) -> None:
    g = og.from_onnx(gpt_gqa_model(layers=2, heads=8, kv_heads=4))
    ranks = _check(g, tp, random_feeds(g, DIMS))
    _sharded_weights(g, ranks, tp)
    assert len(_allreduces(ranks[0])) == 4  # 2 per transformer block
    expands = [n for n in ranks[0].nodes if n.op_type == "Expand"]
    assert {ranks[0].value(n.outputs[0]).shape[1] for n in expands} == {4 // tp}  # Hkv / tp kv heads


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_fused_linear_attention_swiglu(tp: int) -> None:
    g = fused_llama(layers=2, heads=4, kv_heads=4 if tp == 4 else 2)
    ranks = _check(g, tp, random_feeds(g, DIMS))
    _sharded_weights(g, ranks, tp)
    assert len(_allreduces(ranks[0])) == 4
    attn = ranks[0].node("l0.attn")
    assert ranks[0].value(attn.inputs[0]).shape[1] * tp == 4  # H / tp query heads per rank
    assert [len(rg.node("l0.o").inputs) for rg in ranks] == [3] + [2] * (tp - 1)  # bias on rank 0 only


def test_partition_leaves_the_input_graph_alone() -> None:
    g = fused_llama(layers=1)
    before = g.dump()
    og.partition(g, 2)
    assert g.dump() == before


@settings(max_examples=12, deadline=None)
@given(
    kv=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([2, 4]),
    ffn_mult=st.sampled_from([2, 4]),
    tp=st.sampled_from([1, 2, 4]),
)
def test_fused_property_matches_whole_model(
    kv: int, group: int, head_dim: int, ffn_mult: int, tp: int
) -> None:
    heads = kv * group
    hidden = heads * head_dim
    g = fused_llama(layers=1, hidden=hidden, heads=heads, kv_heads=kv, ffn=ffn_mult * hidden)
    feeds = random_feeds(g, {"batch": 1, "seq": 3})
    if kv % tp or heads % tp:
        with pytest.raises(GraphError, match=rf"heads H(kv)?=\d+, which tp={tp}"):
            og.partition(g, tp)
        return
    _check(g, tp, feeds)


# --------------------------------------------------------------------------- errors


def test_heads_not_divisible_names_layer_heads_and_tp() -> None:
    g = og.from_onnx(gpt_block_model(hidden=24, heads=3))
    with pytest.raises(GraphError, match=r"Reshape_41.*3 heads across tp=2.*MatMul_24.*not divisible") as exc:
        og.partition(g, 2, on_unmatched="replicate")
    assert "1, 3" in str(exc.value)  # the way out: tp values that divide 3


def test_fused_attention_heads_not_divisible() -> None:
    g = fused_llama(heads=4, kv_heads=2)
    with pytest.raises(GraphError, match=r"l0\.attn.*Hkv=2.*tp=4"):
        og.partition(g, 4)
    with pytest.raises(GraphError, match=r"query heads H=4.*tp=3"):
        og.partition(g, 3)


def test_gqa_kv_heads_not_divisible_in_onnx_form() -> None:
    g = og.from_onnx(gpt_gqa_model(layers=1, heads=8, kv_heads=2))
    with pytest.raises(GraphError, match=r"2 heads across tp=4"):
        og.partition(g, 4)


@pytest.mark.parametrize("tp", [0, -2, 1.5, True, "2", None])
def test_bad_tp(tp: Any) -> None:
    with pytest.raises(GraphError, match=r"tp must be an int >= 1"):
        og.partition(fused_llama(layers=1), tp)


def test_bad_arguments() -> None:
    with pytest.raises(GraphError, match=r"on_unmatched='always'"):
        og.partition(fused_llama(layers=1), 2, on_unmatched="always")  # type: ignore[arg-type]
    with pytest.raises(GraphError, match=r"expected a Graph"):
        og.partition(gpt_block_model(), 2)  # a ModelProto, not a Graph


def test_unmatched_layer_is_an_error_by_default_and_replicated_when_asked() -> None:
    g = og.from_onnx(gpt_block_model())
    with pytest.raises(GraphError, match=r"lm_head.*graph output 'logits'.*on_unmatched='replicate'"):
        og.partition(g, 2)
    r = og.partition(g, 2, on_unmatched="replicate")[1]
    assert r.initializers["lm_head_153"].shape == (32, 50)


def test_norm_over_split_features_is_unmatched() -> None:
    """A linear followed by a LayerNorm over its output features cannot be column-parallel."""
    b = ModelBuilder("ln_between", 17)
    x = b.input("x", ["batch", 8])
    h = b.op("LayerNormalization", [b.linear(x, 8, 16), b.weight([16]), b.weight([16])], axis=-1)
    b.nodes.append(onnx.helper.make_node("MatMul", [h, b.weight([16, 8])], ["y"], name="fc2"))
    b.output("y")
    g = og.from_onnx(b.build())
    with pytest.raises(
        GraphError,
        match=r"LayerNormalization.*linear 'MatMul_3'.*normalises over axes that include the split",
    ):
        og.partition(g, 2)
    ranks = _check(g, 2, random_feeds(g, DIMS), on_unmatched="replicate")
    assert all(len(_allreduces(rg)) == 0 for rg in ranks)  # both layers replicated, nothing to reduce


def test_unfollowable_op_names_node_and_op() -> None:
    b = ModelBuilder("cumsum_between", 17)
    x = b.input("x", ["batch", 8])
    c = b.op("CumSum", [b.linear(x, 8, 16), b.const(np.array(0, np.int64))])
    b.nodes.append(onnx.helper.make_node("MatMul", [c, b.weight([16, 8])], ["y"], name="fc2"))
    b.output("y")
    with pytest.raises(GraphError, match=r"CumSum.*no rule to split CumSum"):
        og.partition(og.from_onnx(b.build()), 2)


def _between_linears(op: str, **attrs: Any) -> Graph:
    """x -> column-parallel linear (8 -> 16) -> ``op`` over the batch axis -> row-parallel MatMul (16 -> 8)."""
    b = ModelBuilder(f"{op.lower()}_between", 18)
    x = b.input("x", ["batch", 8])
    h = b.op(op, [b.linear(x, 8, 16), b.const(np.array([0], np.int64))], **attrs)
    b.nodes.append(onnx.helper.make_node("MatMul", [h, b.weight([16, 8])], ["y"], name="fc2"))
    b.output("y")
    return og.from_onnx(b.build())


@pytest.mark.parametrize("op", ["ReduceL2", "ReduceMax", "ReduceLogSumExp", "ReduceSumSquare"])
def test_reduce_rows_name_their_layout_and_partition_follows_them(op: str) -> None:
    """Every Reduce* OpDef says layout="reduce": a reduction over an unsplit axis keeps the split."""
    assert og.lookup_op(op).layout == "reduce"
    g = _between_linears(op, keepdims=1)
    ranks = _check(g, 2, random_feeds(g, DIMS))
    assert all(len(_allreduces(rg)) == 1 for rg in ranks)


def test_layout_comes_from_the_opdef() -> None:
    """An op partition has no rule for is refused naming the ops with rules; giving its OpDef a layout
    class makes partition follow it (here CumSum over the unsplit batch axis behaves like a reduction)."""
    b = ModelBuilder("cumsum_layout", 17)
    x = b.input("x", ["batch", 8])
    c = b.op("CumSum", [b.linear(x, 8, 16), b.const(np.array(0, np.int64))])
    b.nodes.append(onnx.helper.make_node("MatMul", [c, b.weight([16, 8])], ["y"], name="fc2"))
    b.output("y")
    g = og.from_onnx(b.build())
    with pytest.raises(GraphError, match=r"follows: elementwise ops, .*ReduceL2.*Softmax.*OpDef's `layout`"):
        og.partition(g, 2)
    original = og.lookup_op("CumSum")
    assert original is not None and original.layout is None and original.layout_rule is None
    facts = {
        f: getattr(original, f) for f in ("attrs", "importer", "shape", "kernel", "uses", "dtypes", "doc")
    }
    try:
        # the squeeze rule with nothing to squeeze keeps the split axis: right for a scan over axis 0
        og.define_op("CumSum", **facts, layout="squeeze")
        assert og.lookup_op("CumSum").layout_rule == "squeeze"
        _check(g, 2, random_feeds(g, DIMS))
    finally:
        og.define_op("CumSum", **facts)
    with pytest.raises(GraphError, match=r"no rule to split CumSum"):
        og.partition(g, 2)


def test_define_rejects_an_unknown_layout_class() -> None:
    with pytest.raises(ValueError, match=r"layout='diagonal'; use one of \('elementwise', 'transpose'"):
        og.define_op("MyOp", "com.example", layout="diagonal")
    assert og.lookup_op("MyOp", "com.example") is None


def test_feature_count_not_divisible() -> None:
    g = og.from_onnx(mlp_model(hidden=30))
    with pytest.raises(GraphError, match=r"output features \[30\]; 30 is not divisible by tp=4"):
        og.partition(g, 4)


# --------------------------------------------------------------------------- AllReduce op, export, simulator


class _Identity:
    """A collective backend that returns the local tensor (what onnxruntime computes per rank)."""

    def all_reduce(self, x: np.ndarray, *, op: str, node: Node) -> np.ndarray:
        return x


@pytest.mark.parametrize("make", [lambda: og.from_onnx(gpt_block_model()), lambda: fused_llama(layers=1)])
def test_rank_graphs_export_and_run_per_rank_in_onnxruntime(make: Any) -> None:
    pytest.importorskip("onnxruntime")
    g = make()
    feeds = random_feeds(g, DIMS)
    for rg in og.partition(g, 2, on_unmatched="replicate"):
        model = og.to_onnx(rg)
        onnx.checker.check_model(model, full_check=True)
        docs = [f.doc_string for f in model.functions if f.name.startswith("AllReduce")]
        assert docs and all("collective" in d and "group_size=2" in d for d in docs)
        with og.use_collectives(_Identity()):
            local = og.run_graph(rg, feeds)
        for k, v in ort_run(model, feeds).items():
            np.testing.assert_allclose(v, local[k], rtol=RTOL, atol=ATOL)


def test_allreduce_without_backend_is_an_error_unless_group_of_one() -> None:
    g = og.from_onnx(mlp_model())
    feeds = random_feeds(g, DIMS)
    with pytest.raises(
        GraphError, match=r"AllReduce over 2 ranks needs the other ranks.*simulate_tensor_parallel"
    ):
        og.run_graph(og.partition(g, 2)[0], feeds)
    single = og.partition(g, 1)[0]
    np.testing.assert_allclose(
        og.run_graph(single, feeds)["probs"], og.run_graph(g, feeds)["probs"], rtol=RTOL
    )


def test_allreduce_runs_the_registered_ops_kernel_without_a_backend() -> None:
    """A higher-priority all_reduce kernel (what opstrata.comm registers) serves AllReduce nodes."""
    import opstrata.ops as ops
    from opstrata.ops.testing import isolated_registry

    g = Graph("ar")
    g.add_input("x", np.float32, (3,))
    g.add_node("AllReduce", ["x"], ["y"], {"op": "max", "group_size": 2}, domain=OPSTRATA_DOMAIN)
    g.outputs.append("y")
    calls: list[tuple[str, int]] = []

    def fake(x: np.ndarray, *, op: str = "sum", group_size: int = 1) -> np.ndarray:
        calls.append((op, group_size))
        return np.asarray(x) + 10

    with isolated_registry():
        ops.register("all_reduce", device="cpu", priority=10)(fake)
        assert og.run_graph(g, {"x": np.arange(3, dtype=np.float32)})["y"].tolist() == [10, 11, 12]
        with og.use_collectives(_Identity()):  # an installed backend (the simulator) still comes first
            assert og.run_graph(g, {"x": np.arange(3, dtype=np.float32)})["y"].tolist() == [0, 1, 2]
    assert calls == [("max", 2)]


def test_allreduce_shape_rule_checks_attrs() -> None:
    g = Graph("ar")
    g.add_input("x", np.float32, ("batch", 4))
    g.add_node("AllReduce", ["x"], ["y"], {"op": "prod", "group_size": 2}, domain=OPSTRATA_DOMAIN)
    g.outputs.append("y")
    with pytest.raises(GraphError, match=r"op='prod' is not a reduction"):
        og.infer_shapes(g)
    g.nodes[0].attrs["op"] = "max"
    assert og.infer_shapes(g).value("y").shape == ("batch", 4)


def test_simulator_reduce_ops() -> None:
    g = Graph("ar")
    g.add_input("x", np.float32, (3,))
    g.add_node("AllReduce", ["x"], ["y"], {"op": "max", "group_size": 2}, domain=OPSTRATA_DOMAIN)
    g.outputs.append("y")
    xs = [{"x": np.array([1, 5, 3], np.float32)}, {"x": np.array([4, 2, 3], np.float32)}]
    outs = og.simulate_tensor_parallel([g, g.copy()], xs)
    assert [o["y"].tolist() for o in outs] == [[4, 5, 3]] * 2
    g.nodes[0].attrs["op"] = "avg"
    assert og.simulate_tensor_parallel([g, g], xs)[1]["y"].tolist() == [2.5, 3.5, 3.0]


def test_simulator_mismatched_collectives_error_instead_of_hang() -> None:
    g = og.from_onnx(mlp_model())
    r0, r1 = og.partition(g, 2)
    ar = _allreduces(r1)[0]  # rank 1 skips its collective
    r1.replace_uses(ar.outputs[0], ar.inputs[0])
    r1.remove_node(ar)
    with pytest.raises(
        GraphError, match=r"ranks disagree on the next collective.*rank 1 is at '<end of graph>'"
    ):
        og.simulate_tensor_parallel([r0, r1], random_feeds(g, DIMS), timeout=10)


def test_simulator_reports_the_failing_rank() -> None:
    g = og.from_onnx(mlp_model())
    ranks = og.partition(g, 2)
    feeds = random_feeds(g, DIMS)
    bad = [feeds, {"x": feeds["x"].astype(np.float64)}]
    with pytest.raises(GraphError, match=r"rank 1.*expected dtype float32, got float64"):
        og.simulate_tensor_parallel(ranks, bad, timeout=10)


def test_simulator_argument_errors() -> None:
    g = og.from_onnx(mlp_model())
    ranks = og.partition(g, 2)
    feeds = random_feeds(g, DIMS)
    with pytest.raises(GraphError, match=r"group_size=2 but 1 rank graphs"):
        og.simulate_tensor_parallel(ranks[:1], feeds)
    with pytest.raises(GraphError, match=r"3 feed mappings for 2 rank graphs"):
        og.simulate_tensor_parallel(ranks, [feeds] * 3)
    with pytest.raises(GraphError, match=r"non-empty sequence of Graph"):
        og.simulate_tensor_parallel([], feeds)


def test_head_size_computed_from_the_split_dim_is_refused() -> None:
    """``x.view(B, S, H, C // H)`` with C read from the split tensor would silently use C/tp: an error."""
    b = ModelBuilder("view_from_shape", 17)
    x = b.input("x", ["batch", "seq", 8])
    h = b.linear(x, 8, 16)
    shape = b.op("Shape", [h])
    c = b.op("Gather", [shape, b.ints([2])], axis=0)
    bs = b.op("Gather", [shape, b.ints([0, 1])], axis=0)
    target = b.op("Concat", [bs, b.ints([4]), b.op("Div", [c, b.ints([4])])], axis=0)
    t = b.op("Transpose", [b.op("Reshape", [h, target])], perm=[0, 2, 1, 3])
    merged = b.op("Reshape", [b.op("Transpose", [t], perm=[0, 2, 1, 3]), b.ints([0, 0, 16])])
    b.nodes.append(onnx.helper.make_node("MatMul", [merged, b.weight([16, 8])], ["y"], name="proj"))
    b.output("y")
    g = og.from_onnx(b.build())
    with pytest.raises(GraphError, match=r"Gather.*reads the split dim 2 of .* through Shape"):
        og.partition(g, 2)
    _check(g, 2, random_feeds(g, DIMS), on_unmatched="replicate")


def test_row_parallel_bias_lives_on_rank_zero_only() -> None:
    g = fused_llama(layers=1)
    r0, r1 = og.partition(g, 2)
    assert "l0.o.b" in r0.initializers and "l0.o.b" not in r1.initializers
    np.testing.assert_array_equal(r0.initializers["l0.o.b"], g.initializers["l0.o.b"])  # whole, not sliced
    assert r1.initializers["l0.q.b"].shape == (16,)  # column-parallel bias: rank 1's half
    np.testing.assert_array_equal(r1.initializers["l0.q.b"], g.initializers["l0.q.b"][16:])


def test_row_parallel_epilogue_activation_moves_after_the_reduce() -> None:
    """A fused ``Linear(activation=...)`` (level-2 bias+activation fusion) must activate the sum, not each part."""
    g = fused_llama(layers=1)
    g.node("l0.down").attrs["activation"] = "gelu_tanh"
    r1 = og.partition(g, 2)[1]
    down = r1.node("l0.down")
    assert "activation" not in down.attrs
    after = r1.nodes[r1.nodes.index(down) + 1 : r1.nodes.index(down) + 3]
    assert [(n.op_type, n.attrs) for n in after] == [
        ("AllReduce", {"op": "sum", "group_size": 2}),
        ("Gelu", {"approximate": "tanh"}),
    ]
    assert after[1].outputs == ["l0.down"]  # consumers still read the activated, reduced value
    g.node("l0.down").attrs["activation"] = "softplus"
    with pytest.raises(GraphError, match=r"l0\.down.*epilogue activation 'softplus'"):
        og.partition(g, 2)


def test_simulator_collective_times_out_instead_of_hanging() -> None:
    from opstrata.graph.partition.simulate import _Group

    with pytest.raises(GraphError, match=r"collective 'AllReduce_0' was abandoned.*within 0.2 s"):
        _Group(2, timeout=0.2).exchange(0, "AllReduce_0", np.zeros(1))  # rank 1 never arrives


@pytest.mark.parametrize("tp", [2, 4])
def test_fused_qkv_with_unequal_gqa_split(tp: int) -> None:
    g = fused_llama(layers=1, heads=8, kv_heads=4, fused_qkv=True)
    ranks = _check(g, tp, random_feeds(g, DIMS))
    _sharded_weights(g, ranks, tp)
    split = ranks[1].nodes[[n.op_type for n in ranks[1].nodes].index("Split")]
    assert split.attrs["split"] == [32 // tp, 16 // tp, 16 // tp]
    w, w1 = g.initializers["l0.qkv.w"], ranks[1].initializers["l0.qkv.w"]  # (64, 32) = [q 32 | k 16 | v 16]
    q, k = 32 // tp, 16 // tp
    np.testing.assert_array_equal(
        w1, np.concatenate([w[q : 2 * q], w[32 + k : 32 + 2 * k], w[48 + k : 48 + 2 * k]])
    )


@pytest.mark.parametrize("opset", [14, 18])
def test_gpt_block_other_opsets(opset: int) -> None:
    """Opset 14: decomposed LayerNorm (ReduceMean over the replicated residual); 18: Split num_outputs."""
    g = og.from_onnx(gpt_block_model(opset=opset))
    _check(g, 2, random_feeds(g, DIMS), on_unmatched="replicate")


def test_simulator_outputs_and_device() -> None:
    g = fused_llama(layers=1)
    feeds = random_feeds(g, DIMS)
    want = og.run_graph(g, feeds, outputs=["l0.attn_bshd"])["l0.attn_bshd"]
    outs = og.simulate_tensor_parallel(og.partition(g, 2), feeds, "ref", outputs=["l0.attn_bshd", "l0.res2"])
    assert [o["l0.attn_bshd"].shape[2] for o in outs] == [2, 2]  # each rank computes its own 2 of 4 heads
    np.testing.assert_allclose(
        np.concatenate([o["l0.attn_bshd"] for o in outs], axis=2), want, rtol=RTOL, atol=ATOL
    )


@settings(max_examples=8, deadline=None)
@given(
    kv=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2]),
    head_dim=st.sampled_from([2, 4]),
    tp=st.sampled_from([2, 4]),
)
def test_onnx_gqa_property_matches_whole_model(kv: int, group: int, head_dim: int, tp: int) -> None:
    heads = kv * group
    g = og.from_onnx(gpt_gqa_model(layers=1, hidden=heads * head_dim, heads=heads, kv_heads=kv))
    if kv % tp:  # the first head split (Q: H, then K: Hkv) that tp cannot divide is named
        first = heads if heads % tp else kv
        with pytest.raises(GraphError, match=rf"into {first} heads across tp={tp}"):
            og.partition(g, tp)
        return
    _check(g, tp, random_feeds(g, {"batch": 1, "seq": 3}))


def test_weight_behind_its_own_transpose() -> None:
    """``x @ W.T`` exported without constant folding: Transpose(W (out, in)) feeding the MatMul."""
    b = ModelBuilder("wt", 17)
    x = b.input("x", ["batch", 8])
    h = b.op("Relu", [b.op("MatMul", [x, b.op("Transpose", [b.weight([16, 8])], perm=[1, 0])])])
    b.nodes.append(
        onnx.helper.make_node("MatMul", [h, b.op("Transpose", [b.weight([8, 16])])], ["y"], name="fc2")
    )
    b.output("y")
    g = og.from_onnx(b.build())
    ranks = _check(g, 2, random_feeds(g, DIMS))
    assert [ranks[1].initializers[n].shape for n in ("w_1", "w_8")] == [(8, 8), (8, 8)]
    assert len(_allreduces(ranks[0])) == 1


def test_shape_constant_shared_by_split_and_replicated_reshapes() -> None:
    """A head-count constant read by both a split and a replicated Reshape is copied, not edited in place."""
    rng = np.random.default_rng(0)
    g = Graph("shared", opset_imports={"": 17, OPSTRATA_DOMAIN: 1})
    g.add_input("x", np.float32, ("batch", "seq", 32))
    for name in ("q", "o"):
        g.add_initializer(f"{name}.w", rng.standard_normal((32, 32)).astype(np.float32) / 6)
    g.add_initializer("heads", np.array([0, 0, 4, 8], np.int64))
    g.add_initializer("merge", np.array([0, 0, 32], np.int64))
    g.add_node("Linear", ["x", "q.w"], ["q"], domain=OPSTRATA_DOMAIN)
    g.add_node("Reshape", ["q", "heads"], ["q4"])
    g.add_node("Tanh", ["q4"], ["t4"])
    g.add_node("Reshape", ["t4", "merge"], ["t"])
    g.add_node("Linear", ["t", "o.w"], ["o"], domain=OPSTRATA_DOMAIN)
    g.add_node("Reshape", ["x", "heads"], ["x4"])  # replicated: must keep 4 heads
    g.add_node("Reshape", ["x4", "merge"], ["x2"])
    g.add_node("Add", ["o", "x2"], ["y"])
    g.outputs.append("y")
    og.infer_shapes(g)
    ranks = _check(g, 2, random_feeds(g, DIMS))
    r1 = ranks[1]
    assert r1.initializers["heads"].tolist() == [0, 0, 4, 8] and r1.initializers["merge"].tolist() == [
        0,
        0,
        32,
    ]
    split_heads = r1.initializers[r1.producer("q4").inputs[1]]
    assert split_heads.tolist() == [0, 0, 2, 8]
    assert r1.initializers[r1.producer("t").inputs[1]].tolist() == [0, 0, 16]


def test_compiled_rank_graphs_bind_allreduce_to_the_ops_kernel_and_match_whole_model() -> None:
    g = og.from_onnx(mlp_model())
    feeds = random_feeds(g, {"batch": 3})
    want = og.run_graph(g, feeds)
    plans = [og.compile(rg, level=2) for rg in og.partition(g, tp=2)]
    for plan in plans:
        coll = [b for b in plan.bindings if b.op_type == f"{OPSTRATA_DOMAIN}::AllReduce"]
        assert coll and all(b.kernel == "all_reduce" and b.path == "native" for b in coll)
        assert not plan.fallbacks
    got = og.simulate_tensor_parallel([p.graph for p in plans], feeds)
    for rank_out in got:
        for name, value in want.items():
            np.testing.assert_allclose(rank_out[name], value, rtol=1e-4, atol=1e-5)
