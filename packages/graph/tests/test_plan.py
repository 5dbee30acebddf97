"""compile() -> Plan: kernel bindings and fallbacks, memory, run, save/load round trip and malformed input."""

from __future__ import annotations

import json
import warnings
import zipfile

import numpy as np
import pytest

import opstrata.graph as og
import opstrata.ops as ops
from opstrata.graph.testing import bert_block_model, cnn_model, gpt_block_model, mlp_model, random_feeds

pytest.importorskip("onnx")


@pytest.fixture(scope="module")
def gpt_plan():
    return og.compile(og.from_onnx(gpt_block_model(opset=14)), level=3)


def test_compile_binds_every_node(gpt_plan):
    p = gpt_plan
    assert p.level == 3 and p.device == "cpu" and p.fallbacks == []
    bound = {b.node for b in p.bindings}
    assert bound == {n.name for n in p.graph.nodes if og.kernels_of(n)}
    attn = [b for b in p.bindings if b.op_type == "ai.opstrata::Attention"]
    assert [(b.kernel, b.path, b.dtype) for b in attn] == [("attention", "native", "float32")]
    lin = [b.kernel for b in p.bindings if b.op_type == "ai.opstrata::Linear"]
    assert lin.count("linear") == 4 and lin.count("gelu") == 1  # the gelu epilogue is bound too
    assert any(b.path == "host" and b.kernel == "host" for b in p.bindings)  # Shape/Range stay host code
    assert "0 fallbacks" in str(p) and "planned per shape on run" in str(p)


def test_compile_accepts_model_proto_and_plans_static_memory():
    p = og.compile(mlp_model(), input_shapes={"x": (4, 16)})
    assert p.memory is not None and p.memory.dims == {"batch": 4}
    assert p.memory.arena_bytes <= 1.05 * p.memory.lower_bound_bytes
    g = og.from_onnx(cnn_model())
    g.values["x"].shape = (2, 3, 16, 16)  # static input: planned at compile time
    assert og.compile(g).memory is not None


def test_run_plans_memory_per_shape(gpt_plan):
    p = og.compile(og.from_onnx(gpt_block_model(opset=14)), level=2)
    assert p.memory is None
    for dims in ({"batch": 1, "seq": 3}, {"batch": 2, "seq": 6}, {"batch": 1, "seq": 3}):
        p.run(random_feeds(p.graph, dims))
    assert len(p._planner) == 2
    assert p.memory_for({"ids": (2, 6)}).dims == {"batch": 2, "seq": 6}


def test_fallbacks_are_listed_and_follow_the_policy():
    @ops.register("relu", device="graphtestdev")
    def _relu(x):  # a device with one native kernel: everything else falls back along its chain
        return np.maximum(x, 0)

    try:
        g = og.from_onnx(mlp_model())
        with ops.fallback_policy("allow"):
            p = og.compile(g, level=1, device="graphtestdev")
        paths = {(b.kernel, b.path) for b in p.bindings}
        assert ("relu", "native") in paths and ("gemm", "device:cpu") in paths
        assert {b.kernel for b in p.fallbacks} == {"gemm", "softmax"}
        assert "fallback: node" in p.summary()
        with ops.fallback_policy("allow"):
            p.run({"x": np.ones((2, 16), np.float32)})
        assert any("gemm" in line and "graphtestdev" in line for line in p.runtime_fallbacks)
        with ops.fallback_policy("warn"), pytest.warns(ops.FallbackWarning, match="gemm"):
            og.compile(g, level=1, device="graphtestdev")
        with ops.fallback_policy("error"), pytest.raises(og.GraphError, match="would fall back"):
            og.compile(g, level=1, device="graphtestdev")
    finally:
        ops.unregister("relu", device="graphtestdev")


