"""Threads like onnxruntime: intra/inter-op options, OPSTRATA_NUM_THREADS, the per-run BLAS limit and its
restoration, streams x intra-op, small GEMMs on fewer threads, thread settings in profiles."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np
import pytest

import opstrata.runtime._streams as _streams_mod
import opstrata.runtime._threads as _threads_mod
from opstrata.graph import EXECUTOR_KERNELS as KERNELS, Node
from opstrata.graph.testing import ModelBuilder, mlp_model, random_feeds
from opstrata.runtime import (
    ExecutionError,
    InferenceSession,
    InvalidArgument,
    SessionOptions,
    ThreadSettings,
    physical_cores,
    thread_info,
)
from opstrata.runtime._blas import BLAS
from opstrata.runtime._gemm_threads import ThreadPlan, gemm_call_flops, thread_plan
from opstrata.runtime.testing import branches_model

pytest.importorskip("onnx")
threadpoolctl = pytest.importorskip("threadpoolctl")

ENV = "OPSTRATA_NUM_THREADS"


def _blas_now() -> int:
    """The BLAS thread count threadpoolctl's public API reports now (first BLAS library)."""
    return next(p["num_threads"] for p in threadpoolctl.threadpool_info() if p["user_api"] == "blas")


needs_blas = pytest.mark.skipif(not BLAS.available, reason="threadpoolctl finds no BLAS library to limit")


@pytest.fixture(autouse=True)
def blas_left_as_found():
    """Every test leaves the process's BLAS thread count as it found it."""
    before = BLAS.current()
    yield
    assert BLAS.current() == before, "a test (or the session) leaked a BLAS thread count"


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


@pytest.fixture
def every_gemm_parallel(monkeypatch):
    """Make the small-GEMM rule give every GEMM the full count (1 FLOP per thread)."""
    monkeypatch.setattr(_threads_mod, "GEMM_MIN_FLOPS_PER_THREAD", 1)


def _recording(monkeypatch, op: str = "Relu", fail: bool = False) -> list[int]:
    """Replace ``op``'s kernel by one recording the BLAS count while it runs (optionally then raising)."""
    seen: list[int] = []
    real = KERNELS[("", op)]

    def kernel(node, args):
        seen.append(_blas_now())
        if fail:
            raise RuntimeError("boom")
        return real(node, args)

    monkeypatch.setitem(KERNELS, ("", op), kernel)
    return seen


def _two_gemm_model(big: int = 512, small_out: int = 4, batch: int = 64):
    """x[batch, big] -MatMul(big x big: 2*64*512*512 = 33.6 MFLOP)- Relu -MatMul(big x 4: 0.26 MFLOP)- Sigmoid."""
    b = ModelBuilder("two_gemms", 17, 0)
    x = b.input("x", [batch, big])
    h = b.op("Relu", [b.op("MatMul", [x, b.weight([big, big])])])
    y = b.op("Sigmoid", [b.op("MatMul", [h, b.weight([big, small_out])])])
    b.nodes.append(b.onnx.helper.make_node("Identity", [y], ["y"], name="out"))
    b.output("y")
    return b.build()


# ---------------------------------------------------------------------------- options


@pytest.mark.parametrize("bad", [-1, 1025, 2.0, True, "2", None])
def test_intra_op_num_threads_is_validated(bad) -> None:
    with pytest.raises(
        InvalidArgument, match=rf"intra_op_num_threads must be an int in 0\.\.1024, got {bad!r}.*Fix: use 0"
    ):
        SessionOptions(intra_op_num_threads=bad).validate()


@pytest.mark.parametrize("bad", [-1, 65, 1.5, True, "2", None])
def test_inter_op_num_threads_is_validated(bad) -> None:
    with pytest.raises(InvalidArgument, match=r"inter_op_num_threads must be an int in 0\.\.64 .*Fix: use 0"):
        SessionOptions(inter_op_num_threads=bad).validate()


def test_bad_thread_options_fail_at_session_creation(models) -> None:
    with pytest.raises(InvalidArgument, match="intra_op_num_threads"):
        InferenceSession(models["mlp"][0], SessionOptions(intra_op_num_threads=-2))


