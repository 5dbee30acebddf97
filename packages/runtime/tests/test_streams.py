"""Stream scheduler: bit-identical results for any stream count, a concurrency-safe arena, failures, shutdown."""

from __future__ import annotations

import gc
import itertools
import json
import threading
import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

import opstrata.ops as ops
import opstrata.runtime._allocator as _allocator_mod
import opstrata.runtime._arena as _arena_mod
import opstrata.runtime._executor as _executor_mod
import opstrata.runtime._session as _session_mod
import opstrata.runtime._streams as _streams_mod
from opstrata.graph import EXECUTOR_KERNELS as KERNELS
from opstrata.graph.testing import random_feeds
from opstrata.runtime import ExecutionError, InferenceSession, InvalidArgument, SessionOptions
from opstrata.runtime._streams import assign_streams
from opstrata.runtime.testing import DAG_KINDS, branches_model, random_dag_model

pytest.importorskip("onnx")


def _stream_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("opstrata-stream-")]


@pytest.fixture
def force_parallel(monkeypatch):
    """Make the scheduler spread nodes over streams even when its cost model says it does not pay."""
    monkeypatch.setattr(_streams_mod, "HANDOFF_NS", 0.0)
    monkeypatch.setattr(_streams_mod, "MIN_GAIN", -1e9)


@pytest.fixture(autouse=True)
def no_leaked_threads():
    before = set(_stream_threads())
    yield
    gc.collect()
    deadline = time.monotonic() + 5
    while set(_stream_threads()) - before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not set(_stream_threads()) - before, "a test leaked stream worker threads"


def _x_feeds(size: int = 64, batch: int = 32, seed: int = 0) -> dict[str, np.ndarray]:
    return {"x": np.random.default_rng(seed).standard_normal((batch, size), dtype=np.float32)}


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize("bad", [0, 65, -1, 2.0, True, "2", None])
def test_num_streams_is_validated(bad) -> None:
    with pytest.raises(InvalidArgument, match=r"num_streams must be an int in 1\.\.64, got .*Fix: use 1"):
        SessionOptions(num_streams=bad).validate()


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "1"])
def test_stream_timeout_is_validated(bad) -> None:
    with pytest.raises(InvalidArgument, match="stream_timeout_s must be a positive finite number"):
        SessionOptions(stream_timeout_s=bad).validate()


def test_valid_stream_options() -> None:
    assert SessionOptions(num_streams=64, stream_timeout_s=0.5).validate().num_streams == 64
    assert SessionOptions().num_streams == 1


# ---------------------------------------------------------------------------- assignment


def _reach(preds: list[list[int]], order: tuple[tuple[int, ...], ...]) -> list[set[int]]:
    """Steps that happen before each step (data edges + stream order), by plain graph search."""
    edges = {i: set(ps) for i, ps in enumerate(preds)}
    for o in order:
        for a, b in itertools.pairwise(o):
            edges[b].add(a)
    out: list[set[int]] = []
    for i in range(len(preds)):
        seen: set[int] = set()
        todo = list(edges[i])
        while todo:
            j = todo.pop()
            if j not in seen:
                seen.add(j)
                todo.extend(edges[j])
        out.append(seen)
    return out


@st.composite
def _dags(draw):
    n = draw(st.integers(1, 30))
    preds = [sorted(set(draw(st.lists(st.integers(0, i - 1), max_size=3)))) if i else [] for i in range(n)]
    costs = draw(st.lists(st.floats(1.0, 1e6), min_size=n, max_size=n))
    return preds, costs


@given(_dags(), st.integers(1, 6))
@settings(max_examples=150, deadline=None)
def test_assignment_is_a_valid_schedule(dag, num_streams: int) -> None:
    preds, costs = dag
    a = assign_streams(preds, costs, num_streams, handoff_ns=10.0, min_gain=-1e9)
    assert sorted(i for o in a.order for i in o) == list(range(len(preds)))
    for s, o in enumerate(a.order):
        assert all(a.stream_of[i] == s for i in o)
    reach = _reach(preds, a.order)
    for i in range(len(preds)):
        assert {j for j in range(len(preds)) if a.ancestors[i] >> j & 1} == reach[i]
        assert i not in reach[i]  # acyclic: the stream orders never contradict the data edges (no deadlock)
        for p in preds[i]:  # each cross-stream producer is awaited, directly or through a later one
            if a.stream_of[p] != a.stream_of[i]:
                assert any(w == p or p in reach[w] for w in a.waits[i] if a.stream_of[w] == a.stream_of[p])
        for w in a.waits[i]:
            assert a.stream_of[i] in a.notify[w]


