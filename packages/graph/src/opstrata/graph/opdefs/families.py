"""Loads every op family, so the registry's tables are complete (importing a family registers its ops)."""

from . import (  # noqa: F401
    activation,
    attention,
    control,
    conv,
    detection,
    elementwise,
    extra_attention,
    fused,
    indexing,
    layout,
    linalg,
    loss,
    math,
    norm,
    quantize,
    random,
    recurrent,
    reduce,
    roi,
    sampling,
    sequence,
    shape,
    signal,
    strings,  # after elementwise: takes over Equal's importer for string inputs
    text,
)
