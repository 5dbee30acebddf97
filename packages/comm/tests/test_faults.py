"""Failure handling: a killed rank, desync, timeout, and the launcher's fail-fast exit; no shm leaks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

import pytest
from _cases import (
    desync,
    die_mid_all_reduce,
    late_peer,
    multi_host_stopped,
    slow_but_alive,
    stopped_peer,
    stopped_store_host,
    timeout_with_dump,
)

from opstrata.comm.testing import free_port, run_ranks, shm_leftovers

COMM_TIMEOUT = 20.0


@pytest.mark.parametrize(("backend", "victim"), [("shm", 1), ("tcp", 1), ("shm", 0), ("tcp", 0)])
def test_kill_9_mid_all_reduce_raises_peer_error_on_survivors(backend: str, victim: int) -> None:
    job = f"k9{backend}{victim}x{os.getpid()}"
    res = run_ranks(
        die_mid_all_reduce,
        3,
        backend=backend,
        args=(victim,),
        check=False,
        comm_timeout=COMM_TIMEOUT,
        env={"OPSTRATA_COMM_JOB_ID": job},
        timeout=60,
    )
    assert res[victim].exitcode == -9
    for r in sorted({0, 1, 2} - {victim}):
        v = res[r].value
        assert res[r].ok and v["error"] == "CommPeerError", (res[r].error, v)
        assert f"rank {victim}" in v["msg"]
        assert v["after"] < COMM_TIMEOUT + 5, v
        # the flight recorder is dumped with the failure: the collectives this rank ran before it
        dump = "\n".join(v["log"])
        assert "last collectives of group" in dump and "all_reduce seq=" in dump and " done " in dump, dump
    assert shm_leftovers(job) == []


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("kind", ["shape", "op"])
def test_desync_reported_on_every_rank_with_both_sides(backend: str, kind: str) -> None:
    job = f"ds{backend}{kind}{os.getpid()}"
    env = {"OPSTRATA_COMM_JOB_ID": job}
    res = run_ranks(desync, 3, backend=backend, args=(kind,), check=False, timeout=60, env=env)
    assert shm_leftovers(job) == []  # unlinked on the error path too
    for r in res:
        assert r.ok and r.value["error"] == "CommDesyncError", (r.error, r.value)
    # rank 1 is out of step: a neighbour that compared headers with it shows both calls in one message
    sides = ("shape=[5]", "shape=[4]") if kind == "shape" else ("broadcast seq=1", "all_reduce seq=1")
    both = [r.value["msg"] for r in res if all(s in r.value["msg"] for s in sides)]
    assert both, [r.value["msg"] for r in res]
    assert "seq=1" in both[0] and "rank 1" in both[0], both[0]


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_timeout_names_collective_seq_and_peer(backend: str) -> None:
    job = f"to{backend}{os.getpid()}"
    env = {"OPSTRATA_COMM_JOB_ID": job}
    res = run_ranks(late_peer, 2, backend=backend, check=False, comm_timeout=1.0, timeout=60, env=env)
    assert shm_leftovers(job) == []
    v = res[0].value
    assert v["error"] == "CommTimeoutError", (res[0].error, v)
    assert "all_reduce seq=1" in v["msg"] and "peer rank 1" in v["msg"] and "rank 0" in v["msg"], v
    assert 0.9 <= v["after"] < 3.0, v  # it waited the configured timeout, then a little more at most
    dump = "\n".join(v["log"])
    assert "last collectives of group" in dump and "barrier seq=0" in dump and "all_reduce seq=1" in dump, (
        dump
    )
    assert "flight recorder (2 entries) written to " in v["msg"], v["msg"]


HB = {"OPSTRATA_COMM_HEARTBEAT_INTERVAL": "0.5", "OPSTRATA_COMM_HEARTBEAT_TIMEOUT": "3"}


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_sigstop_peer_is_caught_by_heartbeat_not_the_timeout(backend: str) -> None:
    job = f"hb{backend}{os.getpid()}"
    t0 = time.monotonic()
    res = run_ranks(
        stopped_peer,
        3,
        backend=backend,
        args=(1,),
        check=False,
        comm_timeout=300.0,  # only the heartbeat can explain the stopped rank in time
        env={"OPSTRATA_COMM_JOB_ID": job, **HB},
        timeout=60,
    )
    assert time.monotonic() - t0 < 45
    assert res[1].exitcode == -9, (res[1].exitcode, res[1].error)
    for r in (0, 2):
        v = res[r].value
        assert res[r].ok and v["error"] == "CommPeerError", (res[r].error, v)
        assert "peer rank 1 sent no heartbeat" in v["msg"] and "all_reduce seq=" in v["msg"], v["msg"]
        assert "OPSTRATA_COMM_HEARTBEAT_TIMEOUT=3s" in v["msg"], v["msg"]
        assert 2.5 < v["after"] < 3.0 + 5.0, v
    assert shm_leftovers(job) == []


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_sigstop_of_the_store_host_is_caught_by_heartbeat(backend: str) -> None:
    """A frozen rank 0 also freezes the store it hosts: survivors' store requests are bounded and say so."""
    job = f"hb0{backend}{os.getpid()}"
    t0 = time.monotonic()
    res = run_ranks(
        stopped_store_host,
        3,
        backend=backend,
        check=False,
        comm_timeout=300.0,
        env={"OPSTRATA_COMM_JOB_ID": job, **HB},
        timeout=60,
    )
    assert time.monotonic() - t0 < 45
    assert res[0].exitcode == -9, (res[0].exitcode, res[0].error)
    said_store = 0
    for r in (1, 2):
        v = res[r].value
        assert res[r].ok and v["error"] == "CommPeerError", (res[r].error, v)
        assert "all_reduce seq=" in v["msg"] and 2.5 < v["after"] < 3.0 + 8.0, v
        if "the store (hosted by rank 0 of the job) has not answered" in v["msg"]:
            assert "OPSTRATA_COMM_HEARTBEAT_TIMEOUT=3s" in v["msg"], v["msg"]
            said_store += 1
        else:  # the other survivor saw that rank's group abort first: it names rank 0 as the failure
            assert "aborted the group (failing rank 0)" in v["msg"], v["msg"]
    assert said_store >= 1  # whoever noticed first explains why
    assert shm_leftovers(job) == []


