"""Shape-fixed host steps of a device session, computed once per input shape (stand-in device).

An exported transformer's Shape -> Gather -> Unsqueeze -> Concat -> Reshape chains and its Range-built
positions run on the host; once the feeds' shapes are fixed their results are too, so a signature's
first eager run keeps them and later runs skip those steps. Checked: outputs equal the cpu session's
with new feed values and alternating shapes; a Shape of a value whose shape depends on the feeds' values
is never kept; a profiled run still shows every node.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import opstrata.ops as ops
import opstrata.ops.testing as ot
from opstrata.runtime import InferenceSession, SessionOptions

if not hasattr(ot, "register_standin_device"):
    pytest.skip("opstrata-ops < 0.4.69 has no stand-in device for sessions", allow_module_level=True)

DEV = "_fold"


@pytest.fixture(autouse=True)
def stand_in():
    with ot.isolated_registry():  # the registry, the memories and the fallback report restored after
        ot.register_standin_device(DEV)
        yield


def _exporter_style_model() -> onnx.ModelProto:
    """y = relu(x.view(B, S, H, D)).view(B, S, H*D) + pos, with the view targets and the positions built
    from Shape / Gather / Unsqueeze / Concat / Range / Cast as torch.onnx's TorchScript exporter emits."""
    i64 = lambda name, v: helper.make_tensor(name, TensorProto.INT64, [len(v)], v)  # noqa: E731
    nodes = [
        helper.make_node("Shape", ["x"], ["shp"]),
        helper.make_node("Gather", ["shp", "i0"], ["b"], axis=0),
        helper.make_node("Gather", ["shp", "i1"], ["s"], axis=0),
        helper.make_node("Unsqueeze", ["b", "ax0"], ["b1"]),
        helper.make_node("Unsqueeze", ["s", "ax0"], ["s1"]),
        helper.make_node("Concat", ["b1", "s1", "heads", "dims"], ["t4"], axis=0),
        helper.make_node("Reshape", ["x", "t4"], ["x4"]),
        helper.make_node("Relu", ["x4"], ["r4"]),
        helper.make_node("Concat", ["b1", "s1", "minus1"], ["t3"], axis=0),
        helper.make_node("Reshape", ["r4", "t3"], ["r3"]),
        helper.make_node("Range", ["zero", "s", "one"], ["pos_i"]),
        helper.make_node("Cast", ["pos_i"], ["pos_f"], to=TensorProto.FLOAT),
        helper.make_node("Unsqueeze", ["pos_f", "ax1"], ["pos"]),
        helper.make_node("Add", ["r3", "pos"], ["y"]),
    ]
    inits = [
        helper.make_tensor("i0", TensorProto.INT64, [], [0]),
        helper.make_tensor("i1", TensorProto.INT64, [], [1]),
        i64("ax0", [0]), i64("ax1", [1]), i64("heads", [2]), i64("dims", [4]), i64("minus1", [-1]),
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("one", TensorProto.INT64, [], [1]),
    ]  # fmt: skip
    g = helper.make_graph(
        nodes, "exporter_style",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["B", "S", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["B", "S", 8])], inits,
    )  # fmt: skip
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def test_kept_steps_give_the_cpu_sessions_outputs_with_new_values_and_alternating_shapes():
    model = _exporter_style_model()
    dev, cpu = InferenceSession(model, device=DEV), InferenceSession(model)
    rng = np.random.default_rng(0)
    for b, s in [(2, 3), (1, 5), (2, 3), (1, 5), (3, 4), (2, 3)]:
        x = rng.standard_normal((b, s, 8)).astype(np.float32)
        np.testing.assert_allclose(
            dev.run(None, {"x": x})[0], cpu.run(None, {"x": x})[0], rtol=1e-6, atol=1e-6
        )
    kept = dev.device_folded_steps
    assert set(kept) == {((2, 3, 8),), ((1, 5, 8),), ((3, 4, 8),)}
    host = len(dev.host_nodes())
    assert all(k >= host for k in kept.values()), kept  # every host step (and the Shape) is skipped
    prog = dev._device_program
    for f in prog._folds.values():  # each value an executed step touches dies once, after its last reader
        touched = [{x for x in (*prog.steps[i][0].inputs, *prog.steps[i][0].outputs) if x} for i in f.order]
        freed = [x for xs in f.frees for x in xs]
        assert sorted(freed) == sorted(set().union(*touched) - set(prog.graph.outputs))
        for pos, xs in enumerate(f.frees):
            assert all(x in touched[pos] and not any(x in t for t in touched[pos + 1 :]) for x in xs)


def test_a_shape_that_follows_the_feeds_values_is_never_kept():
    """Shape(Reshape(x, target)) with ``target`` a feed: same input shapes, different values, different
    output; kept from the first run it would repeat [2, 3]."""
    nodes = [
        helper.make_node("Reshape", ["x", "target"], ["r"]),
        helper.make_node("Shape", ["r"], ["shape"]),
        helper.make_node("Relu", ["r"], ["y"]),
    ]
    g = helper.make_graph(
        nodes, "value_shaped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [6]),
         helper.make_tensor_value_info("target", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("shape", TensorProto.INT64, [2]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )  # fmt: skip
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    with ops.fallback_policy("allow"):
        dev = InferenceSession(model, device=DEV)
    x = np.arange(6, dtype=np.float32) - 2
    for target in ([2, 3], [3, 2], [1, 6], [2, 3]):
        shape, y = dev.run(None, {"x": x, "target": np.array(target, np.int64)})
        assert shape.tolist() == target and y.shape == tuple(target)
        np.testing.assert_array_equal(y, np.maximum(x, 0).reshape(target))


def test_profiled_runs_show_every_node_and_kept_steps_are_bounded_by_the_cache_size(tmp_path):
    model = _exporter_style_model()
    opts = SessionOptions(enable_profiling=True, profile_file_prefix=str(tmp_path / "p"))
    prof = InferenceSession(model, opts, device=DEV)
    x = np.ones((2, 3, 8), np.float32)
    for _ in range(3):
        prof.run(None, {"x": x})
    per_run = [sum(1 for e in prof._profiler.events if e.run == r) for r in range(3)]
    assert per_run == [len(prof.graph.nodes)] * 3
    small = InferenceSession(model, SessionOptions(plan_cache_size=2), device=DEV)
    for s in (1, 2, 3, 2):
        small.run(None, {"x": np.ones((1, s, 8), np.float32)})
    assert list(small._device_program.folded_steps()) == [((1, 3, 8),), ((1, 2, 8),)]
