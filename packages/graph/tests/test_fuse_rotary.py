"""fuse_rotary: the exporters' rotate-half RoPE (Slice, Slice, Neg, Concat, Mul, Mul, Add) -> RotaryHalf,
in either operand order, with symbolic batch / sequence dims; numerics and the ONNX export agree with
onnxruntime on the original; near misses stay unfused."""

from __future__ import annotations

import numpy as np
import pytest

import opstrata.graph as og
from opstrata.graph.testing import ModelBuilder, ort_run

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

_BIG = 9223372036854775807  # the dynamo exporter's "to the end"


def _rope_model(*, swap: bool = False, lo_end: int = 4, hi_start: int = 4, cos_batch: str | int = 1,
                share_rot: bool = False, inverse: bool = False):  # fmt: skip
    b = ModelBuilder("rope", 17)
    x = b.input("x", ["batch", 4, "seq", 8])
    cos = b.input("cos", [cos_batch, 1, "seq", 8])
    sin = b.input("sin", [1, 1, "seq", 8])
    x1 = b.op("Slice", [x, b.ints([0]), b.ints([lo_end]), b.ints([3])])
    x2 = b.op("Slice", [x, b.ints([hi_start]), b.ints([_BIG]), b.ints([-1])])
    rot = b.op("Concat", [x2, b.op("Neg", [x1])] if inverse else [b.op("Neg", [x2]), x1], axis=-1)
    a = b.op("Mul", [cos, x] if swap else [x, cos])
    r = b.op("Mul", [sin, rot] if swap else [rot, sin])
    b.nodes.append(b.onnx.helper.make_node("Add", [r, a] if swap else [a, r], ["y"]))
    b.output("y")
    if share_rot:  # rotate_half(x) also read outside the pattern
        b.nodes.append(b.onnx.helper.make_node("Identity", [rot], ["rot_out"]))
        b.output("rot_out")
    return b.build()


def _feeds(batch: int = 2, seq: int = 5, cos_batch: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    ang = rng.standard_normal((cos_batch, 1, seq, 8)).astype(np.float32)
    return {
        "x": rng.standard_normal((batch, 4, seq, 8)).astype(np.float32),
        "cos": np.cos(ang), "sin": np.sin(ang[:1]),
    }  # fmt: skip


@pytest.mark.parametrize("swap", [False, True])
def test_rotate_half_becomes_one_node_with_the_same_bits(swap: bool) -> None:
    model = _rope_model(swap=swap)
    g = og.from_onnx(model)
    h = og.optimize(g, 2)[0]
    counts = h.op_counts()
    assert counts == {"ai.opstrata::RotaryHalf": 1}, counts
    feeds = _feeds()
    want = ort_run(model, feeds)["y"]
    np.testing.assert_array_equal(og.run_graph(h, feeds)["y"], og.run_graph(g, feeds)["y"])
    np.testing.assert_allclose(og.run_graph(h, feeds)["y"], want, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(ort_run(og.to_onnx(h), feeds)["y"], want, rtol=1e-6, atol=1e-6)
    assert og.optimize(g, 2)[1].matched("fuse_rotary") == 1


def test_per_batch_cos_is_fused_too() -> None:
    model = _rope_model(cos_batch="batch")
    h = og.optimize(og.from_onnx(model), 2)[0]
    assert h.op_counts().get("ai.opstrata::RotaryHalf") == 1
    feeds = _feeds(batch=3, cos_batch=3)
    np.testing.assert_allclose(og.run_graph(h, feeds)["y"], ort_run(model, feeds)["y"], rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "kw",
    [{"lo_end": 3, "hi_start": 3}, {"inverse": True}, {"share_rot": True}],
    ids=["not-halves", "inverse-rotation", "rot-read-elsewhere"],
)
def test_near_misses_stay_unfused(kw: dict) -> None:
    model = _rope_model(**kw)
    h = og.optimize(og.from_onnx(model), 2)[0]
    assert "ai.opstrata::RotaryHalf" not in h.op_counts()
    feeds = _feeds()
    got, want = og.run_graph(h, feeds), ort_run(model, feeds)
    for k in want:
        np.testing.assert_allclose(got[k], want[k], rtol=1e-6, atol=1e-6)
