"""Autotuner: cache hits without timing, key invalidation, incremental candidates, corrupted files,
concurrent writers, deterministic mode, stats, and the real tunable kernels (attention, norm backward)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import opstrata.ops as ops
from opstrata.ops.tune import autotune as _autotune, cache as _autotune_cache

SRC = Path(__file__).resolve().parents[1] / "src"
CALLS: Counter = Counter()


@pytest.fixture(autouse=True)
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A private cache directory, mode from a clean environment, fresh stats and memory."""
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("OPSTRATA_AUTOTUNE", raising=False)
    saved_mode, saved_tunables = _autotune._STATE.mode, dict(_autotune._STATE.tunables)
    _autotune._STATE.mode = None
    ops.clear_autotune_cache()
    ops.reset_autotune_stats()
    CALLS.clear()
    yield tmp_path / "autotune"
    _autotune._STATE.mode = saved_mode
    _autotune._STATE.tunables.clear()
    _autotune._STATE.tunables.update(saved_tunables)
    ops.clear_autotune_cache()


def fake(values: list, *, version: str = "1", op: str = "_test_tuned") -> ops.Tunable:
    """Declare and register a kernel whose fastest candidate is block=4 (sleep grows with |block - 4|)."""
    spec = ops.Tunable(
        op=op,
        device="cpu",
        version=version,
        params={"block": values},
        default={"block": values[0]},
        repeats=3,
    )

    @ops.register(op, device="cpu")
    @ops.autotuned(spec)
    def kernel(x: np.ndarray, *, scale: float = 1.0, block: int | None = None) -> np.ndarray:
        CALLS[block] += 1
        time.sleep(0.001 * (1 + 4 * abs((block or 1) - 4)))  # gaps of 4 ms: robust to a loaded machine
        return x * scale

    return spec


def entry_files(cache: Path, op: str = "_test_tuned") -> list[Path]:
    return sorted((cache / op).glob("*.json"))


def test_tune_times_every_candidate_and_persists_them_all(cache: Path) -> None:
    fake([1, 2, 4, 8])
    res = ops.tune("_test_tuned", np.ones(3))
    assert res.params == {"block": 4}
    assert len(res.timed) == 4 and set(CALLS) == {1, 2, 4, 8}
    (path,) = entry_files(cache)
    data = json.loads(path.read_text())
    assert data["format"] == "opstrata-autotune/1"
    assert data["key"]["args"] == [{"shape": [3], "dtype": "float64"}]
    assert data["key"]["fingerprint"] == ops.device_fingerprint()
    assert sorted(c["params"]["block"] for c in data["candidates"]) == [1, 2, 4, 8]
    assert all(c["median_s"] > 0 and len(c["samples_s"]) == 3 for c in data["candidates"])
    s = ops.autotune_stats()
    assert (s.misses, s.hits, s.candidates_timed) == (1, 0, 4) and s.tuning_seconds > 0


def test_second_run_is_a_cache_hit_without_timing(cache: Path) -> None:
    fake([1, 2, 4, 8])
    ops.tune("_test_tuned", np.ones(3))
    ops.clear_autotune_cache()  # a new process: nothing in memory, the file on disk
    ops.reset_autotune_stats()
    CALLS.clear()
    res = ops.tune("_test_tuned", np.ones(3))
    assert res.params == {"block": 4} and res.timed == () and not CALLS
    assert ops.autotune_stats().hits == 1 and ops.autotune_stats().misses == 0
    ops.tune("_test_tuned", np.ones(3))  # memory hit
    assert ops.autotune_stats().hits == 2 and not CALLS


