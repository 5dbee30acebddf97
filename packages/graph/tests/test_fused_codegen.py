"""FusedElementwise through the ops code generator: fusion of arbitrary chains, codegen on cpu, step-by-step on ref."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.graph as og
from opstrata.graph.opdefs import fused as _fused
from opstrata.graph.passes.fuse_elementwise import _broadcasts_up
from opstrata.graph.passes.pattern import Matcher
from opstrata.ops import codegen as cg

TOL = {np.float16: (1e-2, 1e-2), np.float32: (1e-4, 1e-5), np.float64: (1e-10, 1e-12)}
UNARY = ["Exp", "Log", "Sqrt", "Tanh", "Erf", "Sigmoid", "Relu", "Neg", "Abs", "Reciprocal"]
BINARY = ["Add", "Sub", "Mul", "Div", "Pow"]
SAFE = {"Log", "Sqrt", "Reciprocal"}  # need a positive operand


class _Chain:
    """Builds a random elementwise graph whose values stay well conditioned (so tolerances are meaningful)."""

    def __init__(self, dt: type, out_shape: tuple[int, ...]) -> None:
        self.g = og.Graph("chain", opset_imports={"": 17})
        self.dt, self.out_shape = dt, out_shape
        self.pool: list[str] = []
        self.feeds: dict[str, np.ndarray] = {}
        self.unread: list[str] = []

    def input(self, shape: tuple[int, ...], rng: np.random.Generator) -> None:
        name = f"in{len(self.feeds)}"
        self.g.add_input(name, self.dt, shape)
        self.feeds[name] = rng.uniform(0.5, 1.5, shape).astype(self.dt)
        self.pool.append(name)

    def const(self, value: float, shape: tuple[int, ...]) -> str:
        name = self.g.fresh_name("k")
        self.g.add_initializer(name, np.full(shape, value, self.dt))
        return name

    def node(self, op: str, inputs: list[str]) -> str:
        out = self.g.fresh_name(op.lower())
        self.g.add_node(op, inputs, [out])
        for x in inputs:
            if x in self.unread:
                self.unread.remove(x)
        self.unread.append(out)
        return out

    def positive(self, x: str) -> str:
        """sigmoid(x) + 0.5, in (0.5, 1.5)."""
        return self.node("Add", [self.node("Sigmoid", [x]), self.const(0.5, ())])


@st.composite
def chains(draw: st.DrawFn) -> tuple[og.Graph, dict[str, np.ndarray], type, bool]:
    dt = draw(st.sampled_from([np.float32, np.float64, np.float16]))
    rank = draw(st.integers(1, 3))
    out_shape = tuple(draw(st.lists(st.integers(1, 6), min_size=rank, max_size=rank)))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    c = _Chain(dt, out_shape)
    for _ in range(draw(st.integers(1, 3))):  # broadcasting inputs: suffixes of out_shape with some 1s
        k = draw(st.integers(0, rank))
        shape = tuple(1 if draw(st.booleans()) and i > 0 else d for i, d in enumerate(out_shape[rank - k :]))
        c.input(shape, rng)
    c.input(out_shape, rng)
    for _ in range(draw(st.integers(2, 10))):
        op = draw(st.sampled_from(UNARY + BINARY))
        a = draw(st.sampled_from(c.pool[-4:] if draw(st.booleans()) else c.pool))
        if op in UNARY:
            a = c.positive(a) if op in SAFE else c.node("Tanh", [a]) if op == "Exp" else a
            c.pool.append(c.node(op, [a]))
            continue
        if draw(st.booleans()):  # a one-element constant: 0-d, (1,) or (1, 1)
            value = draw(st.sampled_from([2.0, 3.0, 0.5, -1.0, 1.7, 0.044715]))
            b = c.const(value, draw(st.sampled_from([(), (1,), (1, 1)])))
        else:
            b = draw(st.sampled_from(c.pool))
        if op == "Pow":
            a = c.positive(a)
            if b in c.g.initializers:  # x ** c: integer / half exponents become multiplications / sqrt
                pass
            else:
                b = c.node("Tanh", [b])  # bounded exponent
        if op == "Div":
            b = c.positive(b) if b not in c.g.initializers else b
        args = [b, a] if draw(st.booleans()) and op in ("Add", "Mul") else [a, b]
        c.pool.append(c.node(op, args))
    y = c.unread[0]
    for extra in c.unread[1:]:  # every step reaches the output: one group
        y = c.node("Add", [y, extra])
    c.g.add_node("Identity", [y], ["y"])
    c.g.outputs.append("y")
    side = draw(st.booleans()) and len(c.g.nodes) > 3
    if side:  # an intermediate that is also a graph output splits the group there
        mid = c.g.nodes[len(c.g.nodes) // 2].outputs[0]
        c.g.add_node("Identity", [mid], ["side"])
        c.g.outputs.append("side")
    og.infer_shapes(c.g)
    return c.g, c.feeds, dt, side


@settings(max_examples=60, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])
@given(chains())
def test_fused_chain_matches_unfused_on_cpu_and_ref(case) -> None:
    g, feeds, dt, side = case
    want = og.run_graph(g, feeds, "cpu")
    h = og.fuse_elementwise(g)
    og.infer_shapes(h)
    h.validate()
    fused = [n for n in h.nodes if n.op_type == "FusedElementwise"]
    assert len(h) < len(g)
    m = Matcher(g)
    repeated = any(
        _broadcasts_up(m, n.outputs[0], u.outputs[0]) for n in g.nodes for u in m.uses(n.outputs[0])
    )
    if not side and not repeated:  # (a value broadcast up by the next step starts a kernel of its own)
        assert len(fused) == 1 and h.op_counts().get("Identity") == 1  # the whole chain is one node
    rtol, atol = TOL[dt]
    for device in ("cpu", "ref"):
        got = og.run_graph(h, feeds, device)
        for k in want:
            assert got[k].dtype == want[k].dtype and got[k].shape == want[k].shape, (k, device)
            np.testing.assert_allclose(
                got[k].astype(np.float64), want[k].astype(np.float64), rtol=rtol, atol=atol, equal_nan=True,
                err_msg=f"{k} on {device}",
            )  # fmt: skip


def _gelu_tanh_graph(cube: str) -> og.Graph:
    """``h = mm + b``; 0.5 h (1 + tanh(sqrt(2/pi) (h + 0.044715 h^3))) with h^3 as x*x*x or Pow(h, 3)."""
    g = og.Graph("gelu", opset_imports={"": 17})
    g.add_input("mm", np.float32, ("batch", 16))
    g.add_initializer("b", np.linspace(-1, 1, 16, dtype=np.float32))
    for name, v in {
        "three": 3.0,
        "c": 0.044715,
        "k": math.sqrt(2 / math.pi),
        "one": 1.0,
        "half": 0.5,
    }.items():
        g.add_initializer(name, np.array(v, np.float32))
    g.add_node("Add", ["mm", "b"], ["h"])
    if cube == "pow":
        g.add_node("Pow", ["h", "three"], ["h3"])
    else:
        g.add_node("Mul", ["h", "h"], ["h2"])
        g.add_node("Mul", ["h2", "h"], ["h3"])
    g.add_node("Mul", ["h3", "c"], ["ch3"])
    g.add_node("Add", ["h", "ch3"], ["inner"])
    g.add_node("Mul", ["inner", "k"], ["scaled"])
    g.add_node("Tanh", ["scaled"], ["t"])
    g.add_node("Add", ["t", "one"], ["t1"])
    g.add_node("Mul", ["h", "half"], ["hh"])
    g.add_node("Mul", ["hh", "t1"], ["y"])
    g.outputs.append("y")
    og.infer_shapes(g)
    return g


@pytest.mark.parametrize("cube", ["mul", "pow"])
def test_shared_producer_inside_chain_is_fused_with_constants_folded(cube: str) -> None:
    g = _gelu_tanh_graph(cube)
    h = og.fuse_elementwise(g)
    assert len(h) == 1  # h = mm + b is read by four members, all inside the chain
    node = h.nodes[0]
    assert node.inputs == ["mm", "b"]
    want = [0.044715, math.sqrt(2 / math.pi), 1.0, 0.5] + [3.0] * (cube == "pow")
    assert sorted(node.attrs["consts"]) == sorted(float(np.float32(v)) for v in want)  # the exact fp32 values
    kernel = og.fused_kernel(node, np.float32)
    assert "power" not in kernel.source  # Pow(h, 3) became h*h*h
    x = np.random.default_rng(0).standard_normal((8, 16)).astype(np.float32) * 3
    want = og.run_graph(g, {"mm": x})["y"]
    np.testing.assert_allclose(og.run_graph(h, {"mm": x}, "cpu")["y"], want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(og.run_graph(h, {"mm": x}, "ref")["y"], want, rtol=1e-5, atol=1e-6)


def test_cpu_runs_the_generated_kernel_and_ref_steps(monkeypatch) -> None:
    h = og.fuse_elementwise(_gelu_tanh_graph("mul"))
    calls: list[str] = []
    real = _fused.run_fused
    monkeypatch.setattr(_fused, "run_fused", lambda n, x: calls.append(n.name) or real(n, x))
    x = np.ones((2, 16), np.float32)
    og.run_graph(h, {"mm": x}, "ref")
    assert calls == []
    before = cg.cache_info()["size"]
    og.run_graph(h, {"mm": x}, "cpu")
    og.run_graph(h, {"mm": x * 2}, "cpu")
    assert calls == [h.nodes[0].name] * 2 and cg.cache_info()["size"] <= before + 1  # compiled once


def _tanh_sigmoid_graph() -> og.Graph:
    """``h = mm + b``; y = tanh(h) * sigmoid(h) * h ** 3 (no level-2 pattern matches it)."""
    g = og.Graph("ts", opset_imports={"": 17})
    g.add_input("mm", np.float32, ("batch", 16))
    g.add_initializer("b", np.linspace(-1, 1, 16, dtype=np.float32))
    g.add_initializer("three", np.array(3.0, np.float32))
    g.add_node("Add", ["mm", "b"], ["h"])
    g.add_node("Tanh", ["h"], ["t"])
    g.add_node("Sigmoid", ["h"], ["s"])
    g.add_node("Pow", ["h", "three"], ["h3"])
    g.add_node("Mul", ["t", "s"], ["ts"])
    g.add_node("Mul", ["ts", "h3"], ["y"])
    g.outputs.append("y")
    og.infer_shapes(g)
    return g


def test_plan_binds_the_codegen_kernel_on_cpu_only() -> None:
    g = _tanh_sigmoid_graph()
    plan = og.compile(g, level=3, device="cpu")
    (b,) = [b for b in plan.bindings if b.op_type.endswith("FusedElementwise")]
    assert (b.kernel, b.path, b.is_fallback) == ("codegen", "codegen", False)
    assert plan.fallbacks == []
    node = next(n for n in plan.graph.nodes if n.op_type == "FusedElementwise")
    assert og.kernels_of(node, "cpu") == ["codegen"]
    ref = og.compile(g, level=3, device="ref")
    kernels = [b.kernel for b in ref.bindings if b.op_type.endswith("FusedElementwise")]
    assert "codegen" not in kernels and {"tanh", "sigmoid", "mul", "add", "pow"} <= set(kernels)
    x = np.random.default_rng(1).standard_normal((3, 16)).astype(np.float32)
    np.testing.assert_allclose(plan.run({"mm": x})["y"], ref.run({"mm": x})["y"], rtol=1e-5, atol=1e-6)


def test_constant_of_higher_rank_stays_an_input() -> None:
    g = og.Graph("rank", opset_imports={"": 17})
    g.add_input("x", np.float32, (4,))
    g.add_initializer("k", np.full((1, 1), 2.0, np.float32))  # raises the result to (1, 4)
    g.add_initializer("s", np.array(0.5, np.float32))
    g.add_node("Mul", ["x", "k"], ["a"])
    g.add_node("Add", ["a", "s"], ["y"])
    g.outputs.append("y")
    og.infer_shapes(g)
    h = og.fuse_elementwise(g)
    og.infer_shapes(h)
    assert h.nodes[0].inputs == ["x", "k"] and h.nodes[0].attrs["consts"] == [0.5]
    x = np.arange(4, dtype=np.float32)
    got, want = og.run_graph(h, {"x": x})["y"], og.run_graph(g, {"x": x})["y"]
    assert got.shape == want.shape == (1, 4) == h.value("y").shape
    np.testing.assert_array_equal(got, want)


def test_pow_base_constant_stays_an_input() -> None:
    g = og.Graph("powbase", opset_imports={"": 17})
    g.add_input("x", np.float32, (5,))
    g.add_initializer("two", np.array(2.0, np.float32))
    g.add_node("Neg", ["x"], ["n"])
    g.add_node("Pow", ["two", "n"], ["y"])
    g.outputs.append("y")
    og.infer_shapes(g)
    h = og.fuse_elementwise(g)
    assert h.nodes[0].inputs == ["x", "two"] and "consts" not in h.nodes[0].attrs
    x = np.linspace(-2, 2, 5, dtype=np.float32)
    np.testing.assert_allclose(og.run_graph(h, {"x": x})["y"], 2.0**-x, rtol=1e-6)


def test_bad_consts_are_clear_errors() -> None:
    g = og.Graph("bad")
    g.add_input("x", np.float32, (3,))
    g.add_node(
        "FusedElementwise", ["x"], ["y"], {"expr": [["Add", ["x0", "c1"]]], "consts": [1.0]},
        domain=og.OPSTRATA_DOMAIN,
    )  # fmt: skip
    g.outputs.append("y")
    with pytest.raises(og.GraphError, match=r"step 0 refers to 'c1'.*one of the 1 consts"):
        og.infer_shapes(g)
    g.nodes[0].attrs["consts"] = ["one"]
    with pytest.raises(og.GraphError, match="consts must be numbers"):
        og.infer_shapes(g)


def test_fused_export_with_consts_runs_in_onnxruntime() -> None:
    pytest.importorskip("onnx")
    pytest.importorskip("onnxruntime")
    from opstrata.graph.testing import ort_run

    g = _gelu_tanh_graph("pow")
    h = og.fuse_elementwise(g)
    og.infer_shapes(h)
    m = og.to_onnx(h)
    import onnx

    onnx.checker.check_model(m, full_check=True)
    x = np.random.default_rng(2).standard_normal((4, 16)).astype(np.float32)
    np.testing.assert_allclose(
        ort_run(m, {"mm": x})["y"], og.run_graph(g, {"mm": x})["y"], rtol=1e-4, atol=1e-5
    )


def test_groups_keep_one_dtype() -> None:
    """Pow(x32, e64): the float64 exponent chain and the float32 chain become two fused nodes."""
    g = og.Graph("mixed", opset_imports={"": 17})
    g.add_input("x", np.float32, (6,))
    g.add_input("e", np.float64, (6,))
    g.add_node("Abs", ["e"], ["ea"])
    g.add_node("Tanh", ["ea"], ["et"])
    g.add_node("Abs", ["x"], ["xa"])
    g.add_node("Pow", ["xa", "et"], ["p"])
    g.add_node("Neg", ["p"], ["y"])
    g.outputs.append("y")
    og.infer_shapes(g)
    h = og.fuse_elementwise(g)
    og.infer_shapes(h)
    fused = [n for n in h.nodes if n.op_type == "FusedElementwise"]
    assert len(h) == 2 and [h.value(n.outputs[0]).dtype for n in fused] == [np.float64, np.float32]
    feeds = {"x": np.linspace(-2, 2, 6, dtype=np.float32), "e": np.linspace(-1, 3, 6)}
    want = og.run_graph(g, feeds)["y"]
    for device in ("cpu", "ref"):
        got = og.run_graph(h, feeds, device)["y"]
        assert got.dtype == np.float32
        np.testing.assert_allclose(got, want, rtol=1e-6)
