"""Progress display: plain lines, the tqdm bar, and the auto choice."""

from __future__ import annotations

import io

import pytest

from opstrata.eval import _cli, _progress
from opstrata.eval._progress import PlainProgress, progress, resolve_progress


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_prints_every_step_of_short_jobs_and_quarters_of_long_ones() -> None:
    lines: list[str] = []
    with PlainProgress(3, "steps", lines.append) as bar:
        for note in ("a", "b", ""):
            bar.update(1, note)
    assert lines == ["   [1/3] steps: a", "   [2/3] steps: b", "   [3/3] steps"]
    lines.clear()
    bar = PlainProgress(16, "tokens", lines.append)
    for _ in range(16):
        bar.update()
    assert lines == [f"   [{n}/16] tokens" for n in (4, 8, 12, 16)]


def test_auto_picks_tqdm_only_on_a_terminal_with_tqdm_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("tqdm")
    assert resolve_progress("auto", io.StringIO()) == "plain"
    assert resolve_progress("auto", _Tty()) == "tqdm"
    assert resolve_progress("plain", _Tty()) == "plain"
    stream = io.StringIO()
    with progress("tqdm", 2, "work", stream=stream) as bar:
        bar.update(2, "done")
    assert "work: 100%" in stream.getvalue() and "done" in stream.getvalue()
    monkeypatch.setattr(_progress.importlib.util, "find_spec", lambda name: None)
    assert resolve_progress("auto", _Tty()) == "plain"  # no tqdm: plain even on a terminal


def test_asking_for_tqdm_without_it_is_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_progress.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match=r"pip install 'opstrata-eval\[progress\]'"):
        resolve_progress("tqdm")
    with pytest.raises(ValueError, match="expected one of"):
        resolve_progress("fancy")
    assert _cli.main(["demo", "--progress", "tqdm"]) == 2
    assert "needs the tqdm package" in capsys.readouterr().err
