"""`opstrata demo`, the README's main job: every step runs, every check passes, a failed check fails the exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import opstrata.runtime as rt
from opstrata.eval import _cli, _demo
from opstrata.eval._demo import STEPS, run_demo


def test_demo_runs_every_step_and_passes_its_checks(tmp_path: Path) -> None:
    lines: list[str] = []
    result = run_demo(tmp_path, tp=2, new_tokens=5, say=lines.append)
    assert result.ok, result.checks
    expected = {
        "memory plan within 1.05x of the lower bound",
        "session vs uncompiled graph",
        "tp=2 vs single process",
        "KV-cache greedy equals the no-cache recompute",
        "sampling reproducible by seed",
        "forked samples share the prompt's full blocks",
        "no kernel fell back",
    }
    assert expected <= set(result.checks)
    assert result.model_path is not None and result.model_path.stat().st_size > 0
    trace = json.loads(result.trace_path.read_text())  # Chrome trace format
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    assert len(result.tokens) == 5 and all(0 <= t < 97 for t in result.tokens)
    assert set(result.timings) == set(STEPS)
    # 2 prompts of 12 tokens + 4 cached tokens each, blocks of 8: 2 x 2 blocks, 32 slots for 32 tokens
    assert (result.kv_stats["used_blocks"], result.kv_stats["logical_tokens"]) == (4, 32)
    assert result.sample_stats["num_forks"] == 3 and result.sample_stats["shared_blocks"] == 1
    text = "\n".join(lines)
    assert "level 3:" in text and "arena" in text and "all checks passed" in text
    report = text[text.index("== report") :]
    assert f"{len(result.checks)}/{len(result.checks)} checks passed" in report
    for part in (
        "time ",
        "x the lower bound",
        "KV cache (greedy):",
        "waste",
        "KV cache (samples):",
        "trace: ",
    ):
        assert part in report, part
    assert f"[{len(STEPS)}/{len(STEPS)}] opstrata demo" in text  # the plain progress display
    assert "[5/5] tokens" in text


def test_demo_compares_with_onnxruntime_when_installed(tmp_path: Path) -> None:
    pytest.importorskip("onnxruntime")
    result = run_demo(tmp_path, new_tokens=1, say=lambda _: None)
    passed, detail = result.checks["session vs onnxruntime"]
    assert passed, detail
    assert result.ok, result.checks  # one new token: no fork appends, every prompt block stays shared


def test_demo_with_tqdm_draws_bars_on_stderr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("tqdm")
    lines: list[str] = []
    assert run_demo(tmp_path, new_tokens=2, progress_kind="tqdm", say=lines.append).ok
    err = capsys.readouterr().err
    assert "opstrata demo: 100%" in err and "tokens: 100%" in err
    assert not any("[8/8]" in line for line in lines)  # no plain lines when the bar is on


def test_a_failed_check_gives_exit_code_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = rt.generate

    def off_by_one(*args: object, **kwargs: object) -> rt.GenerateOutput:
        out = real(*args, **kwargs)
        out.new_tokens[0][-1] = (out.new_tokens[0][-1] + 1) % 97
        return out

    monkeypatch.setattr(_demo.rt, "generate", off_by_one)
    code = _cli.main(["demo", "--out", str(tmp_path), "--new-tokens", "2", "--progress", "plain"])
    out = capsys.readouterr().out
    assert code == 1
    assert "FAIL  KV-cache greedy equals the no-cache recompute: 1/2 prompts identical" in out
    assert "SOME CHECKS FAILED" in out


def test_demo_command_exit_code(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "opstrata.eval", "demo", "--out", str(tmp_path), "--level", "2", "--progress", "plain"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "all checks passed" in proc.stdout and "KV cache (greedy)" in proc.stdout
    assert (tmp_path / "model.onnx").is_file() and (tmp_path / "profile.json").is_file()


def test_demo_on_a_device_with_its_own_memory(tmp_path: Path) -> None:
    """--device: the stand-in for cuda (its kernels refuse host arrays) gives the cpu session's logits."""
    import opstrata.ops as ops
    import opstrata.ops.testing as ot
    import opstrata.runtime as rt

    if not hasattr(ot, "register_standin_device"):
        pytest.skip("opstrata-ops < 0.4.69 has no stand-in device")
    if not hasattr(rt.InferenceSession, "run_on_device"):
        pytest.skip("opstrata-runtime < 0.5.48 runs no sessions on a device with its own memory")
    lines: list[str] = []
    with ot.isolated_registry():
        dev = ot.register_standin_device("_demo_standin")
        result = run_demo(tmp_path, new_tokens=2, device=dev, say=lines.append)
        assert ops.fallback_report().count(device=dev) == 0
    assert result.ok, result.checks
    assert result.checks[f"{dev} session vs cpu session"][0]
    assert "device" in result.timings
    assert any("nodes on _demo_standin; on the host:" in line for line in lines)
    if hasattr(rt.InferenceSession, "device_arenas"):
        assert result.checks[f"{dev} run served from its device arena vs the first run"][0]
        assert any(
            line.startswith("   device arena: arena ") and "0 allocations off plan" in line for line in lines
        )


def test_demo_cli_refuses_an_absent_device(capsys: pytest.CaptureFixture[str]) -> None:
    from opstrata.eval import _cli

    assert _cli.main(["demo", "--device", "nosuch"]) == 2
    assert "--device 'nosuch' is not usable here" in capsys.readouterr().err


def test_demo_refuses_a_device_memory_the_runtime_cannot_run(tmp_path: Path, monkeypatch) -> None:
    import opstrata.ops.testing as ot
    import opstrata.runtime as rt

    if not hasattr(ot, "register_standin_device"):
        pytest.skip("opstrata-ops < 0.4.69 has no stand-in device")
    if hasattr(rt.InferenceSession, "run_on_device"):
        monkeypatch.delattr(rt.InferenceSession, "run_on_device")
    with ot.isolated_registry():
        dev = ot.register_standin_device("_demo_old_runtime")
        with pytest.raises(RuntimeError, match="cannot run sessions on a device with its own memory"):
            run_demo(tmp_path, new_tokens=2, device=dev, say=lambda _: None)
