"""One MPI rank of a test: ``mpiexec -n N python _mpi_main.py OUT_DIR CASE CONFIG_JSON``.

Joins the default group with backend='mpi' (rank and world size from MPI), runs ``CASE(rank, world,
*args)`` from _mpi_cases / _cases and writes ``{"ok", "value", "error"}`` to OUT_DIR/rank<r>.json
(temp file + rename). CONFIG_JSON holds ``args``, ``timeout``, per-rank ``timeouts`` and ``init``.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def main() -> int:
    """Run the case on this rank and record its outcome."""
    out_dir, case, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    import _cases
    import _mpi_cases

    from opstrata import comm

    fn = getattr(_mpi_cases, case, None) or getattr(_cases, case)
    rank = -1
    try:
        from mpi4py import MPI

        rank = MPI.COMM_WORLD.Get_rank()
        timeout = config.get("timeouts", {}).get(str(rank), config.get("timeout", 30.0))
        store = os.path.join(out_dir, "store")  # config "init": "file" meets in a FileStore instead
        init = f"file://{store}" if config.get("init") == "file" else "env://"
        comm.init_process_group("mpi", timeout=timeout, init_method=init)
        result = {"ok": True, "value": fn(rank, comm.get_world_size(), *config.get("args", [])), "error": ""}
    except BaseException as e:  # reported to the test through the result file
        result = {"ok": False, "value": None, "error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    finally:
        try:
            comm.destroy_process_group()
        except Exception as e:  # destroy must not fail after a clean run
            result = {**result, "ok": False, "error": f"{result['error']}\ndestroy_process_group: {e!r}"}
    path = os.path.join(out_dir, f"rank{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(result, f)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
