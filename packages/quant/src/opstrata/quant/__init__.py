"""opstrata.quant — observers, calibration, int8/int4/fp8 schemes, quantized kernels, graph quantization."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-quant")

__all__ = ["__version__"]
