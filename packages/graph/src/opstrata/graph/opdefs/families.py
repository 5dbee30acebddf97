"""Loads every op family, so the registry's tables are complete (importing a family registers its ops)."""

from . import (  # noqa: F401
    attention,
    conv,
    elementwise,
    fused,
    linalg,
    norm,
    reduce,
    shape,
)
