"""Errors raised by opstrata.quant: each names the node, tensor or argument, the expected, the actual and the fix."""

from __future__ import annotations

__all__ = ["AccuracyError", "CalibrationError", "QuantError"]


class QuantError(ValueError):
    """A bad argument or model for quantization: ``where: problem. Fix: fix``."""

    def __init__(self, where: str, problem: str, fix: str | None = None) -> None:
        self.where, self.problem, self.fix = where, problem, fix
        super().__init__(f"{where}: {problem}" + (f". Fix: {fix}" if fix else ""))


class CalibrationError(QuantError):
    """Calibration data that does not fit the model (missing or unknown inputs, empty data set)."""


class AccuracyError(QuantError):
    """A quantized model misses its accuracy contract; ``report`` holds the measured figures."""

    def __init__(self, where: str, problem: str, fix: str | None = None, report: object = None) -> None:
        super().__init__(where, problem, fix)
        self.report = report
