"""Regenerate docs/onnx-backend.md's per-op table and tests/data/onnx_backend_expected.txt.

Run from the repository root: ``python packages/runtime/benchmarks/onnx_backend.py`` (about 15 s).
Exits 1 (and names the cases) if any case gives a wrong answer or a stray exception.
"""

from __future__ import annotations

import sys
from pathlib import Path

from opstrata.runtime import onnx_backend

ROOT = Path(__file__).resolve().parents[3]

if __name__ == "__main__":
    sys.exit(
        onnx_backend.main(
            [
                "--write", str(ROOT / "docs" / "onnx-backend.md"),
                "--expected", str(ROOT / "packages" / "runtime" / "tests" / "data" / "onnx_backend_expected.txt"),
                "--versus-ort",
                *sys.argv[1:],
            ]
        )
    )  # fmt: skip
