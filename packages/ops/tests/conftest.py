"""Shared fixtures for the ops tests: every test runs against a restored registry and a clean audit."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from opstrata.ops import reset_fallback_report
from opstrata.ops.testing import isolated_registry

SRC = Path(__file__).resolve().parents[1] / "src"


@pytest.fixture(autouse=True)
def _isolated_registry() -> Iterator[None]:
    """Kernels, decompositions, devices, policy and audit registered by a test do not leak."""
    reset_fallback_report()
    with isolated_registry():
        yield


@pytest.fixture
def run_python():
    """Run a snippet in a fresh interpreter that imports opstrata.ops from this source tree."""

    def run(code: str, *, env: dict[str, str] | None = None, path: list[str] | None = None):
        full = {k: v for k, v in os.environ.items() if not k.startswith("OPSTRATA_")}
        full.update(env or {})
        full["PYTHONPATH"] = os.pathsep.join([*(path or []), str(SRC), full.get("PYTHONPATH", "")]).rstrip(
            os.pathsep
        )
        return subprocess.run(
            [sys.executable, "-c", code], env=full, capture_output=True, text=True, timeout=120
        )

    return run