def test_second_process_reads_the_cache_of_the_first(cache: Path) -> None:
    code = (
        "import numpy as np, opstrata.ops as ops\n"
        "x = np.random.default_rng(0).standard_normal((64, 32)).astype(np.float32)\n"
        "with ops.autotune(True):\n"
        "    ops.layer_norm_backward(x, np.ones(32, np.float32), x)\n"
        "s = ops.autotune_stats(); print(s.hits, s.misses, s.candidates_timed)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(SRC), "OPSTRATA_CACHE_DIR": str(cache.parent)}
    first = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    second = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert first.returncode == 0, first.stderr
    n = len(_autotune._STATE.tunables[("layer_norm_backward", "cpu")][0].candidates())
    assert first.stdout.split() == ["0", "1", str(n)]
    assert second.stdout.split() == ["1", "0", "0"], second.stderr


def test_dispatch_tunes_transparently_when_enabled(cache: Path) -> None:
    fake([1, 2, 4, 8])
    x = np.ones(3)
    assert ops.call("_test_tuned", x).tolist() == [1.0, 1.0, 1.0]
    assert CALLS == {None: 1} and not cache.exists()  # off by default: the kernel's own default
    CALLS.clear()
    with ops.autotune(True):
        ops.call("_test_tuned", x, scale=2.0)
        assert CALLS[4] == 3 + 1 + 1  # timed (3 repeats + warmup), then the real call with the winner
        CALLS.clear()
        ops.call("_test_tuned", x, scale=2.0)
        assert CALLS == {4: 1}
        CALLS.clear()
        ops.call("_test_tuned", x, scale=2.0, block=1)  # an explicit knob always wins
        assert CALLS == {1: 1}
    assert _autotune.current_mode() == "off"


def test_key_changes_with_fingerprint_version_shape_and_attributes(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake([1, 4])
    x = np.ones(3)
    first = ops.tune("_test_tuned", x).path
    assert ops.tune("_test_tuned", x).timed == ()
    assert ops.tune("_test_tuned", np.ones(4)).path != first  # shape
    assert ops.tune("_test_tuned", x.astype(np.float32)).path != first  # dtype
    assert ops.tune("_test_tuned", x, scale=3.0).path != first  # attribute
    other = {**ops.device_fingerprint(), "cpu": "Some Other CPU", "blas": {"vendor": "mkl", "threads": 64}}
    monkeypatch.setattr(_autotune, "device_fingerprint", lambda: other)
    moved = ops.tune("_test_tuned", x)
    assert moved.path != first and len(moved.timed) == 2  # another machine's timings are never used
    monkeypatch.undo()
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(cache.parent))
    fake([1, 4], version="2")
    bumped = ops.tune("_test_tuned", x)
    assert bumped.path != first and len(bumped.timed) == 2  # a new kernel version re-tunes
    key = json.loads(Path(bumped.path).read_text())["key"]
    assert key["version"] == "2" and key["op"] == "_test_tuned"


def test_adding_a_candidate_times_only_that_one(cache: Path) -> None:
    fake([1, 2, 8])
    assert ops.tune("_test_tuned", np.ones(3)).params == {"block": 2}
    fake([1, 2, 8, 4])  # a new candidate declared later
    CALLS.clear()
    res = ops.tune("_test_tuned", np.ones(3))
    assert res.timed == ('{"block": 4}',) and set(CALLS) == {4}
    assert res.params == {"block": 4}
    (path,) = entry_files(cache)
    assert len(json.loads(path.read_text())["candidates"]) == 4
    fake([2, 4])  # fewer candidates: all cached, the best among the declared ones
    CALLS.clear()
    assert ops.tune("_test_tuned", np.ones(3)).params == {"block": 4} and not CALLS


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("{not json", "corrupted"),
        ('{"format": "opstrata-autotune/1", "key": {}, "candidates": []}', "foreign"),
        ('{"format": "something-else"}', "not an opstrata-autotune/1 file"),
        ("[1, 2]", "not an opstrata-autotune/1 file"),
        ("", "corrupted"),
    ],
)
def test_corrupted_or_foreign_file_is_ignored_with_a_warning_and_rebuilt(
    cache: Path, content: str, why: str
) -> None:
    fake([1, 4])
    path = Path(ops.tune("_test_tuned", np.ones(3)).path)
    good_key = json.loads(path.read_text())["key"]
    path.write_text(content)
    ops.clear_autotune_cache()
    with pytest.warns(ops.AutotuneCacheWarning, match=why):
        res = ops.tune("_test_tuned", np.ones(3))
    assert len(res.timed) == 2 and res.params == {"block": 4}
    data = json.loads(path.read_text())  # rebuilt: valid again
    assert data["key"] == good_key and len(data["candidates"]) == 2


def test_corrupted_record_inside_a_valid_file(cache: Path) -> None:
    fake([1, 4])
    path = Path(ops.tune("_test_tuned", np.ones(3)).path)
    data = json.loads(path.read_text())
    data["candidates"][0]["median_s"] = "fast"
    path.write_text(json.dumps(data))
    ops.clear_autotune_cache()
    with pytest.warns(ops.AutotuneCacheWarning, match="corrupted"):
        assert len(ops.tune("_test_tuned", np.ones(3)).timed) == 2


