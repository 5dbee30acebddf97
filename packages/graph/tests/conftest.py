"""Peer-capability skips: what the installed onnx or onnxruntime cannot load is skipped, with its reason.

The tests build models at the opsets the ONNX spec defines today (Attention at 23, opset 25 and 28
cases). An older onnx or onnxruntime inside the declared ranges (``onnx>=…``, ``onnxruntime>=…`` in
pyproject.toml; the ``lowest`` nox session installs exactly those) cannot load such a model at all. The
failure is then not opstrata's: the peer says so itself, in one of a few fixed messages. This hook turns
exactly those failures into skips that name the peer, its version, the limit and what the test needed:

- onnxruntime without a kernel for the node ("Could not find an implementation for Add(14)": older
  releases lack some integer types);
- onnxruntime not knowing an attribute that onnx's schema of the op defines ("Unrecognized attribute:
  left_window_size for operator Attention", onnxruntime 1.30);
- onnxruntime rejecting a broadcast Attention mask (1.30: "inconsistent q_sequence_length (between
  attn_mask and Q)", "attn_mask must be 2D or 3D or 4D tensor"; the spec broadcasts both);
- onnxruntime refusing the model's opset ("Opset 25 is under development …, official support … till
  opset 23") or IR version ("Unsupported model IR version: 11, max supported IR version: 10");
- the installed onnx lacking an op (its reference evaluator, some tests' oracle: "No registered schema
  for operator 'SwiGLU'") or refusing a valid node in its shape inference (DFT with onesided and
  inverse, onnx < 1.19);
- opstrata refusing an opset beyond the installed onnx's newest (``from_onnx``/``to_onnx``: "opset 25 is
  outside … ..23", where 23 is ``onnx.defs.onnx_opset_version()``), and onnx's own helpers refusing it.

Any other failure stays a failure; see ``peer_limit`` and docs/releasing.md ("Third-party minimums").
"""

from __future__ import annotations

import re
from importlib import metadata

import pytest

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
