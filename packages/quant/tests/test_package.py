"""opstrata-quant as an installed distribution: version metadata and the import-time range check."""

from __future__ import annotations

from importlib import metadata

import pytest

import opstrata.quant as pkg
from opstrata.ops.testing import import_with_fake_lower


def _installed_version() -> str:
    try:
        return metadata.version("opstrata-quant")
    except metadata.PackageNotFoundError:
        pytest.skip("opstrata-quant has no installed metadata (run the tests through nox)")


def test_version_comes_from_installed_metadata() -> None:
    assert pkg.__version__ == _installed_version()


def test_import_rejects_out_of_range_lower_package(tmp_path) -> None:
    own = _installed_version()
    result = import_with_fake_lower("opstrata.quant", "opstrata-runtime", "9.0.0", tmp_path)
    assert result.returncode != 0
    assert f"opstrata-quant {own} requires opstrata-runtime" in result.stderr
    assert "opstrata-runtime 9.0.0 is installed" in result.stderr
    assert "pip install 'opstrata-runtime" in result.stderr


def test_import_accepts_in_range_lower_package(tmp_path) -> None:
    _installed_version()
    installed = metadata.version("opstrata-runtime")
    result = import_with_fake_lower("opstrata.quant", "opstrata-runtime", installed, tmp_path)
    assert result.returncode == 0, result.stderr
