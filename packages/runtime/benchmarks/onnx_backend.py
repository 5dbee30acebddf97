"""Regenerate docs/onnx-backend.md's per-op table and tests/data/onnx_backend_expected.txt.

Runs ONNX's whole backend node suite through InferenceSession and onnxruntime. From the repository
root: ``python packages/runtime/benchmarks/onnx_backend.py`` (about 15 s on 2 cores). Exits 1 (and
names the cases) if any case gives a wrong answer or a stray exception; extra arguments go to
``opstrata.runtime.onnx_backend.main``; with ``--ops Relu Elu`` (a quick look at some ops) it only
prints their table and writes nothing.
"""

from __future__ import annotations

import sys
from pathlib import Path

from opstrata.runtime import onnx_backend

ROOT = Path(__file__).resolve().parents[3]

if __name__ == "__main__":
    if "--ops" in sys.argv[1:]:  # a partial run must not overwrite the whole suite's table and list
        sys.exit(onnx_backend.main(["--versus-ort", *sys.argv[1:]]))
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
