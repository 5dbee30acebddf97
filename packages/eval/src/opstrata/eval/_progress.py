"""Progress display for long CLI jobs: a tqdm bar when available, else plain lines a log can keep.

``progress(kind, total, desc, say=...)`` returns a context manager whose ``update(n, note)``
advances the display. ``kind`` is ``"tqdm"`` (needs ``pip install 'opstrata-eval[progress]'``),
``"plain"`` (one line per update through ``say``) or ``"auto"``: tqdm when it is installed and
stderr is a terminal, plain otherwise (CI logs and pipes get readable lines, not carriage returns).
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from typing import Any, TextIO

__all__ = ["PROGRESS_KINDS", "PlainProgress", "TqdmProgress", "progress", "resolve_progress"]

PROGRESS_KINDS = ("auto", "tqdm", "plain")


def resolve_progress(kind: str, stream: TextIO | None = None) -> str:
    """The concrete display for ``kind``: ``"tqdm"`` or ``"plain"``; ValueError when tqdm is asked for but missing."""
    if kind not in PROGRESS_KINDS:
        raise ValueError(f"progress: expected one of {PROGRESS_KINDS}, got {kind!r}")
    has_tqdm = importlib.util.find_spec("tqdm") is not None
    if kind == "tqdm" and not has_tqdm:
        raise ValueError(
            "progress: --progress tqdm needs the tqdm package, which is not installed. "
            "Fix: pip install 'opstrata-eval[progress]', or pass --progress plain"
        )
    if kind == "auto":
        stream = sys.stderr if stream is None else stream
        return "tqdm" if has_tqdm and getattr(stream, "isatty", lambda: False)() else "plain"
    return kind


class PlainProgress:
    """``[done/total] desc: note`` lines through ``say``: every update up to 10 steps, else about every quarter."""

    def __init__(self, total: int, desc: str, say: Callable[[str], None], indent: str = "   ") -> None:
        self.total, self.desc, self.say, self.indent, self.n = total, desc, say, indent, 0
        self.every = 1 if total <= 10 else -(-total // 4)
        self._shown = 0

    def update(self, n: int = 1, note: str = "") -> None:
        self.n += n
        if self.n - self._shown >= self.every or self.n >= self.total:
            self._shown = self.n
            self.say(f"{self.indent}[{self.n}/{self.total}] {self.desc}" + (f": {note}" if note else ""))

    def close(self) -> None:
        pass

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TqdmProgress:
    """A tqdm bar on stderr (stdout stays clean for the report)."""

    def __init__(self, total: int, desc: str, stream: TextIO | None = None) -> None:
        from tqdm import tqdm

        self.bar: Any = tqdm(
            total=total, desc=desc, file=stream or sys.stderr, leave=True, dynamic_ncols=True
        )

    def update(self, n: int = 1, note: str = "") -> None:
        if note:
            self.bar.set_postfix_str(note, refresh=False)
        self.bar.update(n)

    def close(self) -> None:
        self.bar.close()

    def __enter__(self) -> TqdmProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def progress(
    kind: str, total: int, desc: str, *, say: Callable[[str], None] = print, stream: TextIO | None = None
) -> PlainProgress | TqdmProgress:
    """A progress display of ``total`` steps (``kind`` as in :func:`resolve_progress`)."""
    if resolve_progress(kind, stream) == "tqdm":
        return TqdmProgress(total, desc, stream)
    return PlainProgress(total, desc, say)
