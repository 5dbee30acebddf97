"""Single-process API checks: validation messages, selection table, stores, world size 1."""

from __future__ import annotations

import numpy as np
import pytest

from opstrata import comm
from opstrata.comm import _algorithms as alg
from opstrata.comm.testing import free_port


@pytest.fixture
def world1():
    comm.init_process_group(
        "shm", rank=0, world_size=1, init_method=f"tcp://127.0.0.1:{free_port()}", timeout=10
    )
    yield
    comm.destroy_process_group()


def test_world_of_one(world1) -> None:
    x = np.arange(4, dtype=np.float32)
    comm.all_reduce(x, op="avg")
    assert np.array_equal(x, np.arange(4)) and comm.get_rank() == 0 and comm.get_world_size() == 1
    w = comm.all_reduce(x, async_op=True)
    assert w.wait() and w.is_completed()


def test_bad_inputs_name_the_fix(world1) -> None:
    with pytest.raises(ValueError, match="C-contiguous"):
        comm.all_reduce(np.ones((4, 4), np.float32)[:, 1])
    with pytest.raises(ValueError, match="unknown op"):
        comm.all_reduce(np.ones(2, np.float32), op="mean")
    with pytest.raises(ValueError, match="floating dtype"):
        comm.all_reduce(np.ones(2, np.int32), op="avg")
    with pytest.raises(TypeError, match="numpy array"):
        comm.all_reduce([1.0, 2.0])
    with pytest.raises(ValueError, match="unknown algorithm"):
        comm.all_reduce(np.ones(2, np.float32), algorithm="butterfly")
    with pytest.raises(ValueError, match="not implemented for this collective"):
        comm.broadcast(np.ones(2, np.float32), 0, algorithm="halving_doubling")
    with pytest.raises(ValueError, match="elements"):
        comm.all_gather(np.ones(3, np.float32), np.ones(2, np.float32))
    with pytest.raises(ValueError, match="not in this group"):
        comm.broadcast(np.ones(2, np.float32), 3)
    with pytest.raises(RuntimeError, match="already initialised"):
        comm.init_process_group("shm", rank=0, world_size=1)


def test_uninitialised_and_env_errors(monkeypatch) -> None:
    with pytest.raises(RuntimeError, match="init_process_group"):
        comm.all_reduce(np.ones(2))
    for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="RANK is not set"):
        comm.init_process_group("shm")
    with pytest.raises(ValueError, match="MASTER_ADDR"):
        comm.init_process_group("shm", rank=0, world_size=1)
    with pytest.raises(ValueError, match="unknown backend 'nccl'"):
        comm.init_process_group("nccl", rank=0, world_size=1)


def test_env_init(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(free_port()))
    comm.init_process_group("tcp")
    try:
        assert comm.is_initialized() and comm.get_backend() == "tcp"
    finally:
        comm.destroy_process_group()
    assert not comm.is_initialized()


def test_selection_table(monkeypatch) -> None:
    monkeypatch.delenv("OPSTRATA_COMM_ALGO", raising=False)
    assert alg.select("all_reduce", 1024, 4, None)[0] == "direct"
    assert alg.select("all_reduce", 512 << 10, 4, None)[0] == "halving_doubling"
    assert alg.select("all_reduce", 512 << 10, 3, None)[0] == "ring"
    assert alg.select("all_reduce", 64 << 20, 4, None)[0] == "ring"
    assert alg.select("all_reduce", 64 << 20, 4, "tree") == ("tree", "requested by per-call algorithm=")
    monkeypatch.setenv("OPSTRATA_COMM_ALGO", "tree")
    assert alg.select("all_reduce", 64, 4, None)[0] == "tree"
    assert alg.select("all_gather", 64, 4, None)[0] == "direct"  # tree: not an all_gather algorithm


def test_stores(tmp_path) -> None:
    fs = comm.FileStore(str(tmp_path), timeout=0.2)
    fs.set("a", b"1")
    assert fs.get("a") == b"1" and fs.add("n", 2) == 2 and fs.add("n", 3) == 5
    with pytest.raises(comm.CommTimeoutError, match="'missing'"):
        fs.get("missing")
    ts = comm.TCPStore("127.0.0.1", 0, is_master=True, timeout=0.2)
    try:
        ts.set("k", b"v")
        assert ts.get("k") == b"v" and ts.add("c", 1) == 1 and ts.try_get("nope") is None
    finally:
        ts.close()


def test_store_connect_retries_with_backoff_until_rank_0_listens() -> None:
    """A rank that starts before rank 0's store retries the refused connection instead of failing."""
    import threading
    import time

    port = free_port()
    master: list[comm.TCPStore] = []
    started = threading.Event()

    def late_master() -> None:
        started.set()
        time.sleep(0.6)  # the client's first connects are refused meanwhile
        master.append(comm.TCPStore("127.0.0.1", port, is_master=True, timeout=10))

    t = threading.Thread(target=late_master)
    t.start()
    started.wait(5)
    t0 = time.monotonic()
    client = comm.TCPStore("127.0.0.1", port, is_master=False, timeout=10)
    waited = time.monotonic() - t0
    t.join(10)
    try:
        client.set("k", b"v")
        assert master[0].get("k") == b"v"
        assert 0.4 < waited < 5.0, waited  # it did wait for the late master, and not for the full timeout
    finally:
        client.close()
        master[0].close()


def test_store_connect_gives_up_at_its_timeout_naming_the_address() -> None:
    import time

    port = free_port()  # nobody listens here
    t0 = time.monotonic()
    with pytest.raises(comm.CommTimeoutError, match=rf"cannot connect to rank 0 at 127\.0\.0\.1:{port}"):
        comm.TCPStore("127.0.0.1", port, is_master=False, timeout=0.5)
    assert time.monotonic() - t0 < 3.0


def test_debug_env_logs_each_collective_with_algorithm_size_time_and_reason() -> None:
    """Silent without OPSTRATA_COMM_DEBUG; with it, one line per collective (seq 0 off, seq 0 of the next group on)."""
    import os
    import subprocess
    import sys

    code = (
        "import os, numpy as np\nfrom opstrata import comm\n"
        "for debug, algo in (('', 'tree'), ('1', 'ring')):\n"
        "    os.environ['OPSTRATA_COMM_DEBUG'] = debug\n"
        f"    comm.init_process_group('shm', rank=0, world_size=1, init_method='tcp://127.0.0.1:{free_port()}')\n"
        "    comm.all_reduce(np.ones(1024, np.float32), algorithm=algo)\n"
        "    comm.destroy_process_group()\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "OPSTRATA_COMM_DEBUG"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if "all_reduce seq=0" in x]
    assert len(lines) == 1 and "algo=tree" not in lines[0], p.stderr  # nothing logged while it was unset
    for part in ("algo=ring", "bytes=4096", "world=1", "backend=shm", "time=", "why=requested by per-call"):
        assert part in lines[0], lines[0]