_MP_SCRIPT = """
import json, sys, time
import numpy as np
import opstrata.ops as ops

values, start = json.loads(sys.argv[1]), float(sys.argv[2])
spec = ops.Tunable(op="_test_mp", device="cpu", version="1", params={"block": values},
                   default={"block": values[0]}, repeats=1)

@ops.autotuned(spec)
def kernel(x, *, block=None):
    time.sleep(0.001)
    return x

while time.time() < start:  # both processes start tuning at the same instant
    time.sleep(0.001)
for n in range(1, 9):
    ops.tune("_test_mp", np.zeros(n))
print(ops.autotune_stats().misses)
"""


def test_two_processes_tuning_at_once_keep_both_entries(cache: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(SRC), "OPSTRATA_CACHE_DIR": str(cache.parent)}
    start = str(time.time() + 1.5)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MP_SCRIPT, json.dumps(vals), start],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for vals in ([1, 2, 3], [4, 5, 6])
    ]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), [o[1] for o in outs]
    assert [o[0].split() for o in outs] == [["8"], ["8"]]
    files = entry_files(cache, "_test_mp")
    assert len(files) == 8  # one per shape
    for f in files:
        data = json.loads(f.read_text())  # valid JSON after concurrent merges
        assert sorted(c["params"]["block"] for c in data["candidates"]) == [1, 2, 3, 4, 5, 6]
    assert not list((cache / "_test_mp").glob("*.lock")) and not list((cache / "_test_mp").glob("*.tmp"))


