"""opstrata.comm — process groups, transports, collective algorithms, launcher, data-parallel helpers."""

from __future__ import annotations

from opstrata.ops.compat import check_compatible as _check_compatible

__version__: str = _check_compatible("opstrata-comm")

__all__ = ["__version__"]