def test_save_load_round_trip(tmp_path, gpt_plan):
    path = gpt_plan.save(tmp_path / "gpt.plan")
    assert path.exists() and not list(tmp_path.glob(".*tmp"))
    q = og.Plan.load(path)
    assert [n.op_type for n in q.graph.nodes] == [n.op_type for n in gpt_plan.graph.nodes]
    assert q.report.table() == gpt_plan.report.table() and q.bindings == gpt_plan.bindings
    feeds = random_feeds(gpt_plan.graph, {"batch": 2, "seq": 5})
    np.testing.assert_array_equal(q.run(feeds)["logits"], gpt_plan.run(feeds)["logits"])
    with zipfile.ZipFile(path) as z:  # the ONNX export rides along for other tools
        assert {"format.json", "plan.json", "graph.json", "graph.onnx"} <= set(z.namelist())


def test_save_load_keeps_memory_plan_and_fused_attrs(tmp_path):
    p = og.compile(bert_block_model(), level=3, input_shapes={"x": (2, 5, 32), "mask": (2, 5)})
    q = og.Plan.load(p.save(tmp_path / "bert.plan"))
    assert q.memory == p.memory and q.input_shapes == p.input_shapes
    fe = next(n for n in q.graph.nodes if n.op_type == "FusedElementwise")
    assert fe.attrs["expr"] == [["Sub", ["c0", "x0"]], ["Mul", ["t0", "c1"]]]  # (1 - m) * -1e4
    assert fe.attrs["consts"] == [1.0, -10000.0]
    assert fe.attrs == next(n for n in p.graph.nodes if n.op_type == "FusedElementwise").attrs


def test_save_is_atomic_on_failure(tmp_path, gpt_plan, monkeypatch):
    path = tmp_path / "keep.plan"
    gpt_plan.save(path)
    before = path.read_bytes()

    def boom(*a, **k):
        raise OSError("disk full")

    monkeypatch.setattr(zipfile.ZipFile, "writestr", boom)
    with pytest.raises(OSError, match="disk full"):
        gpt_plan.save(path)
    assert path.read_bytes() == before and len(list(tmp_path.iterdir())) == 1  # no temp file left


# --------------------------------------------------------------------------- malformed input


def _rewrite(src, dst, name, data):
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.namelist():
            zout.writestr(item, data if item == name else zin.read(item))


@pytest.fixture()
def saved(tmp_path):
    return og.compile(mlp_model(), level=2).save(tmp_path / "mlp.plan")


def test_load_missing_file(tmp_path):
    with pytest.raises(og.GraphError, match="no such file"):
        og.Plan.load(tmp_path / "nope.plan")


def test_load_garbage_and_truncated(tmp_path, saved):
    bad = tmp_path / "garbage.plan"
    bad.write_bytes(b"\x00not a zip at all" * 10)
    with pytest.raises(og.GraphError, match=r"garbage\.plan.*corrupt or truncated"):
        og.Plan.load(bad)
    cut = tmp_path / "cut.plan"
    cut.write_bytes(saved.read_bytes()[: len(saved.read_bytes()) // 2])
    with pytest.raises(og.GraphError, match=r"cut\.plan.*corrupt"):
        og.Plan.load(cut)


def test_load_version_mismatch(tmp_path, saved):
    other = tmp_path / "v99.plan"
    _rewrite(saved, other, "format.json", json.dumps({"format": "opstrata-plan", "version": 99}))
    with pytest.raises(og.GraphError, match=r"v99\.plan.*version 99.*reads version 1.*recompile"):
        og.Plan.load(other)
    wrong = tmp_path / "wrong.plan"
    _rewrite(saved, wrong, "format.json", json.dumps({"format": "something-else", "version": 1}))
    with pytest.raises(og.GraphError, match="not an opstrata plan"):
        og.Plan.load(wrong)


def test_load_corrupt_tensor_and_graph(tmp_path, saved):
    t = tmp_path / "tensor.plan"
    _rewrite(saved, t, "tensors/0.bin", b"\x01\x02\x03")
    with pytest.raises(og.GraphError, match=r"tensor\.plan.*needs \d+ bytes, found 3"):
        og.Plan.load(t)
    g = tmp_path / "graph.plan"
    with zipfile.ZipFile(saved) as z:
        doc = json.loads(z.read("graph.json"))
    doc["nodes"][0]["inputs"][0] = "dangling"
    _rewrite(saved, g, "graph.json", json.dumps(doc))
    with pytest.raises(og.GraphError, match=r"graph\.plan.*inconsistent.*dangling"):
        og.Plan.load(g)
    with zipfile.ZipFile(saved) as z:
        meta = json.loads(z.read("plan.json"))
    del meta["report"]
    r = tmp_path / "meta.plan"
    _rewrite(saved, r, "plan.json", json.dumps(meta))
    with pytest.raises(og.GraphError, match=r"meta\.plan.*corrupt plan metadata.*report"):
        og.Plan.load(r)
    j = tmp_path / "json.plan"
    _rewrite(saved, j, "plan.json", "{not json")
    with pytest.raises(og.GraphError, match="corrupt"):
        og.Plan.load(j)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"graph": 42}, "expected an opstrata.graph.Graph"),
        ({"level": 7}, "level must be one of"),
        ({"device": "tpu9"}, "unknown device 'tpu9'"),
        ({"input_shapes": {"y": (1, 16)}}, "unknown inputs \\['y'\\]"),
        ({"input_shapes": {"x": (4, 15)}}, "expected \\('batch', 16\\)"),
        ({"graph": b"garbage bytes"}, "ModelProto|parse|protobuf|decode"),
    ],
)
def test_compile_malformed_input(kwargs, match):
    args = {"graph": og.from_onnx(mlp_model())} | kwargs
    with pytest.raises(og.GraphError, match=match):
        og.compile(**args)


