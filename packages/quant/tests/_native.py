"""The skip mark of tests that need quant's C library built on this machine."""

from __future__ import annotations

import os
import shutil

import pytest

#: no C compiler (or OPSTRATA_NATIVE=off): the int8 library cannot be built, so its tests cannot run
needs_native = pytest.mark.skipif(
    shutil.which((os.environ.get("CC") or "cc").split()[0]) is None
    or os.environ.get("OPSTRATA_NATIVE") == "off",
    reason="no C compiler on this machine (or OPSTRATA_NATIVE=off): the int8 library cannot be built",
)