def test_assignment_spreads_heavy_branches_and_keeps_chains_together() -> None:
    # 0 -> (1, 2, 3, 4 heavy, independent) -> 5
    preds = [[], [0], [0], [0], [0], [1, 2, 3, 4]]
    costs = [1e3, 1e7, 1e7, 1e7, 1e7, 1e3]
    a = assign_streams(preds, costs, 4)
    assert sorted(a.stream_of[1:5]) == [0, 1, 2, 3]
    assert a.makespan_ns < sum(costs) / 3
    chain = assign_streams([[], [0], [1], [2]], [1e7] * 4, 4)
    assert chain.streams_used == 1 and len(chain.order) == 4
    tiny = assign_streams(preds, [1e3] * 6, 4)  # hand-offs would cost more than they save
    assert tiny.streams_used == 1 and len(tiny.order) == 4 and tiny.order[0] == tuple(range(6))


def test_costs_follow_flops_and_bytes() -> None:
    from opstrata.runtime._streams import slot_shapes_from_plan, step_costs

    model = branches_model(branches=1, size=64, depth=1, batch=16)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    sch = sess._schedule
    mp = sess.plan.memory_for({"x": (16, 64)})
    shapes = slot_shapes_from_plan(sch, mp, [(16, 64)])
    assert shapes[sch.slot["x"]] == (16, 64)
    assert all(shapes[sch.slot[v]] == mp.shapes[v] for v in mp.shapes)
    costs = dict(zip((n.op_type for n in sess.graph.nodes), step_costs(sch, shapes), strict=True))
    # MatMul: 2*16*64*64 FLOPs at 20/ns + bytes; Tanh: 16*64 FLOPs + bytes; both + the 4 us node cost
    mm_bytes = (16 * 64 + 64 * 64 + 16 * 64) * 4
    assert costs["MatMul"] == pytest.approx(4000 + 2 * 16 * 64 * 64 / 20 + mm_bytes / 4)
    assert costs["MatMul"] > costs["Tanh"] > 4000


# ---------------------------------------------------------------------------- bit-identical results


def _check_memory_plan(sess: InferenceSession) -> None:
    """No two values that share arena bytes can be live at once under the stream assignment."""
    g = sess.graph
    ((key, prog),) = sess.stream_programs.items()
    arena = sess.arenas[key]
    if arena is None:
        return
    mp = arena.plan
    idx = {n.name: i for i, n in enumerate(g.nodes)}
    producer = {o: idx[n.name] for n in g.nodes for o in n.outputs}
    preds = [sorted({producer[x] for x in n.inputs if x in producer}) for n in g.nodes]
    reach = _reach(preds, prog.asg.order)
    root = {}  # alias -> the value whose bytes it views
    for n in g.nodes:
        for o in n.outputs:
            if o in arena.aliases:
                root[o] = root.get(n.inputs[0], n.inputs[0])
    acc: dict[str, set[int]] = {v: {producer[v]} for v in mp.offsets if v not in arena.aliases}
    for i, n in enumerate(g.nodes):
        for x in n.inputs:
            r = root.get(x, x)
            if r in acc:
                acc[r].add(i)
    outs = set(g.outputs) | {root.get(o, o) for o in g.outputs}
    vs = sorted(acc)
    for a in vs:
        for b in vs:
            if a >= b:
                continue
            (oa, sa), (ob, sb) = (mp.offsets[a], mp.sizes[a]), (mp.offsets[b], mp.sizes[b])
            if not (oa < ob + sb and ob < oa + sa):
                continue

            def before(u: str, v: str) -> bool:
                w = producer[v]
                return u not in outs and all(
                    x in reach[w] or (x == w and _inplace_of(mp, root, v, u)) for x in acc[u]
                )

            assert before(a, b) or before(b, a), f"'{a}' and '{b}' share bytes while both may be live"


