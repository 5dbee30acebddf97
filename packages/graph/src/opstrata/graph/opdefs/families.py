"""Loads every op family, so the registry's tables are complete (importing a family registers its ops)."""

from . import (  # noqa: F401
    activation,
    attention,
    conv,
    elementwise,
    fused,
    indexing,
    layout,
    linalg,
    math,
    norm,
    reduce,
    shape,
)
