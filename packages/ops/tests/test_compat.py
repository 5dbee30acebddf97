"""The import-time compatibility check between opstrata distributions."""

from __future__ import annotations

from importlib import metadata

import pytest

from opstrata.ops.compat import UNKNOWN_VERSION, check_compatible, opstrata_requirements

REQUIRES = ["numpy>=1.24", "opstrata-ops>=0.1,<0.2", "onnx>=1.14; extra == 'onnx'"]


def versions(**found: str):
    """A version lookup over a fixed table, raising PackageNotFoundError like importlib.metadata."""

    def version_of(name: str) -> str:
        try:
            return found[name.replace("-", "_")]
        except KeyError:
            raise metadata.PackageNotFoundError(name) from None

    return version_of


def test_only_opstrata_requirements_are_checked() -> None:
    names = [r.name for r in opstrata_requirements("opstrata-graph", REQUIRES)]
    assert names == ["opstrata-ops"]


def test_in_range_returns_own_version() -> None:
    lookup = versions(opstrata_graph="0.1.3", opstrata_ops="0.1.7")
    assert check_compatible("opstrata-graph", requires=REQUIRES, version_of=lookup) == "0.1.3"


@pytest.mark.parametrize("found", ["0.2.0", "0.0.9", "1.0.0"])
def test_out_of_range_names_both_packages_versions_and_fix(found: str) -> None:
    lookup = versions(opstrata_graph="0.1.3", opstrata_ops=found)
    with pytest.raises(ImportError) as info:
        check_compatible("opstrata-graph", requires=REQUIRES, version_of=lookup)
    msg = str(info.value)
    assert "opstrata-graph 0.1.3" in msg
    assert f"opstrata-ops {found} is installed" in msg
    assert "pip install 'opstrata-ops<0.2,>=0.1'" in msg


def test_missing_lower_package_is_named() -> None:
    lookup = versions(opstrata_graph="0.1.3")
    with pytest.raises(ImportError, match="opstrata-ops is not installed"):
        check_compatible("opstrata-graph", requires=REQUIRES, version_of=lookup)


def test_unparseable_requirement_is_reported() -> None:
    lookup = versions(opstrata_graph="0.1.3")
    with pytest.raises(ImportError, match="cannot parse"):
        check_compatible("opstrata-graph", requires=["opstrata-ops >>> 1"], version_of=lookup)


def test_source_tree_without_metadata_reports_unknown() -> None:
    assert check_compatible("opstrata-nonexistent", version_of=versions()) == UNKNOWN_VERSION


def test_installed_version_matches_metadata() -> None:
    import opstrata.ops as ops

    try:
        expected = metadata.version("opstrata-ops")
    except metadata.PackageNotFoundError:
        expected = UNKNOWN_VERSION
    assert ops.__version__ == expected