def _inplace_of(mp, root: dict[str, str], v: str, u: str) -> bool:
    """``v`` was written in place over ``u``'s bytes (directly, or through views of ``u`` / a chain)."""
    while v in mp.inplace:
        v = root.get(mp.inplace[v], mp.inplace[v])
        if v == u:
            return True
    return False


@pytest.mark.parametrize("name", ["mlp", "cnn", "bert", "gpt"])
@pytest.mark.parametrize("level", [0, 3])
def test_test_models_bit_identical_for_any_stream_count(
    force_parallel, models, name: str, level: int
) -> None:
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    want = InferenceSession(model, SessionOptions(graph_optimization_level=level)).run(None, feeds)
    for n in (2, 3, 4):
        with InferenceSession(model, SessionOptions(graph_optimization_level=level, num_streams=n)) as sess:
            for _ in range(3):  # steady state: same arena, same events, reused
                got = sess.run(None, feeds)
                for w, g in zip(want, got, strict=True):
                    np.testing.assert_array_equal(g, w)
            (prog,) = sess.stream_programs.values()
            assert prog.parallel or name in ("mlp", "cnn")  # those two are single chains
            _check_memory_plan(sess)


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_allocator_mode_with_streams(force_parallel, models, name: str) -> None:
    model, dims = models[name]
    feeds = random_feeds(model, dims)
    want = InferenceSession(model).run(None, feeds)
    with InferenceSession(model, SessionOptions(enable_mem_arena=False, num_streams=3)) as sess:
        for _ in range(2):
            for w, g in zip(want, sess.run(None, feeds), strict=True):
                np.testing.assert_array_equal(g, w)
        assert list(sess.arenas.values()) == [None]
        stats = sess.allocator.stats()
        assert stats["num_alloc"] > 0 and stats["allocated_bytes"] == 0  # every block given back


_choice = st.tuples(st.sampled_from(DAG_KINDS), st.integers(0, 1000), st.integers(0, 1000))


@given(
    choices=st.lists(_choice, min_size=1, max_size=24),
    num_streams=st.integers(1, 5),
    cost_seed=st.integers(0, 2**16),
    arena=st.booleans(),
)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_dags_bit_identical(choices, num_streams: int, cost_seed: int, arena: bool) -> None:
    model = random_dag_model(choices)
    rng = np.random.default_rng(cost_seed)
    feeds = {k: rng.standard_normal((8, 8), dtype=np.float32) for k in ("x", "z")}
    opts = dict(graph_optimization_level=0, enable_mem_arena=arena)
    want = InferenceSession(model, SessionOptions(**opts)).run(None, feeds)

    def random_costs(schedule, shapes):  # a random assignment each example, not only the cost model's
        return list(rng.uniform(1.0, 1e5, len(schedule.steps)))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_session_mod, "step_costs", random_costs)
        mp.setattr(_streams_mod, "HANDOFF_NS", 0.0)
        mp.setattr(_streams_mod, "MIN_GAIN", -1e9)
        par = SessionOptions(**opts, num_streams=num_streams, stream_timeout_s=20, enable_profiling=True)
        with InferenceSession(model, par) as sess:
            for _ in range(2):
                got = sess.run(None, feeds)
                for w, g in zip(want, got, strict=True):
                    np.testing.assert_array_equal(g, w)
            if num_streams > 1:
                _check_memory_plan(sess)
            _check_events_respect_dependencies(sess)


def _check_events_respect_dependencies(sess: InferenceSession) -> None:
    """Observed: no node started before every producer of its inputs had finished (same run)."""
    producer = {o: n.name for n in sess.graph.nodes for o in n.outputs}
    for run in range(len(sess.profiler.runs)):
        ev = {e.name: e for e in sess.profiler.events if e.run == run}
        assert len(ev) == len(sess.graph.nodes)
        for n in sess.graph.nodes:
            for x in n.inputs:
                if x in producer:
                    p = ev[producer[x]]
                    assert p.start_ns + p.dur_ns <= ev[n.name].start_ns, (
                        f"'{n.name}' started before '{p.name}' ended"
                    )


