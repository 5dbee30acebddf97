"""``opstrata-launch``: spawn N ranks with torchrun's environment, prefix their output, fail fast.

When one rank exits non-zero the others get SIGTERM, then SIGKILL after a grace period; the launcher
exits with that rank's code, names it and repeats its last output lines, and removes the job's
leftover shared-memory segments from /dev/shm.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="opstrata-launch",
        description="Run a script on N local ranks (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT set).",
    )
    p.add_argument(
        "--nproc", "--nproc-per-node", dest="nproc", type=int, required=True, help="ranks on this node"
    )
    p.add_argument("--nnodes", type=int, default=1, help="number of nodes (default 1)")
    p.add_argument("--node-rank", type=int, default=0, help="index of this node (default 0)")
    p.add_argument("--master-addr", default="127.0.0.1", help="host of rank 0 (default 127.0.0.1)")
    p.add_argument(
        "--master-port", type=int, default=None, help="store port on rank 0 (default: a free port)"
    )
    p.add_argument("--grace", type=float, default=5.0, help="seconds between SIGTERM and SIGKILL (default 5)")
    p.add_argument("-m", dest="module", action="store_true", help="run the target as a module (python -m)")
    p.add_argument("script", help="script path (or module name with -m)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed to the script")
    return p


def cleanup_shm(job: str) -> list[str]:
    """Remove the job's segments left in /dev/shm (ranks unlink theirs; this covers a kill during start-up)."""
    removed = []
    with contextlib.suppress(FileNotFoundError):
        for name in os.listdir("/dev/shm"):
            if name.startswith(f"opst_{job}_"):
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join("/dev/shm", name))
                    removed.append(name)
    return removed


def _pump(rank: int, stream, tail: collections.deque, lock: threading.Lock) -> None:
    for raw in iter(stream.readline, b""):
        line = raw.decode(errors="replace").rstrip("\n")
        tail.append(line)
        with lock:
            sys.stdout.write(f"[rank {rank}] {line}\n")
            sys.stdout.flush()
    stream.close()


def root_failure(failures: list[tuple[int, int]]) -> tuple[int, int]:
    """The (rank, exit code) to blame among ranks found failed in one poll: a rank killed by a signal
    (negative code) before ranks that exited with an error (they usually exit on noticing it), then the
    lowest rank."""
    return min(failures, key=lambda rc: (rc[1] >= 0, rc[0]))


def _describe(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``opstrata-launch`` / ``python -m opstrata.comm.launch``; returns the exit code."""
    a = _parser().parse_args(argv)
    if a.nproc < 1 or a.nnodes < 1 or not 0 <= a.node_rank < a.nnodes:
        print(f"opstrata-launch: need --nproc >= 1 and 0 <= --node-rank < --nnodes, got {a}", file=sys.stderr)
        return 2
    if a.nnodes > 1 and a.master_port is None:
        print(
            "opstrata-launch: --master-port is required with --nnodes > 1 (same on every node)",
            file=sys.stderr,
        )
        return 2
    port = a.master_port or _free_port()
    job = os.environ.get("OPSTRATA_COMM_JOB_ID") or f"{uuid.uuid4().hex[:10]}"
    world = a.nproc * a.nnodes
    cmd = [sys.executable, "-u", *(["-m", a.script] if a.module else [a.script]), *a.args]
    procs: dict[int, subprocess.Popen] = {}
    tails: dict[int, collections.deque] = {}
    lock = threading.Lock()
    pumps = []
    for local in range(a.nproc):
        rank = a.node_rank * a.nproc + local
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(local),
            "WORLD_SIZE": str(world),
            "LOCAL_WORLD_SIZE": str(a.nproc),
            "GROUP_RANK": str(a.node_rank),
            "MASTER_ADDR": a.master_addr,
            "MASTER_PORT": str(port),
            "OPSTRATA_COMM_JOB_ID": job,
            "PYTHONUNBUFFERED": "1",
        }
        procs[rank] = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        tails[rank] = collections.deque(maxlen=10)
        th = threading.Thread(target=_pump, args=(rank, procs[rank].stdout, tails[rank], lock), daemon=True)
        th.start()
        pumps.append(th)
    failed: tuple[int, int] | None = None
    also_failed: list[tuple[int, int]] = []  # other ranks found failed in the same poll
    interrupted = False

    def _on_term(signum: int, _frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM to the launcher: terminate the ranks instead of orphaning them

    signal.signal(signal.SIGTERM, _on_term)
    try:
        while procs and failed is None:
            round_failed: list[tuple[int, int]] = []
            for rank, p in list(procs.items()):
                code = p.poll()
                if code is None:
                    continue
                del procs[rank]
                if code != 0:
                    round_failed.append((rank, code))
            if round_failed:  # ranks seen dead in one poll: a signal death is the likelier root cause
                failed = root_failure(round_failed)
                also_failed.extend(rc for rc in round_failed if rc != failed)
                break
            time.sleep(0.05)
    except KeyboardInterrupt:
        interrupted = True
    _terminate(procs, a.grace)
    for th in pumps:
        th.join(2.0)
    removed = cleanup_shm(job)
    if removed:
        print(f"opstrata-launch: removed leftover shared memory {removed}", file=sys.stderr)
    if failed is not None:
        rank, code = failed
        last = "\n".join(f"    {line}" for line in tails[rank]) or "    (no output)"
        also = "".join(f"; rank {r} also exited ({_describe(c)})" for r, c in also_failed)
        print(
            f"opstrata-launch: rank {rank} failed ({_describe(code)}){also}; terminated the other ranks. "
            f"Last lines of rank {rank}:\n{last}",
            file=sys.stderr,
        )
        return code if code > 0 else 128 - code
    if interrupted:
        print("opstrata-launch: interrupted; terminated all ranks", file=sys.stderr)
        return 130
    return 0


def _terminate(procs: dict[int, subprocess.Popen], grace: float) -> None:
    alive = [p for p in procs.values() if p.poll() is None]
    for p in alive:
        with contextlib.suppress(ProcessLookupError):
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + grace
    for p in alive:
        with contextlib.suppress(subprocess.TimeoutExpired):
            p.wait(max(0.0, deadline - time.monotonic()))
    for p in alive:
        if p.poll() is None:
            p.kill()
            p.wait()


if __name__ == "__main__":
    sys.exit(main())
