"""examples/train_mlp.py: data-parallel training on 2 and 4 ranks reaches the single-process weights."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_mlp.py"
ARGS = ["--steps", "4", "--batch", "16", "--d-in", "8", "--hidden", "16", "--classes", "4", "--lr", "0.05"]


def _single_process(monkeypatch: pytest.MonkeyPatch) -> dict[str, np.ndarray]:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    spec = importlib.util.spec_from_file_location("train_mlp_example", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.main(ARGS)


@pytest.mark.parametrize("nproc", [2, 4])
def test_data_parallel_weights_equal_single_process(
    nproc: int, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    want = _single_process(monkeypatch)
    out = tmp_path / "w.npz"
    cap = ["--bucket-cap-mb", str(300 / 2**20)]  # small buckets: several async launches per step
    proc = subprocess.run(
        [sys.executable, "-m", "opstrata.comm.launch", "--nproc", str(nproc), str(SCRIPT), *ARGS, *cap,
         "--out", str(out)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "[rank 0] step    4" in proc.stdout and f"(world {nproc})" in proc.stdout
    got = np.load(out)
    assert sorted(got.files) == sorted(want)
    for k, w in want.items():
        assert not np.allclose(w, 0)  # trained weights, not a trivially equal zero
        np.testing.assert_allclose(got[k], w, rtol=1e-5, atol=1e-6, err_msg=k)


def test_batch_must_split_evenly(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "opstrata.comm.launch", "--nproc", "3", str(SCRIPT), *ARGS],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (
        proc.returncode != 0 and "--batch 16 must divide evenly across 3 ranks" in proc.stdout + proc.stderr
    )
