"""Peak resident memory of a session on a model, opstrata beside onnxruntime, each in a fresh process.

A child process loads the runtime and the feed, notes its resident size, resets the kernel's peak
counter (``/proc/self/clear_refs``), builds the session and runs it twice; the peak resident size
(``VmHWM``) minus the size before is what the session cost: weights as loaded, the plan or arena, the
kernels' scratch. Linux only (the counters are Linux's); elsewhere None.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

__all__ = ["MEMORY_TIMEOUT_S", "session_peak_mib"]

#: a measurement that takes longer is abandoned (its side reports None)
MEMORY_TIMEOUT_S = 300.0

_CHILD = r"""
import json, sys
import numpy as np

which, model, feed_path, name, threads = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
x = np.load(feed_path)
if which == "opstrata":
    from opstrata.runtime import InferenceSession, SessionOptions
    make = lambda: InferenceSession(model, SessionOptions(intra_op_num_threads=threads))
else:
    import onnxruntime as ort
    def make():
        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        return ort.InferenceSession(model, so, providers=["CPUExecutionProvider"])

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])  # kB
    raise KeyError(key)

base = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak resident size restarts from the current one
sess = make()
for _ in range(2):
    sess.run(None, {name: x})
print(json.dumps({"peak_kib": status("VmHWM") - base}))
"""


def session_peak_mib(
    which: str, model: str | Path, feed: np.ndarray, input_name: str, threads: int = 1
) -> float | None:
    """Peak resident MiB a session of ``which`` ("opstrata" or "onnxruntime") adds while it is built and
    run twice on ``feed``, measured in a fresh process; None off Linux, when that runtime is absent or the
    child fails (its error is not this row's concern: the run itself is checked elsewhere)."""
    if which not in ("opstrata", "onnxruntime"):
        raise ValueError(f"which must be 'opstrata' or 'onnxruntime', got {which!r}")
    if not os.path.exists("/proc/self/clear_refs"):
        return None
    with tempfile.TemporaryDirectory() as tmp:
        feed_path = Path(tmp) / "feed.npy"
        np.save(feed_path, feed)
        cmd = [sys.executable, "-c", _CHILD, which, str(model), str(feed_path), input_name, str(threads)]
        env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=MEMORY_TIMEOUT_S, env=env)
        except subprocess.TimeoutExpired:
            return None
    if done.returncode != 0:
        return None
    try:
        return json.loads(done.stdout.strip().splitlines()[-1])["peak_kib"] / 1024.0
    except (ValueError, KeyError, IndexError):
        return None
