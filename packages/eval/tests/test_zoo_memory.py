"""Peak resident memory of a session, measured in a fresh process (zoo --memory)."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import onnx
import pytest

from opstrata.eval.zoo._memory import session_peak_mib
from opstrata.graph.testing import mlp_model

pytestmark = pytest.mark.skipif(
    not os.path.exists("/proc/self/clear_refs"), reason="Linux peak counters only"
)


def _model(tmp_path, hidden: int) -> str:
    path = tmp_path / f"mlp{hidden}.onnx"
    onnx.save(mlp_model(d_in=256, hidden=hidden, d_out=8), path)
    return str(path)


def test_a_bigger_model_costs_more_and_both_sides_report(tmp_path) -> None:
    x = np.random.default_rng(0).standard_normal((4, 256)).astype(np.float32)
    small = session_peak_mib("opstrata", _model(tmp_path, 32), x, "x")
    big = session_peak_mib("opstrata", _model(tmp_path, 8192), x, "x")  # + 8 MiB of float32 weights
    assert small is not None and big is not None and small >= 0
    assert big > small + 6, (small, big)
    if importlib.util.find_spec("onnxruntime") is not None:
        ort = session_peak_mib("onnxruntime", _model(tmp_path, 8192), x, "x")
        assert ort is not None and ort > 6


def test_bad_arguments_and_failing_children(tmp_path) -> None:
    x = np.zeros((4, 256), np.float32)
    with pytest.raises(ValueError, match="which must be 'opstrata' or 'onnxruntime'"):
        session_peak_mib("torch", _model(tmp_path, 32), x, "x")
    assert session_peak_mib("opstrata", str(tmp_path / "missing.onnx"), x, "x") is None  # the child fails