def test_stale_lock_is_broken_and_a_live_one_times_out(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake([1, 4])
    key = _autotune.cache_key(_autotune._STATE.tunables[("_test_tuned", "cpu")][0], (np.ones(3),), {})
    path = _autotune_cache.entry_path(json.dumps(key, sort_keys=True), "_test_tuned")
    path.parent.mkdir(parents=True)
    lock = path.with_name(path.name + ".lock")
    lock.write_text("12345")
    old = time.time() - 3600
    os.utime(lock, (old, old))
    with pytest.warns(ops.AutotuneCacheWarning, match="stale autotune lock"):
        assert ops.tune("_test_tuned", np.ones(3)).params == {"block": 4}
    assert path.exists() and not lock.exists()
    lock.write_text("12345")  # fresh: another process holds it
    monkeypatch.setattr(_autotune_cache, "LOCK_TIMEOUT_S", 0.2)
    ops.clear_autotune_cache()
    fake([1, 4, 8])
    with pytest.raises(TimeoutError, match=r"lock file .*\.lock.*delete that file"):
        ops.tune("_test_tuned", np.ones(3))


def test_deterministic_mode_uses_defaults_without_timing(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fake([2, 4])
    monkeypatch.setenv("OPSTRATA_AUTOTUNE", "deterministic")
    ops.call("_test_tuned", np.ones(3))
    assert CALLS == {2: 1} and not cache.exists()
    assert ops.autotune_stats().deterministic == 1 and ops.autotune_stats().candidates_timed == 0
    monkeypatch.setenv("OPSTRATA_AUTOTUNE", "1")
    with ops.autotune("deterministic"):  # the API overrides the environment
        ops.call("_test_tuned", np.ones(3))
    assert CALLS == {2: 2}
    res = ops.tune("_test_tuned", np.ones(3), deterministic=True)
    assert res.params == {"block": 2} and res.timings == {} and CALLS == {2: 2}
    ops.call("_test_tuned", np.ones(3))  # env says 1: tunes
    assert CALLS[4] > 0


def test_mode_and_declaration_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPSTRATA_AUTOTUNE", "sometimes")
    with pytest.raises(ValueError, match=r"OPSTRATA_AUTOTUNE.*'sometimes'.*Fix"):
        _autotune.current_mode()
    with pytest.raises(ValueError, match=r"autotune\(enabled\)"):
        ops.autotune("maybe")
    with pytest.raises(LookupError, match=r"'_nope'.*tunable: attention on cpu"):
        ops.tune("_nope", np.ones(2))
    with pytest.raises(ValueError, match="default keys"):
        ops.Tunable(op="x", device="cpu", version="1", params={"a": [1]}, default={"b": 1})
    with pytest.raises(ValueError, match="JSON scalars"):
        ops.Tunable(op="x", device="cpu", version="1", params={"a": [object()]}, default={"a": 1})


def test_cache_dir_defaults_to_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("OPSTRATA_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert ops.autotune_cache_dir() == tmp_path / "xdg" / "opstrata" / "autotune"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert ops.autotune_cache_dir() == Path.home() / ".cache" / "opstrata" / "autotune"


def test_fingerprint_names_cpu_cores_blas_and_numpy() -> None:
    fp = ops.device_fingerprint()
    assert fp["cores"] == os.cpu_count() and fp["numpy"] == np.__version__
    assert fp["cpu"] and fp["blas"]["vendor"]


def test_real_kernels_are_tunable_and_exact(cache: Path) -> None:
    assert {(t.op, t.device) for t in ops.tunables()} >= {
        ("attention", "cpu"),
        ("layer_norm_backward", "cpu"),
        ("rms_norm_backward", "cpu"),
    }
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((1, 2, 37, 8)).astype(np.float32) for _ in range(3))
    want = ops.attention(q, k, v, causal=True)
    with ops.autotune(True):
        got = ops.attention(q, k, v, causal=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert len(entry_files(cache, "attention")) == 1
    x, g = rng.standard_normal((50, 16)), rng.standard_normal((50, 16))
    want_ln = ops.layer_norm_backward(x, np.ones(16), g)
    with ops.autotune(True):
        got_ln = ops.layer_norm_backward(x, np.ones(16), g)
    for a, b in zip(got_ln, want_ln, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-10, atol=1e-12)
    assert ops.autotune_stats().misses == 2


@pytest.mark.parametrize(("other_s", "chosen"), [(0.97, 3), (0.90, 5)])
def test_default_kept_unless_a_candidate_wins_by_min_gain(cache: Path, other_s: float, chosen: int) -> None:
    spec = fake([3, 5])
    key = _autotune.cache_key(spec, (np.ones(3),), {})
    path = _autotune_cache.entry_path(json.dumps(key, sort_keys=True), "_test_tuned")
    records = {
        json.dumps({"block": b}, sort_keys=True): {"params": {"block": b}, "median_s": t, "samples_s": [t]}
        for b, t in ((3, 1.0), (5, other_s))
    }
    _autotune_cache.write_entry(path, key, records)  # timings as if measured earlier
    res = ops.tune("_test_tuned", np.ones(3))
    assert res.timed == () and res.params == {"block": chosen}  # 3% faster is noise; 10% is a win
    assert spec.min_gain == 0.05


def test_deterministic_mode_answers_from_the_shipped_pretuned_table(
    cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opstrata.ops.tune import pretuned as pre

    spec = fake([2, 4])
    key = _autotune.shape_key(spec, (np.ones(3),), {})
    monkeypatch.setattr(pre, "_table", lambda: {json.dumps(key, sort_keys=True): {"block": 4}})
    pre.has_pretuned.cache_clear()
    try:
        with ops.autotune("deterministic"):
            ops.call("_test_tuned", np.ones(3))  # a shipped shape: its pre-tuned choice
            ops.call("_test_tuned", np.ones(5))  # any other shape: the declared default
        assert CALLS == {4: 1, 2: 1} and not cache.exists()
        assert ops.tune("_test_tuned", np.ones(3), deterministic=True).params == {"block": 4}
    finally:
        pre.has_pretuned.cache_clear()


def test_damaged_pretuned_table_warns_and_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from opstrata.ops.tune import pretuned as pre

    bad = tmp_path / "pretuned.json"
    bad.write_text("{oops")
    monkeypatch.setattr(pre, "PATH", bad)
    pre._table.cache_clear()
    try:
        with pytest.warns(ops.AutotuneCacheWarning, match="damaged.*reinstall"):
            assert pre._table() == {}
    finally:
        pre._table.cache_clear()


def test_shipped_pretuned_table_matches_the_declared_tunables() -> None:
    from opstrata.ops.tune import pretuned as pre

    pre._table.cache_clear()
    table = pre._table()
    assert table, "autotune_pretuned.json is missing from the package"
    specs = {(t.op, t.device): t for t in ops.tunables()}
    for text, params in table.items():
        key = json.loads(text)
        spec = specs[(key["op"], key["device"])]
        assert key["version"] == spec.version, f"stale pre-tuned entry for {key['op']}: re-run bench_autotune"
        assert params in spec.candidates()
