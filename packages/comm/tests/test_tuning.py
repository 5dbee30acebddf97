"""Tuned thresholds: the file round trip, corrupt / foreign files, precedence, sharing across ranks, debug log."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from _cases import tuned_selection

from opstrata.comm import _algorithms as alg, _tuning as tuning
from opstrata.comm.testing import free_port, run_ranks

RULES = [
    tuning.Rule("shm", "all_reduce", 2, ((4096, "tree"), (None, "double_tree"))),
    tuning.Rule("shm", "all_reduce", 4, ((None, "ring"),)),
    tuning.Rule("tcp", "broadcast", 2, ((None, "ring"),)),
]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("OPSTRATA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OPSTRATA_COMM_ALGO", raising=False)
    return tmp_path / "cache"


def test_round_trip_is_atomic_and_keyed_by_fingerprint(cache) -> None:
    path = tuning.save(RULES)
    assert path.parent == cache / "comm" and path == tuning.thresholds_path()
    assert sorted(os.listdir(path.parent)) == [path.name]  # the temp file was renamed, nothing left over
    body = json.loads(path.read_text())
    assert body["format"] == tuning.FORMAT and body["fingerprint"] == tuning.fingerprint()
    table = tuning.load()
    assert table.rules == RULES
    assert table.lookup("all_reduce", 100, 2, "shm")[0] == "tree"
    algo, why = table.lookup("all_reduce", 1 << 20, 2, "shm")
    assert algo == "double_tree" and "tuned on this machine" in why and str(path) in why
    assert table.lookup("all_reduce", 100, 8, "shm")[0] == "ring"  # nearest measured world (4)
    assert table.lookup("all_reduce", 100, 3, "tcp") is None  # nothing measured for tcp all_reduce
    assert tuning.TunedTable.from_json(table.to_json()).rules == RULES
    tuning.save(RULES[:1])  # overwrite in place
    assert tuning.load().rules == RULES[:1]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("{not json", "corrupt"),
        ('{"format": "something-else"}', "not an opstrata-comm-thresholds/1 file"),
        ("FOREIGN", "foreign"),
        ("MISSING_RULES", "corrupt"),
        ("UNBOUNDED", "corrupt"),
    ],
)
def test_corrupt_or_foreign_file_is_ignored_with_a_warning(cache, text: str, why: str) -> None:
    path = tuning.thresholds_path()
    path.parent.mkdir(parents=True)
    good = {"format": tuning.FORMAT, "fingerprint": tuning.fingerprint(), "rules": []}
    if text == "FOREIGN":
        text = json.dumps({**good, "fingerprint": {**good["fingerprint"], "cpu": "some other CPU"}})
    elif text == "MISSING_RULES":
        text = json.dumps({k: v for k, v in good.items() if k != "rules"})
    elif text == "UNBOUNDED":
        rule = {"backend": "shm", "collective": "all_reduce", "world": 2, "upto": [[64, "ring"]]}
        text = json.dumps({**good, "rules": [rule]})
    path.write_text(text)
    with pytest.warns(tuning.CommTuningWarning, match=why) as rec:
        table = tuning.load()
    assert not table and "opstrata-comm-tune" in str(rec[0].message)
    assert alg.select("all_reduce", 1024, 2, None, tuned=table)[0] == "direct"  # built-in table


def test_precedence_call_env_topology_tuned_builtin(monkeypatch) -> None:
    table = tuning.TunedTable(RULES, "test")
    assert alg.select("all_reduce", 1 << 20, 2, None, tuned=table)[0] == "double_tree"
    assert alg.select("all_reduce", 1 << 20, 2, None, backend="tcp", tuned=table)[0] == "halving_doubling"
    algo, why = alg.select("all_reduce", 1 << 20, 4, None, hosts=[2, 2], tuned=table)
    assert algo == "hierarchical" and "group spans 2 hosts" in why
    assert alg.select("all_reduce", 1 << 20, 2, None, hosts=[1, 1], tuned=table)[0] == "double_tree"
    assert alg.select("all_gather", 1 << 20, 4, None, hosts=[2, 2])[0] == "hierarchical"
    assert alg.select("reduce_scatter", 1 << 20, 4, None, hosts=[2, 2])[0] != "hierarchical"
    monkeypatch.setenv("OPSTRATA_COMM_ALGO", "tree")
    assert alg.select("all_reduce", 1 << 20, 4, None, hosts=[2, 2], tuned=table) == (
        "tree",
        "requested by OPSTRATA_COMM_ALGO",
    )
    assert alg.select("all_reduce", 64, 4, "ring", tuned=table) == (
        "ring",
        "requested by per-call algorithm=",
    )
    with pytest.raises(ValueError, match="not implemented for this collective"):
        alg.select("all_gather", 64, 4, "double_tree")


def test_tune_command_writes_a_file_that_ranks_share(tmp_path, cache) -> None:
    cmd = [sys.executable, "-m", "opstrata.comm.tune", "--backends", "shm", "--worlds", "2"]
    cmd += ["--sizes-kib", "1,64", "--rounds", "1", "--iters", "1", "--collectives", "all_reduce,broadcast"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert "thresholds written to" in out.stdout and "shm world 2 all_reduce" in out.stdout
    table = tuning.load()
    assert {(r.backend, r.collective, r.world) for r in table.rules} == {
        ("shm", "all_reduce", 2),
        ("shm", "broadcast", 2),
    }
    for r in table.rules:
        assert r.upto[-1][0] is None and all(a in alg.SUPPORTED[r.collective] for _, a in r.upto)
    # rank 1 sees an empty cache dir: it must still use rank 0's table (same choice, no desync)
    empty = tmp_path / "empty"
    res = run_ranks(tuned_selection, 2, backend=None, args=([str(cache), str(empty)], free_port()))
    want = {nb: table.lookup("all_reduce", nb, 2, "shm") for nb in (1024, 8 << 20)}
    for r in res:
        assert r.value["ok"]
        for nb, (algo, why) in r.value["picks"].items():
            assert (algo, why) == want[nb] and "tuned on this machine" in why
        log = r.value["log"]
        assert len(log) == 3, log
        assert (
            "all_reduce" in log[0] and "bytes=4000" in log[0] and "time=" in log[0] and "tuned on" in log[0]
        )
        assert "algo=double_tree" in log[1] and "why=requested by per-call algorithm=" in log[1]
        assert (
            "broadcast" in log[2]
            and "algo=tree" in log[2]
            and "why=requested by OPSTRATA_COMM_ALGO" in log[2]
        )


def test_console_script_is_declared() -> None:
    from importlib import metadata

    try:
        eps = metadata.distribution("opstrata-comm").entry_points
    except metadata.PackageNotFoundError:
        pytest.skip("opstrata-comm has no installed metadata (run the tests through nox)")
    scripts = {ep.name: ep.value for ep in eps if ep.group == "console_scripts"}
    assert scripts.get("opstrata-comm-tune") == "opstrata.comm.tune:main"
    out = subprocess.run(
        [sys.executable, "-m", "opstrata.comm.tune", "--collectives", "barrier"],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2 and "'barrier' is not tunable" in out.stderr


def test_rules_from_timings_bounds_and_noise_tolerance() -> None:
    from opstrata.comm.tune import rules_from

    sizes = [1024, 16384, 262144, 4194304]
    t = {
        ("all_reduce", "direct", 1024): 1.0,
        ("all_reduce", "ring", 1024): 3.0,
        ("all_reduce", "direct", 16384): 2.0,
        ("all_reduce", "ring", 16384): 1.97,  # within 5%: direct stays
        ("all_reduce", "direct", 262144): 9.0,
        ("all_reduce", "ring", 262144): 4.0,
        ("all_reduce", "direct", 4194304): 90.0,
        ("all_reduce", "ring", 4194304): 40.0,
        ("broadcast", "tree", 1024): 1.0,
        ("broadcast", "tree", 16384): 1.0,
        ("broadcast", "tree", 262144): 1.0,
        ("broadcast", "tree", 4194304): 1.0,
    }
    rules = {r.collective: r for r in rules_from("shm", 2, t, sizes)}
    assert rules["all_reduce"].upto == ((65536, "direct"), (None, "ring"))  # sqrt(16384 * 262144)
    assert rules["broadcast"].upto == ((None, "tree"),)
    # without tolerance the 1.5% noise at 16 KiB moves the switch point down to sqrt(1024 * 16384)
    assert rules_from("shm", 2, t, sizes, tolerance=0.0)[0].upto == ((4096, "direct"), (None, "ring"))