def test_num_streams_is_an_alias_of_inter_op_num_threads() -> None:
    assert SessionOptions().num_streams == 1 and SessionOptions().inter_op_num_threads == 0
    assert SessionOptions(num_streams=3).inter_op_num_threads == 3
    assert SessionOptions(inter_op_num_threads=2).num_streams == 2
    assert SessionOptions(num_streams=2, inter_op_num_threads=2).num_streams == 2  # agreeing: fine
    opts = SessionOptions()
    opts.num_streams = 4
    assert opts.inter_op_num_threads == 4
    opts.inter_op_num_threads = 5
    assert opts.num_streams == 5
    assert SessionOptions(num_streams=2) == SessionOptions(inter_op_num_threads=2)
    kept = dataclasses.replace(SessionOptions(num_streams=3), enable_profiling=True)
    assert kept.num_streams == 3 and kept.enable_profiling
    # eval's zoo runner looks the new options up as dataclass fields
    names = {f.name for f in dataclasses.fields(SessionOptions)}
    assert {"intra_op_num_threads", "inter_op_num_threads"} <= names


def test_alias_errors_name_the_option_used() -> None:
    with pytest.raises(
        InvalidArgument, match=r"num_streams=3 and inter_op_num_threads=2 disagree.*Fix: pass only"
    ):
        SessionOptions(num_streams=3, inter_op_num_threads=2)
    with pytest.raises(InvalidArgument, match=r"num_streams must be an int in 1\.\.64, got 0"):
        SessionOptions(num_streams=0).validate()
    opts = SessionOptions(num_streams=0)
    opts.inter_op_num_threads = 0  # the new name: 0 is valid (sequential)
    assert opts.validate().num_streams == 1


# ---------------------------------------------------------------------------- resolution


def test_default_is_the_physical_cores(no_env, models) -> None:
    t = InferenceSession(models["mlp"][0]).threads
    assert (t.intra_op, t.inter_op, t.source) == (physical_cores(), 1, "physical cores")


def test_env_replaces_the_default_but_not_an_explicit_option(monkeypatch, models) -> None:
    monkeypatch.setenv(ENV, "3")
    model = models["mlp"][0]
    t = InferenceSession(model).threads
    assert (t.intra_op, t.source) == (3, ENV)
    t = InferenceSession(model, SessionOptions(intra_op_num_threads=1)).threads
    assert (t.intra_op, t.source) == (1, "intra_op_num_threads")
    monkeypatch.setenv(ENV, "  ")
    assert InferenceSession(model).threads.source == "physical cores"  # empty: unset


@pytest.mark.parametrize("bad", ["0", "-1", "two", "1.5"])
def test_bad_env_value_is_named(monkeypatch, models, bad) -> None:
    monkeypatch.setenv(ENV, bad)
    with pytest.raises(
        InvalidArgument, match=rf"environment variable {ENV}: expected an int >= 1.*got '{bad}'.*Fix:"
    ):
        InferenceSession(models["mlp"][0])
    InferenceSession(models["mlp"][0], SessionOptions(intra_op_num_threads=1))  # explicit: env not read


def test_physical_cores_counts_smt_siblings_once(monkeypatch, tmp_path) -> None:
    assert (
        1 <= physical_cores() <= (len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 4096)
    )
    # fake sysfs: 4 usable CPUs, cpu0/cpu1 and cpu2/cpu3 SMT siblings on one package -> 2 cores
    for cpu, core in enumerate([0, 0, 1, 1]):
        topo = tmp_path / f"cpu{cpu}" / "topology"
        topo.mkdir(parents=True)
        (topo / "core_id").write_text(f"{core}\n")
        (topo / "physical_package_id").write_text("0\n")
    monkeypatch.setattr(_threads_mod, "_SYSFS_CPU", tmp_path)
    monkeypatch.setattr(_threads_mod, "_usable_cpus", lambda: {0, 1, 2, 3})
    _threads_mod.physical_cores.cache_clear()
    try:
        assert _threads_mod.physical_cores() == 2
        monkeypatch.setattr(_threads_mod, "_usable_cpus", lambda: {0, 2})  # affinity: one CPU per core
        _threads_mod.physical_cores.cache_clear()
        assert _threads_mod.physical_cores() == 2
        monkeypatch.setattr(_threads_mod, "_usable_cpus", lambda: {0, 1, 2, 3, 4})  # cpu4: no topology
        _threads_mod.physical_cores.cache_clear()
        assert _threads_mod.physical_cores() == 5  # falls back to the usable CPU count
    finally:
        _threads_mod.physical_cores.cache_clear()


