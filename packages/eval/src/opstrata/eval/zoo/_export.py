"""Export a zoo model to ONNX with either torch.onnx exporter, with dynamic batch (and sequence) axes."""

from __future__ import annotations

import contextlib
import io
import re
import warnings
from pathlib import Path
from typing import Any

from ._builders import build, require_torch
from ._specs import ModelSpec, get_spec

__all__ = ["EXPORTERS", "TORCHSCRIPT_OPSET", "ExportError", "example_input", "export_model", "short_reason"]

#: The two torch.onnx exporters: torch.export-based ("dynamo") and the TorchScript tracer.
EXPORTERS = ("dynamo", "torchscript")
TORCHSCRIPT_OPSET = 17
OUTPUT_NAME = "output"
_MAX_DIM = 1024
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ExportError(RuntimeError):
    """A torch.onnx exporter failed on a zoo model; names the model, the exporter and the cause."""

    def __init__(self, model: str, exporter: str, reason: str) -> None:
        self.model, self.exporter, self.reason = model, exporter, reason
        super().__init__(f"{exporter} export of {model} failed: {reason}")


def short_reason(exc: BaseException, limit: int = 400) -> str:
    """One readable line from an exception: the exporter's "Exception summary" when it has one."""
    text = _ANSI.sub("", str(exc)).strip()
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        if line.startswith("## Exception summary") and i + 1 < len(lines):
            lines = lines[i + 1 :]
            break
    first = lines[0] if lines else ""
    line = f"{type(exc).__name__}: {first}" if first else type(exc).__name__
    return line if len(line) <= limit else line[: limit - 1] + "…"


def example_input(spec: ModelSpec, shape: tuple[int, ...], seed: int = 0) -> Any:
    """A deterministic torch input of `shape` for `spec`: N(0, 1) pixels or uniform token ids."""
    torch = require_torch()
    gen = torch.Generator().manual_seed(seed)
    if spec.input_kind == "image":
        return torch.randn(shape, generator=gen, dtype=torch.float32)
    return torch.randint(0, spec.vocab, shape, generator=gen, dtype=torch.int64)


def _dynamic_axes(spec: ModelSpec) -> dict[int, str]:
    """Axis index -> symbolic name of the dynamic axes of the input (and output)."""
    return {0: "batch"} if spec.input_kind == "image" else {0: "batch", 1: "seq"}


def _export_dynamo(model: Any, x: Any, spec: ModelSpec, path: Path) -> None:
    torch = require_torch()
    dims = {axis: torch.export.Dim(name, min=1, max=_MAX_DIM) for axis, name in _dynamic_axes(spec).items()}
    torch.onnx.export(
        model, (x,), str(path), dynamo=True, input_names=[spec.input_name], output_names=[OUTPUT_NAME],
        dynamic_shapes=(dims,), external_data=False, verbose=False, report=False,
    )  # fmt: skip


def _export_torchscript(model: Any, x: Any, spec: ModelSpec, path: Path) -> None:
    torch = require_torch()
    axes = _dynamic_axes(spec)
    torch.onnx.export(
        model, (x,), str(path), dynamo=False, opset_version=TORCHSCRIPT_OPSET, input_names=[spec.input_name],
        output_names=[OUTPUT_NAME], dynamic_axes={spec.input_name: axes, OUTPUT_NAME: dict(axes)},
    )  # fmt: skip


def export_model(
    name: str, exporter: str = "dynamo", out_dir: str | Path = ".", *, model: Any = None
) -> Path:
    """Build `name` (or take the built `model`) and export it to ``out_dir/<name>.<exporter>.onnx``.

    The example input is the spec's largest shape (batch 2), since torch.export specialises a
    dimension of size 1. Raises ExportError (model, exporter, one-line cause) when the exporter fails.
    """
    spec = get_spec(name)
    if exporter not in EXPORTERS:
        raise ValueError(f"unknown exporter {exporter!r}; use one of {', '.join(EXPORTERS)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{name}.{exporter}.onnx"
    module = model if model is not None else build(spec.builder)
    x = example_input(spec, max(spec.shapes, key=lambda s: s[0]))
    export = _export_dynamo if exporter == "dynamo" else _export_torchscript
    chatter = io.StringIO()  # the exporters print progress lines and, failing, whole graphs: keep them quiet
    try:  # grad stays on, as in a plain export: under no_grad nn.MultiheadAttention takes a fused fast path
        quiet = contextlib.redirect_stdout(chatter), contextlib.redirect_stderr(chatter)
        with warnings.catch_warnings(), quiet[0], quiet[1]:
            warnings.simplefilter("ignore")
            export(module, x, spec, path)
    except Exception as exc:
        path.unlink(missing_ok=True)
        raise ExportError(name, exporter, short_reason(exc)) from exc
    if not path.is_file():
        raise ExportError(name, exporter, f"the exporter returned but wrote no file at {path}")
    return path