def test_sigstop_peer_caught_inside_the_hierarchical_intra_host_level() -> None:
    job = f"hbh{os.getpid()}"
    hosts = ["a", "a", "b", "b"]  # rank 1 stops: rank 0 waits on it over the per-host shm level
    res = run_ranks(
        multi_host_stopped,
        4,
        backend=None,
        args=(hosts, free_port(), 1),
        check=False,
        env={"OPSTRATA_COMM_JOB_ID": job, **HB},
        timeout=60,
    )
    assert res[1].exitcode == -9, (res[1].exitcode, res[1].error)
    for r in (0, 2, 3):
        v = res[r].value
        assert res[r].ok and v["error"] == "CommPeerError", (r, res[r].error, v)
        assert "rank 1 sent no heartbeat" in v["msg"] and "all_reduce seq=" in v["msg"], v["msg"]
        assert v["after"] < 3.0 + 5.0, v
    # rank 0 found it itself, waiting inside the per-host level (the others have a 60 s heartbeat timeout)
    assert "[intra-host]: peer rank 1 sent no heartbeat" in res[0].value["msg"], res[0].value["msg"]
    assert shm_leftovers(job) == []


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_slow_but_alive_peer_is_not_declared_dead(backend: str) -> None:
    job = f"hs{backend}{os.getpid()}"
    env = {"OPSTRATA_COMM_JOB_ID": job, "OPSTRATA_COMM_HEARTBEAT_INTERVAL": "0.25"}
    env["OPSTRATA_COMM_HEARTBEAT_TIMEOUT"] = "1.5"
    res = run_ranks(slow_but_alive, 2, backend=backend, args=(4.0,), comm_timeout=60.0, env=env, timeout=60)
    assert [r.value["sum"] for r in res] == [3.0, 3.0]
    assert res[0].value["waited"] > 3.0  # rank 0 really waited past the heartbeat timeout
    assert [r.value["threads"] for r in res] == [[], []]  # destroy_process_group ended worker + heartbeat
    assert shm_leftovers(job) == []