def test_branches_run_on_different_streams() -> None:
    model = branches_model(branches=4, size=128, depth=2, batch=128)
    feeds = _x_feeds(128, 128)
    want = InferenceSession(model).run(None, feeds)[0]
    with InferenceSession(model, SessionOptions(num_streams=4)) as sess:  # the real cost model
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)
        (prog,) = sess.stream_programs.values()
        g = sess.graph
        mm = [i for i, n in enumerate(g.nodes) if n.op_type in ("MatMul", "Linear")]  # Linear: MatMul + Relu
        assert len({prog.asg.stream_of[i] for i in mm}) == 4
        assert len(_stream_threads()) == 4
        key = next(iter(sess.arenas))
        assert sess.arenas[key].nbytes >= sess.plan.memory_for({"x": key[0]}).arena_bytes


def test_small_model_stays_sequential(models) -> None:
    model, dims = models["mlp"]
    with InferenceSession(model, SessionOptions(num_streams=4)) as sess:
        sess.run(None, random_feeds(model, dims))
        (prog,) = sess.stream_programs.values()
        assert not prog.parallel  # the cost model says hand-offs cost more than they save
        assert _stream_threads() == []  # no worker was needed


@pytest.mark.parametrize("name", ["bert", "gpt", "branches"])
def test_stream_arena_layout_is_its_plan(force_parallel, models, name: str) -> None:
    if name == "branches":
        model, feeds = branches_model(branches=3, size=64, batch=32), _x_feeds()
    else:
        model, dims = models[name]
        feeds = random_feeds(model, dims)
    with InferenceSession(model, SessionOptions(num_streams=3)) as sess:
        sess.run(None, feeds)
        ((key, arena),) = sess.arenas.items()
        seq = sess.plan.memory_for(dict(zip([i.name for i in sess.get_inputs()], key, strict=True)))
        mp = arena.plan
        assert arena.nbytes == mp.arena_bytes == arena.buffer.nbytes
        assert 0 < mp.arena_bytes <= seq.no_reuse_bytes  # bytes are still reused (less than sequentially)
        for v, view in arena.views.items():
            start = view.__array_interface__["data"][0] - arena.buffer.__array_interface__["data"][0]
            assert start == mp.offsets[v] and view.shape == mp.shapes[v]
        _check_memory_plan(sess)


# ---------------------------------------------------------------------------- steady state


@pytest.mark.parametrize("name", ["bert", "gpt", "branches"])
def test_steady_state_run_allocates_only_outputs(force_parallel, monkeypatch, models, name: str) -> None:
    from test_arena import _CountingNumpy

    if name == "branches":
        model, feeds = branches_model(size=64, batch=32), _x_feeds()
    else:
        model, dims = models[name]
        feeds = random_feeds(model, dims)
    with InferenceSession(model, SessionOptions(num_streams=2)) as sess:
        sess.run(None, feeds)
        arena = next(iter(sess.arenas.values()))
        counter = _CountingNumpy()
        for mod in (_session_mod, _executor_mod, _arena_mod, _allocator_mod, _streams_mod):
            monkeypatch.setattr(mod, "np", counter)
        dom = np.lib.tracemalloc_domain
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, dom)])
            outs = sess.run(None, feeds)
            after = tracemalloc.take_snapshot().filter_traces([tracemalloc.DomainFilter(True, dom)])
        finally:
            tracemalloc.stop()
        assert counter.calls == ["array"] * len(outs)
        assert sum(d.size_diff for d in after.compare_to(before, "filename")) == sum(o.nbytes for o in outs)
        assert next(iter(sess.arenas.values())) is arena
        assert sess.allocator.stats()["num_alloc"] == 0


# ---------------------------------------------------------------------------- failures


def _patched_tanh(monkeypatch, target: str, behaviour):
    """Replace the Tanh kernel: ``behaviour(node, args)`` runs for node ``target``, the real kernel otherwise."""
    real = KERNELS[("", "Tanh")]

    def kernel(node, args):
        if node.name == target:
            return behaviour(node, args)
        return real(node, args)

    monkeypatch.setitem(KERNELS, ("", "Tanh"), kernel)


def _first_tanh(model) -> str:
    return next(n.name for n in model.graph.node if n.op_type == "Tanh")


