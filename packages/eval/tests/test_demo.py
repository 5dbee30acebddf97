"""`opstrata demo`, the README's main job: every step runs and every check passes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from opstrata.eval._demo import run_demo


def test_demo_runs_every_step_and_passes_its_checks(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_demo(tmp_path, tp=2, new_tokens=3, say=lines.append)
    assert result.ok, result.checks
    expected = {
        "memory plan within 1.05x of the lower bound",
        "session vs uncompiled graph",
        "tp=2 vs single process",
        "no kernel fell back",
    }
    assert expected <= set(result.checks)
    assert result.model_path is not None and result.model_path.stat().st_size > 0
    trace = json.loads(result.trace_path.read_text())  # Chrome trace format
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    assert len(result.tokens) == 3 and all(0 <= t < 97 for t in result.tokens)
    text = "\n".join(lines)
    assert "level 3:" in text and "arena" in text and "all checks passed" in text


def test_demo_compares_with_onnxruntime_when_installed(tmp_path: Path) -> None:
    import pytest

    pytest.importorskip("onnxruntime")
    result = run_demo(tmp_path, new_tokens=1, say=lambda _: None)
    passed, detail = result.checks["session vs onnxruntime"]
    assert passed, detail


def test_demo_command_exit_code(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "opstrata.eval", "demo", "--out", str(tmp_path), "--level", "2"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "all checks passed" in proc.stdout
    assert (tmp_path / "model.onnx").is_file() and (tmp_path / "profile.json").is_file()