def test_bad_heartbeat_settings_are_rejected(monkeypatch) -> None:
    from opstrata.comm import _heartbeat

    monkeypatch.setenv("OPSTRATA_COMM_HEARTBEAT_INTERVAL", "2")
    monkeypatch.setenv("OPSTRATA_COMM_HEARTBEAT_TIMEOUT", "3")
    with pytest.raises(ValueError, match="must exceed twice OPSTRATA_COMM_HEARTBEAT_INTERVAL"):
        _heartbeat.settings()
    monkeypatch.setenv("OPSTRATA_COMM_HEARTBEAT_TIMEOUT", "soon")
    with pytest.raises(ValueError, match="OPSTRATA_COMM_HEARTBEAT_TIMEOUT='soon'"):
        _heartbeat.settings()
    monkeypatch.setenv("OPSTRATA_COMM_HEARTBEAT_INTERVAL", "0")  # 0 switches the heartbeat off
    monkeypatch.setenv("OPSTRATA_COMM_HEARTBEAT_TIMEOUT", "1")
    assert _heartbeat.settings() == (0.0, 1.0)


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_timeout_writes_the_whole_flight_recorder_to_a_file(tmp_path, backend: str) -> None:
    job = f"fr{backend}{os.getpid()}"
    env = {
        "OPSTRATA_COMM_JOB_ID": job,
        "OPSTRATA_COMM_DUMP_DIR": str(tmp_path),
        "OPSTRATA_COMM_FLIGHT_RECORDER_SIZE": "5",
    }
    res = run_ranks(timeout_with_dump, 2, backend=backend, args=(7,), check=False, comm_timeout=1.0, env=env)
    v = res[0].value
    assert v["error"] == "CommTimeoutError", (res[0].error, v)
    path = tmp_path / f"flight-{job}-g0-rank0.json"
    assert f"flight recorder (5 entries) written to {path}" in v["msg"], v["msg"]
    doc = json.loads(path.read_text())
    assert (doc["job"], doc["group"], doc["rank"], doc["capacity"]) == (job, 0, 0, 5)
    entries = doc["entries"]
    # the 5 newest of 8 collectives: barriers seq 3..6 done, then the all_reduce that timed out
    assert [(e["op"], e["seq"], e["state"]) for e in entries] == [
        *[("barrier", s, "done") for s in range(3, 7)],
        ("all_reduce", 7, "failed"),
    ]
    last = entries[-1]
    assert last["desc"] == "op=sum dtype=float32 shape=[4] det=False" and last["nbytes"] == 16
    assert last["algorithm"] and last["error"].startswith("CommTimeoutError: all_reduce seq=7")
    assert all(e["start"] <= e["end"] for e in entries) and all(e["ms"] >= 0 for e in entries[:-1])
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]  # written via temp + rename
    assert shm_leftovers(job) == []


def test_flight_recorder_size_must_be_positive(monkeypatch) -> None:
    from opstrata.comm._flight import FlightRecorder

    monkeypatch.setenv("OPSTRATA_COMM_FLIGHT_RECORDER_SIZE", "0")
    with pytest.raises(ValueError, match="OPSTRATA_COMM_FLIGHT_RECORDER_SIZE='0'"):
        FlightRecorder()
    monkeypatch.setenv("OPSTRATA_COMM_FLIGHT_RECORDER_SIZE", "3")
    rec = FlightRecorder()
    for s in range(5):
        rec.start("barrier", s, "", 0, "direct")
    assert [e.seq for e in rec] == [2, 3, 4]