def test_streams_times_intra_op_rule() -> None:
    def s(intra: int, inter: int) -> ThreadSettings:
        return ThreadSettings(intra, inter, "test", 2_500_000)

    assert [s(8, 3).per_stream, s(8, 2).per_stream, s(2, 4).per_stream, s(1, 1).per_stream] == [2, 4, 1, 1]
    assert s(8, 2).as_dict()["blas_threads_per_stream"] == 4
    assert s(8, 1).as_dict()["blas_threads_per_stream"] == 8


# ---------------------------------------------------------------------------- the per-run BLAS limit


@needs_blas
@pytest.mark.parametrize("mode", ["bound", "profiled", "allocator"])
@pytest.mark.parametrize(("baseline", "intra"), [(2, 1), (1, 2)])
def test_a_run_limits_blas_and_restores_it(monkeypatch, every_gemm_parallel, mode, baseline, intra) -> None:
    seen = _recording(monkeypatch)
    model = mlp_model(d_in=64, hidden=256, d_out=64)
    opts = SessionOptions(
        graph_optimization_level=0, intra_op_num_threads=intra,
        enable_profiling=mode == "profiled", enable_mem_arena=mode != "allocator",
    )  # fmt: skip
    sess = InferenceSession(model, opts)
    feeds = random_feeds(model, {"batch": 8})
    with threadpoolctl.threadpool_limits(limits=baseline, user_api="blas"):
        assert _blas_now() == baseline
        sess.run(None, feeds)
        sess.run(None, feeds)
        assert _blas_now() == baseline, "the run left its own count behind"
    assert seen == [intra, intra]


@needs_blas
def test_the_limit_is_restored_when_the_run_raises(monkeypatch, every_gemm_parallel) -> None:
    seen = _recording(monkeypatch, fail=True)
    model = mlp_model()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, intra_op_num_threads=1))
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        with pytest.raises(ExecutionError, match="RuntimeError: boom"):
            sess.run(None, random_feeds(model, {"batch": 2}))
        assert _blas_now() == 2
    assert seen == [1]


@needs_blas
def test_overlapping_limits_restore_the_first_runs_count() -> None:
    with threadpoolctl.threadpool_limits(limits=2, user_api="blas"):
        a = BLAS.enter(1)
        b = BLAS.enter(2)  # a second run starts meanwhile (last starter wins)
        assert _blas_now() == 2
        BLAS.exit(a)  # the first run ends first: the second keeps running at its count
        assert _blas_now() == 2
        BLAS.exit(b)
        assert _blas_now() == 2  # the count found before either run
        outer = BLAS.enter(1)
        inner = BLAS.enter(2)  # nested (a custom op running another session)
        BLAS.exit(inner)
        assert _blas_now() == 1  # the outer run continues at its own count
        BLAS.exit(outer)
        assert _blas_now() == 2


def test_blas_libraries_are_rescanned_after_imports() -> None:
    import sys

    BLAS._modules = -1  # as if modules were imported since the last scan
    BLAS.refresh_if_imported()
    assert BLAS._modules == len(sys.modules)
    libs = BLAS._libs
    BLAS.refresh_if_imported()  # nothing imported since: the same handles, no rescan
    assert BLAS._libs is libs


@needs_blas
def test_parallel_streams_get_intra_over_inter_threads(monkeypatch, every_gemm_parallel) -> None:
    monkeypatch.setattr(_streams_mod, "HANDOFF_NS", 0.0)  # spread nodes over the streams
    monkeypatch.setattr(_streams_mod, "MIN_GAIN", -1e9)
    seen = _recording(monkeypatch, "Tanh")
    model = branches_model(branches=2, size=64, depth=2, batch=32)
    feeds = {"x": np.random.default_rng(0).standard_normal((32, 64), dtype=np.float32)}
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        for intra, expect in [(4, 2), (2, 1), (3, 1)]:
            seen.clear()
            opts = SessionOptions(
                graph_optimization_level=0, intra_op_num_threads=intra, inter_op_num_threads=2
            )
            with InferenceSession(model, opts) as sess:
                sess.run(None, feeds)
                assert next(iter(sess.stream_programs.values())).parallel
                assert sess.threads.per_stream == expect
            assert seen and set(seen) == {expect}, (intra, seen)
            assert _blas_now() == 1


# ---------------------------------------------------------------------------- small GEMMs


