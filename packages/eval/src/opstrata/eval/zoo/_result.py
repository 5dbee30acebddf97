"""ZooResult: one row of the zoo (a model through one exporter), with its status derived from the numbers."""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["STATUSES", "ZooResult"]

#: ok: ran and agreed; wrong: ran and disagreed; refused: opstrata declined with a named reason;
#: export-failed: the torch exporter failed; crashed: opstrata raised something that is not a refusal,
#: or a kernel failed at run time on feeds that onnxruntime runs.
STATUSES = ("ok", "wrong", "refused", "export-failed", "crashed")


@dataclass
class ZooResult:
    """A zoo model through one exporter: graph size, timings, errors against the peers, refusal reason."""

    model: str
    exporter: str
    status: str = "ok"
    nodes: int | None = None  # nodes in the exported ONNX graph
    opset: int | None = None  # default-domain opset of the exported model
    import_s: float | None = None  # opstrata.graph.from_onnx
    compile_s: float | None = None  # opstrata.graph.compile + InferenceSession
    ort_create_s: float | None = None  # onnxruntime.InferenceSession(path) on the same file: its whole setup
    err_vs_ort: float | None = None  # max_rel_error(opstrata, onnxruntime), worst over the shapes
    err_vs_torch: float | None = None  # max_rel_error(opstrata, torch), worst over the shapes
    ort_vs_torch: float | None = None  # max_rel_error(onnxruntime, torch): how faithful the export is
    latency_ratio: float | None = None  # median opstrata / median onnxruntime, same threads (--bench)
    peak_mib: float | None = None  # peak resident MiB an opstrata session adds (--memory)
    ort_peak_mib: float | None = None  # the same for onnxruntime's session (--memory)
    threads: int = 1
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    fallbacks: int | None = None  # nodes bound to a fallback kernel (runs, but not natively)
    unsupported_ops: list[str] = field(default_factory=list)  # op types opstrata.graph does not import
    reason: str | None = None  # why the row is not ok: refusal, exporter failure, crash or the wrong output
    detail: str | None = None  # the full error text behind `reason`
    notes: list[str] = field(default_factory=list)  # e.g. onnxruntime could not run the model
    decode: dict[str, object] | None = None  # decoders with --bench: the decode row (KV cache vs torch eager)

    @property
    def refused(self) -> bool:
        """True when opstrata declined the model with a named reason (not a wrong answer)."""
        return self.status == "refused"

    @property
    def failed(self) -> bool:
        """True for a wrong answer or a crash: the rows that make `opstrata zoo run` exit 1."""
        return self.status in ("wrong", "crashed")

    def as_dict(self) -> dict[str, object]:
        """The row as plain JSON-ready values."""
        out = dict(self.__dict__)
        out["shapes"] = [list(s) for s in self.shapes]
        return out