SCRIPT = textwrap.dedent(
    """
    import os, sys, numpy as np
    from opstrata import comm
    comm.init_process_group(sys.argv[2], timeout=20)
    x = np.ones(100000, np.float32)
    comm.all_reduce(x)
    print("first", x[0], flush=True)
    if comm.get_rank() == int(sys.argv[1]):
        print("about to die", flush=True)
        os.kill(os.getpid(), 9)
    while True:
        comm.all_reduce(x)
    """
)


def _launch(tmp_path, args: list[str], job: str) -> subprocess.CompletedProcess:
    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "OPSTRATA_COMM_JOB_ID": job}
    return subprocess.run(
        [sys.executable, "-m", "opstrata.comm.launch", "--nproc", "3", "--grace", "2", str(script), *args],
        capture_output=True,
        text=True,
        timeout=90,
        env=env,
    )


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_launcher_fails_fast_and_names_the_rank(tmp_path, backend: str) -> None:
    job = f"l{backend}{os.getpid()}"
    # a segment of this job left by a rank killed during start-up: the launcher must remove it too
    with open(f"/dev/shm/opst_{job}_g9_stale", "wb") as f:  # what shm_open creates on Linux
        f.write(bytes(64))
    assert shm_leftovers(job) == [f"opst_{job}_g9_stale"]  # the check below can see this job's segments
    t0 = time.monotonic()
    p = _launch(tmp_path, ["2", backend], job)
    elapsed = time.monotonic() - t0
    assert p.returncode != 0
    assert "rank 2 failed (killed by SIGKILL)" in p.stderr
    assert "about to die" in p.stderr
    assert "[rank 0] first 3.0" in p.stdout
    assert elapsed < 20 + 2 + 15, elapsed  # comm timeout + --grace + start-up, not a hang
    assert shm_leftovers(job) == []


def test_launcher_success_and_prefix(tmp_path) -> None:
    script = tmp_path / "ok.py"
    script.write_text(
        "import numpy as np\nfrom opstrata import comm\ncomm.init_process_group('tcp')\n"
        "x = np.ones(3) * comm.get_rank()\ncomm.all_reduce(x)\nprint('result', x[0], comm.get_world_size())\n"
        "comm.destroy_process_group()\n"
    )
    p = subprocess.run(
        [sys.executable, "-m", "opstrata.comm.launch", "--nproc", "2", str(script)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert p.returncode == 0, p.stdout + p.stderr
    assert "[rank 0] result 1.0 2" in p.stdout and "[rank 1] result 1.0 2" in p.stdout


def test_launcher_two_nodes_on_one_host(tmp_path) -> None:
    script = tmp_path / "mn.py"
    script.write_text(
        "import os, numpy as np\nfrom opstrata import comm\ncomm.init_process_group('tcp', timeout=30)\n"
        "x = np.ones(5) * comm.get_rank()\ncomm.all_reduce(x)\n"
        "print('rank', comm.get_rank(), 'local', os.environ['LOCAL_RANK'], 'sum', x[0])\ncomm.destroy_process_group()\n"
    )
    port = str(free_port())
    cmd = [
        sys.executable,
        "-m",
        "opstrata.comm.launch",
        "--nproc",
        "2",
        "--nnodes",
        "2",
        "--master-port",
        port,
    ]
    nodes = [
        subprocess.Popen([*cmd, "--node-rank", str(k), str(script)], stdout=subprocess.PIPE, text=True)
        for k in (1, 0)
    ]
    outs = [p.communicate(timeout=60)[0] for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], outs
    assert "[rank 3] rank 3 local 1 sum 6.0" in outs[0] and "[rank 0] rank 0 local 0 sum 6.0" in outs[1]


def test_launcher_blames_the_signal_death_among_ranks_failed_in_one_poll() -> None:
    from opstrata.comm._launch import root_failure

    assert root_failure([(0, 1), (2, -9)]) == (2, -9)  # rank 0 exited on noticing rank 2's SIGKILL
    assert root_failure([(3, 1), (1, 2)]) == (1, 2)  # no signal: the lowest rank
    assert root_failure([(1, -15), (0, -9)]) == (0, -9)
    assert root_failure([(5, 1)]) == (5, 1)