def test_kernel_error_in_a_stream_names_the_node(force_parallel, monkeypatch) -> None:
    model = branches_model(branches=2, size=64, depth=3, batch=32)
    target = _first_tanh(model)
    calls = {"n": 0}

    def boom(node, args):
        calls["n"] += 1
        if calls["n"] == 1:
            raise FloatingPointError("simulated kernel fault")
        return [np.tanh(args[0])]

    _patched_tanh(monkeypatch, target, boom)
    feeds = _x_feeds()
    opts = SessionOptions(
        graph_optimization_level=0, num_streams=2, enable_profiling=True, stream_timeout_s=10
    )
    with InferenceSession(model, opts) as sess:
        t0 = time.monotonic()
        with pytest.raises(
            ExecutionError, match=rf"node '{target}' \(Tanh\): kernel .* FloatingPointError: simulated"
        ) as info:
            sess.run(None, feeds)
        assert time.monotonic() - t0 < 5
        assert isinstance(info.value.__cause__, FloatingPointError)
        ran = {e.name for e in sess.profiler.events if e.run == 0}
        assert target not in ran and "out" not in ran  # nothing downstream of the failure ran
        (failed,) = [n for n in sess.graph.nodes if n.name == target]
        readers = {n.name for n in sess.graph.nodes if set(n.inputs) & set(failed.outputs)}
        assert readers and not readers & ran
        # the session recovers: the next run (the kernel now works) is exact
        want = InferenceSession(model, SessionOptions(graph_optimization_level=0)).run(None, feeds)[0]
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)


def test_kernel_error_in_allocator_mode_returns_blocks(force_parallel, monkeypatch) -> None:
    model = branches_model(branches=2, size=64, depth=3, batch=32)

    def boom(node, args):
        raise FloatingPointError("simulated kernel fault")

    _patched_tanh(monkeypatch, _first_tanh(model), boom)
    opts = SessionOptions(
        graph_optimization_level=0, num_streams=2, enable_mem_arena=False, stream_timeout_s=10
    )
    with InferenceSession(model, opts) as sess:
        with pytest.raises(ExecutionError, match="simulated kernel fault"):
            sess.run(None, _x_feeds())
        assert sess.allocator.stats()["allocated_bytes"] == 0


def test_kernel_blocking_past_the_timeout_fails_the_run_without_spinning(force_parallel, monkeypatch) -> None:
    model = branches_model(branches=2, size=64, depth=2, batch=32)
    target = _first_tanh(model)
    release = threading.Event()

    def block(node, args):
        release.wait(30)  # bounded, so a broken test cannot hang the suite
        return [np.tanh(args[0])]

    _patched_tanh(monkeypatch, target, block)
    feeds = _x_feeds()
    sess = InferenceSession(
        model, SessionOptions(graph_optimization_level=0, num_streams=2, stream_timeout_s=1.0)
    )
    try:
        t0, cpu0 = time.monotonic(), time.process_time()
        with pytest.raises(
            ExecutionError,
            match=rf"node '{target}' \(Tanh\): still running on stream \d after .* stream_timeout_s",
        ):
            sess.run(None, feeds)
        waited, cpu = time.monotonic() - t0, time.process_time() - cpu0
        assert 0.9 <= waited < 5
        assert cpu < 0.5 * waited  # the caller and the waiting stream sleep on their conditions: no busy wait
        with pytest.raises(ExecutionError, match="from an earlier run that timed out"):
            sess.run(None, feeds)  # the kernel still writes into the arena: refuse to start
        release.set()
        want = InferenceSession(model, SessionOptions(graph_optimization_level=0)).run(None, feeds)[0]
        np.testing.assert_array_equal(sess.run(None, feeds)[0], want)  # it returned: runs work again
    finally:
        release.set()
        sess.close()
    assert _stream_threads() == []


def test_run_options_context_reaches_the_workers(force_parallel, monkeypatch) -> None:
    model = branches_model(branches=2, size=32, depth=1, batch=8)
    seen: list[str] = []

    def record(node, args):
        seen.append(ops.get_default_device())
        return [np.tanh(args[0])]

    for n in model.graph.node:
        if n.op_type == "Tanh":
            _patched_tanh(monkeypatch, n.name, record)
            break
    with InferenceSession(
        model, SessionOptions(graph_optimization_level=0, num_streams=2), device="ref"
    ) as sess:
        sess.run(None, _x_feeds(32, 8))
    assert seen == ["ref"]


# ---------------------------------------------------------------------------- shutdown