def test_compile_unknown_op_is_clear():
    g = og.Graph("custom")
    g.add_input("x", np.float32, (2,))
    g.add_node("Frobnicate", ["x"], ["y"])
    g.outputs.append("y")
    with pytest.raises(og.GraphError, match="Frobnicate"):
        og.compile(g, level=0)


def test_linear_with_unknown_activation_is_a_clear_error():
    g = og.Graph("lin")
    g.add_input("x", np.float32, (2, 3))
    g.add_initializer("w", np.ones((4, 3), np.float32))
    g.add_node("Linear", ["x", "w"], ["y"], {"activation": "swish7"}, name="fc1", domain=og.OPSTRATA_DOMAIN)
    g.outputs.append("y")
    msg = r"node 'fc1' \(ai\.opstrata::Linear\): unknown activation 'swish7'\. Fix: use one of gelu, gelu_tanh, relu, sigmoid, tanh"
    with pytest.raises(og.GraphError, match=msg):
        og.kernels_of(g.nodes[0])
    with pytest.raises(og.GraphError, match=msg):
        og.compile(g, level=0)
    g.nodes[0].attrs["activation"] = "gelu_tanh"  # a supported one binds linear + gelu
    assert og.kernels_of(g.nodes[0]) == ["linear", "gelu"]


def test_compile_no_kernel_for_dtype_is_clear():
    g = og.Graph("intsqrt")
    g.add_input("x", np.int64, (2,))
    g.add_node("Sqrt", ["x"], ["y"])
    g.outputs.append("y")
    with pytest.raises(og.GraphError, match="Sqrt"):
        og.compile(g, level=0)


def test_warnings_free_compile():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        og.compile(og.from_onnx(gpt_block_model()), level=2)


def test_compile_cycle_and_inconsistent_shapes():
    g = og.Graph("cyc")
    g.add_input("x", np.float32, (2,))
    g.add_node("Add", ["x", "b"], ["a"])
    g.add_node("Relu", ["a"], ["b"])
    g.outputs.append("b")
    with pytest.raises(og.GraphError, match="cycle"):
        og.compile(g)
    h = og.Graph("bad_shapes")
    h.add_input("x", np.float32, (2, 3))
    h.add_initializer("w", np.ones((4, 5), np.float32))
    h.add_node("MatMul", ["x", "w"], ["y"])
    h.outputs.append("y")
    with pytest.raises(og.GraphError, match="inconsistent shapes"):
        og.compile(h)
