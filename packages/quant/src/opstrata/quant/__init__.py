"""opstrata.quant — observers, calibration, int8/int4/fp8 schemes, quantized kernels, graph quantization.

>>> import numpy as np
>>> p = params_from_range(-1.0, 1.0, "int8", symmetric=True)
>>> quantize_array(np.array([0.5, -2.0], np.float32), p).tolist()
[64, -128]

Model level: ``quantize(model, calibration_data, scheme="w8a8", accuracy_budget=None) -> QuantizedModel``.
"""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-quant")

from ._api import QuantizedModel as QuantizedModel, quantize as quantize
from ._calibrate import calibrate as calibrate
from ._conv import PackedConv as PackedConv, prepack_conv as prepack_conv, qconv2d as qconv2d
from ._dtypes import QDType as QDType, qdtype as qdtype
from ._dynamic import quantize_dynamic as quantize_dynamic
from ._errors import (
    AccuracyError as AccuracyError,
    CalibrationError as CalibrationError,
    QuantError as QuantError,
)
from ._kernels import (
    get_qgemm_threads as get_qgemm_threads,
    install as _install_kernels,
    set_qgemm_threads as set_qgemm_threads,
)
from ._observers import (
    OBSERVERS as OBSERVERS,
    EntropyObserver as EntropyObserver,
    MinMaxObserver as MinMaxObserver,
    MovingAverageMinMaxObserver as MovingAverageMinMaxObserver,
    MSEObserver as MSEObserver,
    Observer as Observer,
    PercentileObserver as PercentileObserver,
    make_observer as make_observer,
)
from ._packing import pack_int4 as pack_int4, unpack_int4 as unpack_int4
from ._qgemm import (
    NativeUnavailableError as NativeUnavailableError,
    PackedWeight as PackedWeight,
    dynamic_qgemm as dynamic_qgemm,
    prepack_weight as prepack_weight,
    qgemm as qgemm,
)
from ._qparams import (
    QuantParams as QuantParams,
    dequantize as dequantize,
    params_from_range as params_from_range,
    quantize_array as quantize_array,
)
from ._quantize_report import (
    NodeReport as NodeReport,
    OutputReport as OutputReport,
    QuantizationReport as QuantizationReport,
)
from ._report import (
    OutputMetrics as OutputMetrics,
    QuantReport as QuantReport,
    accuracy_report as accuracy_report,
)
from ._smooth import smooth_model as smooth_model
from ._static import quantize_static as quantize_static
from ._weights import quantize_weights as quantize_weights
from ._wonly import (
    PackedDQWeight as PackedDQWeight,
    dq_matmul as dq_matmul,
    prepack_dq_weight as prepack_dq_weight,
)
from .native._library import (
    QGemmStatus as QGemmStatus,
    native_status as native_status,
    reset_native_stats as reset_native_stats,
)

_install_kernels()  # quant's native matmul_integer / qlinear_matmul on ops' cpu device

__all__ = [
    "OBSERVERS",
    "AccuracyError",
    "CalibrationError",
    "EntropyObserver",
    "MSEObserver",
    "MinMaxObserver",
    "MovingAverageMinMaxObserver",
    "NativeUnavailableError",
    "NodeReport",
    "Observer",
    "OutputMetrics",
    "OutputReport",
    "PackedConv",
    "PackedDQWeight",
    "PackedWeight",
    "PercentileObserver",
    "QDType",
    "QGemmStatus",
    "QuantError",
    "QuantParams",
    "QuantReport",
    "QuantizationReport",
    "QuantizedModel",
    "__version__",
    "accuracy_report",
    "calibrate",
    "dequantize",
    "dq_matmul",
    "dynamic_qgemm",
    "get_qgemm_threads",
    "make_observer",
    "native_status",
    "pack_int4",
    "params_from_range",
    "prepack_conv",
    "prepack_dq_weight",
    "prepack_weight",
    "qconv2d",
    "qdtype",
    "qgemm",
    "quantize",
    "quantize_array",
    "quantize_dynamic",
    "quantize_static",
    "quantize_weights",
    "reset_native_stats",
    "set_qgemm_threads",
    "smooth_model",
    "unpack_int4",
]
