"""Shared fixtures for the ops tests: every test runs against a restored registry and a clean audit.

And the peer-capability skips of graph's tests (packages/graph/tests/conftest.py lists them): a model the
installed onnx or onnxruntime cannot load at all (its opset or IR version is newer than the peer knows)
is skipped with the peer, its version and the limit; every other failure stays a failure.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="module")
def fma_lib() -> Any:
    """The native library with its AVX-512 GEMM tiles (the conv kernels' entry points); skips without them."""
    from opstrata.ops.native import library
    from opstrata.ops.native.kernels import fma_gemm_available

    built = library.library()
    if built is None or not fma_gemm_available(built):
        pytest.skip("the native library's AVX-512 tiles are not available on this machine")
    return built


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


# ---------------------------------------------------------------- peer-capability skips (as graph's)

_ORT_OPSET = re.compile(r"[Oo]pset (\d+) is (?:under development|not supported)")
_ORT_TILL = re.compile(r"till opset (\d+)")
_ORT_IR = re.compile(r"Unsupported model IR version: (\d+), max supported IR version: (\d+)")
_ORT_NO_KERNEL = re.compile(r"NOT_IMPLEMENTED : Could not find an implementation for (\w+\(\d+\))")
_ORT_NO_ATTR = re.compile(r"Unrecognized attribute: (\w+) for operator (\w+)")
_ONNX_NO_SCHEMA = re.compile(r"No registered schema for operator '(\w+)' and domain ''")
_ONNX_RANGE = re.compile(r"opset (\d+) is outside (?:the supported range 1|13)\.\.(\d+)")
_ONNX_NO_OP = re.compile(r"No (?:Op|schema) registered for (\w+) with domain_version of (\d+)")


def _version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def _onnx_newest() -> int | None:
    try:
        import onnx
    except ImportError:
        return None
    return onnx.defs.onnx_opset_version()


def _onnx_defines(op: str, attr: str) -> bool:
    """Whether the installed onnx's newest schema of ``op`` (default domain) has attribute ``attr``."""
    try:
        import onnx

        return attr in onnx.defs.get_schema(op, onnx.defs.onnx_opset_version()).attributes
    except Exception:  # onnx missing, or no such op: not a peer limit
        return False


def _onnx_has(op: str) -> bool:
    """Whether the installed onnx has a schema of ``op`` in the default domain."""
    try:
        import onnx

        return onnx.defs.has(op)
    except Exception:  # onnx missing: then it has no schema either
        return False


def peer_limit(exc: BaseException) -> str | None:
    """The skip reason when ``exc`` (or an exception it was raised from) is a peer's own capability limit."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        text = str(exc)
        kind = f"{type(exc).__module__}.{type(exc).__name__}"
        if kind.startswith("onnxruntime."):
            if m := _ORT_IR.search(text):
                return (
                    f"installed onnxruntime {_version('onnxruntime')} loads IR version <= {m[2]}; "
                    f"the test's model is IR version {m[1]} (written by onnx {_version('onnx')})"
                )
            if m := _ORT_NO_KERNEL.search(text):
                return (
                    f"installed onnxruntime {_version('onnxruntime')} has no CPU kernel for {m[1]} "
                    "with the test's input types, so there is nothing to compare against"
                )
            if "inconsistent q_sequence_length (between attn_mask and Q)" in text:
                return (
                    f"installed onnxruntime {_version('onnxruntime')} requires Attention's attn_mask to "
                    "spell out the query dimension; the ONNX spec (and the test) broadcast a size-1 one"
                )
            if "attn_mask must be 2D or 3D or 4D tensor" in text:
                return (
                    f"installed onnxruntime {_version('onnxruntime')} takes only 2-D to 4-D Attention masks; "
                    "the ONNX spec (and the test) broadcast a 1-D one"
                )
            if (m := _ORT_NO_ATTR.search(text)) and _onnx_defines(m[2], m[1]):
                return (
                    f"installed onnxruntime {_version('onnxruntime')} does not know {m[2]}'s attribute {m[1]}, "
                    f"which the installed onnx {_version('onnx')} defines"
                )
            if m := _ORT_OPSET.search(text):
                till = _ORT_TILL.search(text)
                known = f"knows opset <= {till[1]}" if till else f"cannot load opset {m[1]}"
                return f"installed onnxruntime {_version('onnxruntime')} {known}; the test needs opset {m[1]}"
        newest = _onnx_newest()
        if newest is not None:
            m = _ONNX_RANGE.search(text)
            if m and type(exc).__name__ == "GraphError" and int(m[2]) == newest and int(m[1]) > newest:
                return (
                    f"installed onnx {_version('onnx')} knows opset <= {newest}; the test needs opset {m[1]}"
                )
            m = _ONNX_NO_OP.search(text)
            if m and int(m[2]) > newest and kind.startswith("onnx."):
                return f"installed onnx {_version('onnx')} knows opset <= {newest}; {m[1]} needs opset {m[2]}"
            m = _ONNX_NO_SCHEMA.search(text)
            if m and isinstance(exc, NotImplementedError) and not _onnx_has(m[1]):
                return (
                    f"installed onnx {_version('onnx')} has no {m[1]} (knows opset <= {newest}): its "
                    "reference evaluator, the test's oracle, cannot run it"
                )
            if "is_onesided and inverse attributes cannot be enabled at the same time" in text:
                return (
                    f"installed onnx {_version('onnx')}'s DFT shape inference refuses onesided=1 with "
                    "inverse=1, which the opset-20 spec allows (newer onnx infers it)"
                )
            if isinstance(exc, ValueError) and text == "Unsupported opset-version.":
                return (
                    f"installed onnx {_version('onnx')} knows opset <= {newest}; the test builds a newer one"
                )
        exc = exc.__cause__ or exc.__context__
    return None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> object:
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None:
        reason = peer_limit(call.excinfo.value)
        if reason is not None:
            report.outcome = "skipped"
            report.longrepr = (str(item.path), item.location[1] or 0, f"Skipped: {reason}")
    return None