def test_gemm_call_flops() -> None:
    mm = Node("MatMul", ["a", "b"], ["y"], {}, "m")
    assert gemm_call_flops(mm, [(4, 8, 16), (16, 32)], [(4, 8, 32)]) == 2 * 4 * 8 * 16 * 32  # one flat GEMM
    assert (
        gemm_call_flops(mm, [(2, 4, 8, 16), (2, 4, 16, 8)], [(2, 4, 8, 8)]) == 2 * 8 * 8 * 16
    )  # per batch entry
    assert gemm_call_flops(mm, [(4, 16), None], [(4, 8)]) is None  # a shape unknown
    gemm = Node("Gemm", ["a", "b", "c"], ["y"], {"transA": 1}, "g")
    assert gemm_call_flops(gemm, [(16, 4), (16, 8), (8,)], [(4, 8)]) == 2 * 4 * 8 * 16 + 32
    lin = Node("Linear", ["x", "w"], ["y"], {}, "l", domain="ai.opstrata")
    assert gemm_call_flops(lin, [(4, 16), (8, 16)], [(4, 8)]) == 2 * 4 * 8 * 16
    assert gemm_call_flops(Node("Relu", ["a"], ["y"], {}, "r"), [(4, 4)], [(4, 4)]) is None


def _steps(*flops_shapes):
    """Fake schedule steps: one MatMul [1, k] @ [k, 1] per k (2k FLOPs), or a Relu for None."""

    class Step:
        def __init__(self, node, ins, outs):
            self.node, self.ins, self.outs = node, ins, outs

    steps, shapes = [], []
    for k in flops_shapes:
        base = len(shapes)
        if k is None:
            shapes += [(1, 1), (1, 1)]
            steps.append(Step(Node("Relu", ["a"], ["y"], {}, "r"), [base], [base + 1]))
        else:
            shapes += [(1, k), (k, 1), (1, 1)]
            steps.append(Step(Node("MatMul", ["a", "b"], ["y"], {}, "m"), [base, base + 1], [base + 2]))
    return steps, shapes


def test_thread_plan_switches_only_where_the_count_changes() -> None:
    cfg = ThreadSettings(4, 1, "test", 100)  # 2k FLOPs per MatMul: k=50 -> 1 thread, k=200 -> 4 (capped)
    steps, shapes = _steps(50, None, 200, 150, None, 50, 50)
    assert thread_plan(steps, shapes, cfg, parallel=False) == ThreadPlan(1, {2: 4, 3: 3, 5: 1}, 400)
    steps, shapes = _steps(50, 60, None)
    assert thread_plan(steps, shapes, cfg, parallel=False) == ThreadPlan(1, {}, 120)  # all small: set once
    assert thread_plan(*_steps(None), cfg, parallel=False) == ThreadPlan(4, {}, 0)  # no GEMM: the full count
    two = ThreadSettings(4, 2, "test", 100)  # parallel: one count (the largest GEMM's), capped per stream
    assert thread_plan(*_steps(50, 400), two, parallel=True) == ThreadPlan(2, {}, 800)
    assert thread_plan(*_steps(50, 60), two, parallel=True) == ThreadPlan(1, {}, 120)


@needs_blas
@pytest.mark.parametrize("mode", ["bound", "bound-unmerged", "profiled", "allocator"])
def test_small_gemms_run_single_threaded(monkeypatch, mode) -> None:
    """bound-unmerged: an ops without merge_bound_calls (an older floor) still runs the thread switches."""
    import opstrata.ops as ops

    if mode == "bound-unmerged" and hasattr(ops, "merge_bound_calls"):
        monkeypatch.delattr(ops, "merge_bound_calls")
    seen = _recording(monkeypatch, "MatMul")
    after = _recording(monkeypatch, "Sigmoid")
    model = _two_gemm_model()
    opts = SessionOptions(
        graph_optimization_level=0, intra_op_num_threads=2,
        enable_profiling=mode == "profiled", enable_mem_arena=mode != "allocator",
    )  # fmt: skip
    sess = InferenceSession(model, opts)
    assert not sess._thread_plans  # planned per input shape, on the first run
    feeds = {"x": np.random.default_rng(0).standard_normal((64, 512), dtype=np.float32)}
    with threadpoolctl.threadpool_limits(limits=1, user_api="blas"):
        sess.run(None, feeds)
        sess.run(None, feeds)
        assert _blas_now() == 1
    assert seen == [2, 1, 2, 1]  # 33.6 MFLOP on 2 threads, 0.26 MFLOP on 1
    assert after == [1, 1]  # the count stays until the next GEMM changes it
    (plan,) = sess._thread_plans.values()
    assert plan.start == 2 and list(plan.switch_at.values()) == [1]


# ---------------------------------------------------------------------------- results


