"""opstrata-eval as an installed distribution: version metadata and the import-time range check."""

from __future__ import annotations

from importlib import metadata

import pytest

import opstrata.eval as pkg
from opstrata.ops.testing import import_with_fake_lower


def _installed_version() -> str:
    try:
        return metadata.version("opstrata-eval")
    except metadata.PackageNotFoundError:
        pytest.skip("opstrata-eval has no installed metadata (run the tests through nox)")


def test_version_comes_from_installed_metadata() -> None:
    assert pkg.__version__ == _installed_version()


@pytest.mark.parametrize("lower", ["opstrata-ops", "opstrata-quant"])
def test_import_rejects_out_of_range_lower_package(tmp_path, lower: str) -> None:
    own = _installed_version()
    result = import_with_fake_lower("opstrata.eval", lower, "9.0.0", tmp_path)
    assert result.returncode != 0
    assert f"opstrata-eval {own} requires {lower}" in result.stderr
    assert f"{lower} 9.0.0 is installed" in result.stderr
    assert f"pip install '{lower}" in result.stderr


def test_import_accepts_in_range_lower_package(tmp_path) -> None:
    _installed_version()
    installed = metadata.version("opstrata-quant")
    result = import_with_fake_lower("opstrata.eval", "opstrata-quant", installed, tmp_path)
    assert result.returncode == 0, result.stderr
