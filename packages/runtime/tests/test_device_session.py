"""Sessions on a device with its own memory, on the CPU: a stand-in for cuda whose arrays are a
numpy subclass, running the cuda device's kernels (over numpy) with the runtime's device executor.

Checks what a GPU session relies on: device kernels only ever see device arrays, outputs equal the
cpu session's, nodes without a device kernel run on the host with their copies counted, the
``error`` policy refuses such a model at creation, and the onnxruntime ``providers=`` spelling.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import opstrata.ops as ops
import opstrata.ops.testing as ot
from opstrata.graph.testing import (
    bert_block_model,
    cnn_model,
    gpt_block_model,
    gpt_gqa_model,
    mlp_model,
    random_feeds,
)
from opstrata.runtime import InferenceSession, InvalidArgument, SessionOptions

if not hasattr(ops, "record_fallback") or not hasattr(ot, "register_standin_device"):
    pytest.skip("opstrata-ops < 0.4.69 has no stand-in device for sessions", allow_module_level=True)

DEV = "_stand"
DevArray = ot.StandInArray if hasattr(ot, "StandInArray") else np.ndarray


@pytest.fixture(autouse=True)
def stand_in():
    ot.register_standin_device(DEV)
    ops.reset_fallback_report()


def _same_as_cpu(model, dims, rtol=2e-5, atol=2e-5, **kw):
    feeds = random_feeds(model, dims)
    dev = InferenceSession(model, device=DEV, **kw)
    got = dev.run(None, feeds)
    want = InferenceSession(model).run(None, feeds)
    for g, w in zip(got, want, strict=True):
        assert type(g) is np.ndarray and g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    return dev


@pytest.mark.parametrize(
    ("model", "dims"),
    [
        (mlp_model(), {"batch": 3}),
        (cnn_model(), {"batch": 2}),
        (bert_block_model(), {"batch": 2, "seq": 5}),
        (gpt_block_model(), {"batch": 2, "seq": 6}),
        (gpt_gqa_model(), {"batch": 1, "seq": 7}),
    ],
    ids=["mlp", "cnn", "bert", "gpt", "gqa"],
)
def test_outputs_equal_the_cpu_session(model, dims):
    sess = _same_as_cpu(model, dims)
    report = ops.fallback_report()
    host = sess.device_fallbacks()
    assert report.count(device=DEV) == len(host)  # one audited fallback per host node per run
    for h in host:
        assert h.reason, h


def test_mlp_runs_wholly_on_the_device():
    sess = _same_as_cpu(mlp_model(), {"batch": 4})
    assert sess.device_fallbacks() == []
    assert ops.fallback_report().total == 0


def test_host_nodes_are_counted_with_their_copies():
    ops.unregister("softmax", device=DEV)  # the MLP's last node now has no device kernel
    ops.set_fallback_policy("allow")
    sess = _same_as_cpu(mlp_model(), {"batch": 4})
    (h,) = sess.device_fallbacks()
    assert h.op_type == "Softmax" and "softmax" in h.reason and "decomposition" in h.reason
    (rec,) = ops.fallback_report().records
    assert (rec.op, rec.device, rec.path, rec.count) == ("Softmax", DEV, "device:cpu", 1)
    assert (
        rec.bytes_copied == 4 * 8 * 4
    )  # its (4, 8) float32 input brought down; its result stays on the host


def test_error_policy_refuses_the_model_at_creation():
    opts = SessionOptions(fallback_policy="error")
    InferenceSession(mlp_model(), opts, device=DEV)  # wholly on the device: nothing to refuse
    gpt = InferenceSession(gpt_block_model(), opts, device=DEV)  # Shape / Range / int Gather: host by design
    assert gpt.device_fallbacks() == []
    ops.unregister("softmax", device=DEV)  # a float kernel missing on the device
    with pytest.raises(
        ops.FallbackError, match=r"1 node\(s\).*softmax \(Softmax, float32\): ops.softmax on _stand"
    ):
        InferenceSession(mlp_model(), opts, device=DEV)


def test_integer_shape_work_stays_on_the_host_without_being_a_fallback():
    model = gpt_block_model()
    sess = _same_as_cpu(model, {"batch": 2, "seq": 6})
    host = sess.host_nodes()
    assert {h.op_type for h in host} == {"Gather", "Range"} and not any(h.fallback for h in host)
    assert ops.fallback_report().total == 0


def test_run_on_device_takes_and_returns_device_arrays():
    model = mlp_model()
    feeds = random_feeds(model, {"batch": 2})
    sess = InferenceSession(model, device=DEV)
    (out,) = sess.run_on_device(None, {k: v.view(DevArray) for k, v in feeds.items()})
    assert isinstance(out, DevArray)
    np.testing.assert_allclose(
        np.asarray(out), InferenceSession(model).run(None, feeds)[0], rtol=2e-5, atol=2e-6
    )
    with pytest.raises(InvalidArgument, match="computes in host memory"):
        InferenceSession(model).run_on_device(None, feeds)
    with pytest.raises(InvalidArgument, match="feeds must name exactly the inputs"):
        sess.run_on_device(None, {})


def test_providers_spelling():
    model = mlp_model()
    assert InferenceSession(model, providers=[DEV]).device == DEV
    assert InferenceSession(model, providers=["CPUExecutionProvider"]).device == "cpu"
    assert InferenceSession(model, providers=[("CPUExecutionProvider", {})]).device == "cpu"
    with pytest.raises(InvalidArgument, match="both device= and providers="):
        InferenceSession(model, device="cpu", providers=["CPUExecutionProvider"])
    with pytest.raises(InvalidArgument, match="non-empty list"):
        InferenceSession(model, providers=[])


@pytest.mark.skipif("cuda" in ops.list_devices(), reason="a GPU is visible here")
def test_cuda_provider_without_a_gpu_says_why():
    model = mlp_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sess = InferenceSession(model, providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
    assert sess.device == "cpu"
    assert any("CUDAExecutionProvider skipped" in str(w.message) for w in caught)
    with pytest.raises(
        InvalidArgument, match="no listed provider is usable here: CUDAExecutionProvider skipped"
    ):
        InferenceSession(model, providers=["CUDAExecutionProvider"])
    with pytest.raises(InvalidArgument, match="'cuda' is not available here"):
        InferenceSession(model, device="cuda")


def test_profiling_a_device_session_records_every_node_with_its_placement(tmp_path):
    import json

    ops.unregister("softmax", device=DEV)  # one float node on the host
    ops.set_fallback_policy("allow")
    model = mlp_model()
    sess = InferenceSession(model, SessionOptions(enable_profiling=True), device=DEV)
    sess.run(None, random_feeds(model, {"batch": 2}))
    events = sess.profiler.events
    assert [e.name for e in events] == [n.name for n in sess.graph.nodes]
    by = {e.op_type: e for e in events}
    assert by["Softmax"].device == "cpu" and by["Softmax"].fallback and by["Softmax"].kernels == ("host",)
    assert by["Linear"].device == DEV and not by["Linear"].fallback and by["Linear"].kernels == ("linear",)
    assert all(e.dur_ns > 0 and e.run == 0 for e in events)
    path = sess.end_profiling(str(tmp_path / "trace.json"))
    trace = json.loads(open(path, encoding="utf-8").read())
    assert sum(1 for e in trace["traceEvents"] if e.get("ph") == "X") >= len(events)
    assert "Softmax" in sess.profile_summary()


def test_float_casts_run_on_the_device_and_other_casts_on_the_host():
    import onnx
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    z = helper.make_tensor_value_info("z", TensorProto.INT32, [2, 3])
    nodes = [
        helper.make_node("Cast", ["x"], ["h"], to=TensorProto.BFLOAT16, name="down"),
        helper.make_node("Relu", ["h"], ["r"], name="relu"),
        helper.make_node("Cast", ["r"], ["y"], to=TensorProto.FLOAT, name="up"),
        helper.make_node("Cast", ["x"], ["z"], to=TensorProto.INT32, name="to_int"),
    ]
    model = helper.make_model(
        helper.make_graph(nodes, "casts", [x], [y, z]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.checker.check_model(model)
    ops.set_fallback_policy("allow")
    sess = _same_as_cpu(model, {}, rtol=1e-2, atol=1e-2)
    assert [(h.node, h.fallback) for h in sess.host_nodes()] == [("to_int", True)]
    assert "casts to int32 run on the host" in sess.host_nodes()[0].reason


def test_scalar_initializers_keep_their_rank_on_the_device():
    """A 0-d index (x[:, 0] as Gather(axis=1) of a scalar constant) stays 0-d when uploaded."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])
    idx = numpy_helper.from_array(np.array(0, np.int64), "zero")
    node = helper.make_node("Gather", ["x", "zero"], ["y"], axis=1, name="first")
    model = helper.make_model(
        helper.make_graph([node], "g", [x], [y], [idx]), opset_imports=[helper.make_opsetid("", 17)]
    )
    onnx.checker.check_model(model)
    sess = _same_as_cpu(model, {})
    assert sess.device_fallbacks() == [] and sess.host_nodes() == []