def test_results_do_not_depend_on_the_thread_count(every_gemm_parallel) -> None:
    model = mlp_model(d_in=64, hidden=256, d_out=64)
    feeds = random_feeds(model, {"batch": 64})

    def run(**kw):
        with InferenceSession(model, SessionOptions(**kw)) as sess:
            return sess.run(None, feeds)[0]

    one = run(intra_op_num_threads=1)
    np.testing.assert_array_equal(one, run(intra_op_num_threads=1))  # 1 vs 1: bit for bit
    np.testing.assert_allclose(one, run(intra_op_num_threads=2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one, run(intra_op_num_threads=2, inter_op_num_threads=2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(one, run(intra_op_num_threads=4, enable_mem_arena=False), rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------- reporting


def test_profile_records_the_thread_settings(tmp_path, models) -> None:
    model, dims = models["mlp"]
    sess = InferenceSession(
        model, SessionOptions(enable_profiling=True, intra_op_num_threads=1, inter_op_num_threads=2)
    )
    sess.run(None, random_feeds(model, dims))
    assert "threads: intra-op 1 (intra_op_num_threads), inter-op 2" in sess.profile_summary()
    trace = json.loads(open(sess.end_profiling(tmp_path / "t.json")).read())
    th = trace["metadata"]["threads"]
    assert th["intra_op_num_threads"] == 1 and th["inter_op_num_threads"] == 2
    assert th["intra_op_source"] == "intra_op_num_threads" and th["physical_cores"] == physical_cores()
    assert th["gemm_single_thread_below_flops"] == 2 * _threads_mod.GEMM_MIN_FLOPS_PER_THREAD
    assert isinstance(th["blas"], list)
    (run,) = [e for e in trace["traceEvents"] if e.get("cat") == "session"]
    assert run["args"]["blas_threads"] == 1
    sess.close()


def test_thread_info_describes_the_defaults(no_env) -> None:
    info = thread_info()
    assert info["intra_op_num_threads"] == physical_cores() and info["inter_op_num_threads"] == 1
    json.dumps(info)  # JSON-ready
    if BLAS.available:
        assert info["blas"][0]["num_threads"] == BLAS.current()


# ---------------------------------------------------------------------------- kernels' own threads


def _recording_limit(monkeypatch, op: str = "Relu") -> list[int | None]:
    """Replace ``op``'s kernel by one recording the ops-level thread limit it runs under."""
    import opstrata.ops as ops

    seen: list[int | None] = []
    real = KERNELS[("", op)]

    def kernel(node, args):
        seen.append(ops.intra_op_thread_limit())
        return real(node, args)

    monkeypatch.setitem(KERNELS, ("", op), kernel)
    return seen


@pytest.mark.parametrize("mode", ["bound", "profiled", "allocator"])
@pytest.mark.parametrize("intra", [1, 3])
def test_kernels_run_under_the_sessions_intra_op_count(monkeypatch, mode, intra) -> None:
    """Attention and quant's int8 GEMM split their own work by ops.intra_op_threads: a run sets it to the
    session's count, and it is gone after the run."""
    import opstrata.ops as ops

    seen = _recording_limit(monkeypatch)
    model = mlp_model()
    opts = SessionOptions(
        graph_optimization_level=0, intra_op_num_threads=intra,
        enable_profiling=mode == "profiled", enable_mem_arena=mode != "allocator",
    )  # fmt: skip
    with ops.intra_op_threads(7):  # the caller's own limit is restored after the run
        InferenceSession(model, opts).run(None, random_feeds(model, {"batch": 2}))
        assert ops.intra_op_thread_limit() == 7
    assert seen == [intra] and ops.intra_op_thread_limit() is None


def test_parallel_streams_share_the_kernel_threads(monkeypatch) -> None:
    monkeypatch.setattr(_streams_mod, "HANDOFF_NS", 0.0)
    monkeypatch.setattr(_streams_mod, "MIN_GAIN", -1e9)
    seen = _recording_limit(monkeypatch, "Tanh")
    model = branches_model(branches=2, size=64, depth=2, batch=32)
    feeds = {"x": np.random.default_rng(0).standard_normal((32, 64), dtype=np.float32)}
    opts = SessionOptions(graph_optimization_level=0, intra_op_num_threads=4, inter_op_num_threads=2)
    with InferenceSession(model, opts) as sess:
        sess.run(None, feeds)
        assert next(iter(sess.stream_programs.values())).parallel
    assert seen and set(seen) == {2}  # 4 intra-op threads over 2 streams: 2 each