def test_close_and_context_manager_stop_the_workers(force_parallel) -> None:
    model = branches_model(branches=2, size=32, depth=1, batch=8)
    with InferenceSession(model, SessionOptions(num_streams=3)) as sess:
        sess.run(None, _x_feeds(32, 8))
        threads = _stream_threads()
        assert len(threads) == 3 and all(t.daemon for t in threads)
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(InvalidArgument, match="the session is closed"):
        sess.run(None, _x_feeds(32, 8))
    sess.close()  # idempotent


def test_collected_session_stops_its_workers(force_parallel) -> None:
    model = branches_model(branches=2, size=32, depth=1, batch=8)
    sess = InferenceSession(model, SessionOptions(num_streams=2))
    sess.run(None, _x_feeds(32, 8))
    threads = _stream_threads()
    assert len(threads) == 2
    del sess
    gc.collect()
    for t in threads:
        t.join(5)
    assert not any(t.is_alive() for t in threads)


# ---------------------------------------------------------------------------- profiler


def test_trace_has_one_track_per_stream(force_parallel, tmp_path) -> None:
    model = branches_model(branches=3, size=64, depth=2, batch=32)
    opts = SessionOptions(num_streams=3, enable_profiling=True)
    with InferenceSession(model, opts) as sess:
        sess.run(None, _x_feeds())
        sess.run(None, _x_feeds())
        (prog,) = sess.stream_programs.values()
        trace = json.loads(open(sess.end_profiling(tmp_path / "t.json")).read())
    ev = trace["traceEvents"]
    names = {e["tid"]: e["args"]["name"] for e in ev if e.get("name") == "thread_name"}
    assert names[0] == "session" and {names[1 + k] for k in range(3)} == {"stream 0", "stream 1", "stream 2"}
    idx = {n.name: i for i, n in enumerate(sess.graph.nodes)}
    nodes = [e for e in ev if e.get("ph") == "X" and e["cat"] != "session"]
    assert len(nodes) == 2 * len(idx)
    for e in nodes:
        k = prog.asg.stream_of[idx[e["name"]]]
        assert e["tid"] == 1 + k and e["args"]["stream"] == k
    assert len({e["tid"] for e in nodes}) == 3
    runs = [e for e in ev if e.get("cat") == "session"]
    assert len(runs) == 2 and all(e["tid"] == 0 for e in runs)
    # every cross-stream wait is a flow arrow: starts inside the producer's slice, ends at the consumer
    flows = [e for e in ev if e.get("cat") == "stream-event"]
    n_waits = sum(len(w) for w in prog.asg.waits)
    assert n_waits > 0 and len(flows) == 2 * 2 * n_waits
    by_id: dict[int, dict[str, dict]] = {}
    for e in flows:
        by_id.setdefault(e["id"], {})[e["ph"]] = e
    steps = {(e["args"]["run"], e["tid"]): [] for e in nodes}
    for e in nodes:
        steps[(e["args"]["run"], e["tid"])].append(e)
    for pair in by_id.values():
        s, f = pair["s"], pair["f"]
        assert s["tid"] != f["tid"] and s["ts"] < f["ts"]
        assert any(e["ts"] <= s["ts"] <= e["ts"] + e["dur"] for e in nodes if e["tid"] == s["tid"])
        assert any(e["ts"] == f["ts"] for e in nodes if e["tid"] == f["tid"])
    for r in runs:  # every node event of a run lies inside its span
        inside = [e for e in nodes if e["args"]["run"] == r["args"]["run"]]
        assert all(r["ts"] <= e["ts"] and e["ts"] + e["dur"] <= r["ts"] + r["dur"] + 1e-3 for e in inside)


def test_summary_has_time_per_stream(force_parallel) -> None:
    model = branches_model(branches=2, size=64, depth=2, batch=32)
    with InferenceSession(model, SessionOptions(num_streams=2, enable_profiling=True)) as sess:
        sess.run(None, _x_feeds())
        text = sess.profile_summary()
    assert "time per stream" in text and "stream 0 " in text and "stream 1 " in text
    assert "overlap (sum / wall)" in text
    with InferenceSession(model, SessionOptions(enable_profiling=True)) as seq:
        seq.run(None, _x_feeds())
        assert "time per stream" not in seq.profile_summary()