def test_a_device_session_keeps_no_host_copies_of_its_weights_and_still_checks_output_names():
    model = gpt_block_model()
    feeds = random_feeds(model, {"batch": 2, "seq": 6})
    sess = InferenceSession(model, device=DEV)
    assert sess._schedule is None  # no cpu Schedule: no prepacked (host) GEMM weights the device never reads
    names = [o.name for o in sess.get_outputs()]
    want = InferenceSession(model).run(None, feeds)
    got = sess.run(list(reversed(names)), feeds)
    for g, w in zip(got, reversed(want), strict=True):
        np.testing.assert_allclose(g, w, rtol=2e-5, atol=2e-5)
    with pytest.raises(InvalidArgument, match=r"unknown output name\(s\) \['nope'\]"):
        sess.run(["nope"], feeds)
    with pytest.raises(InvalidArgument, match="must be a list of names"):
        sess.run(names[0], feeds)


def _device_windows() -> bool:
    """This opstrata-graph resolves conv / pool windows for the device (conv_geometry), and these ops pool there."""
    try:
        from opstrata.graph.opdefs.conv import conv_geometry  # noqa: F401
    except ImportError:
        return False
    return ops.dispatch_path("avg_pool2d", DEV, "float32") == "native"


def test_the_cnn_runs_wholly_on_the_device_average_pooling_included():
    if not _device_windows():
        pytest.skip("older opstrata-graph / -ops: convolutions or average pooling stay on the host")
    sess = _same_as_cpu(cnn_model(), {"batch": 2})
    assert "AveragePool" in {n.op_type for n in sess.graph.nodes}
    assert sess.host_nodes() == [] and ops.fallback_report().total == 0
