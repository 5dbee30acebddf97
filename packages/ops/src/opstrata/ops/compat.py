"""Import-time version compatibility check between opstrata distributions (as jax checks jaxlib).

Each opstrata package calls :func:`check_compatible` with its own distribution name when it is
imported: the installed versions of the lower opstrata packages must satisfy the ranges that the
package declared in its metadata, otherwise the import fails with the pip command that fixes it.
"""

from __future__ import annotations

from collections.abc import Callable
from importlib import metadata

from packaging.requirements import InvalidRequirement, Requirement
from packaging.version import InvalidVersion, Version

__all__ = ["UNKNOWN_VERSION", "check_compatible", "opstrata_requirements"]

#: Version reported when a package runs from a source tree without installed metadata.
UNKNOWN_VERSION = "0+unknown"


def opstrata_requirements(dist: str, requires: list[str] | None = None) -> list[Requirement]:
    """The ``opstrata-*`` requirements (without extras markers) that ``dist`` declares."""
    if requires is None:
        requires = metadata.requires(dist) or []
    reqs = []
    for text in requires:
        try:
            req = Requirement(text)
        except InvalidRequirement as exc:  # metadata written by a broken build
            raise ImportError(f"{dist}: cannot parse its declared requirement {text!r}: {exc}") from exc
        if req.name.startswith("opstrata-") and (req.marker is None or req.marker.evaluate()):
            reqs.append(req)
    return reqs


def check_compatible(
    dist: str,
    *,
    requires: list[str] | None = None,
    version_of: Callable[[str], str] = metadata.version,
) -> str:
    """Check that the installed lower opstrata packages satisfy ``dist``'s ranges; return its version.

    Raises ImportError naming both packages, both versions and the pip command that fixes it.
    Running from a source tree (no installed metadata for ``dist``) skips the check and returns
    :data:`UNKNOWN_VERSION`, so ``PYTHONPATH=src`` development still imports.
    """
    try:
        own = version_of(dist)
    except metadata.PackageNotFoundError:
        return UNKNOWN_VERSION
    for req in opstrata_requirements(dist, requires):
        try:
            found = version_of(req.name)
        except metadata.PackageNotFoundError:
            raise ImportError(
                f"{dist} {own} requires {req.name}{req.specifier}, but {req.name} is not installed. "
                f"Fix: pip install '{req.name}{req.specifier}'"
            ) from None
        try:
            ok = Version(found) in req.specifier
        except InvalidVersion:
            ok = False
        if not ok:
            raise ImportError(
                f"{dist} {own} requires {req.name}{req.specifier}, but {req.name} {found} is installed. "
                f"Fix: pip install '{req.name}{req.specifier}' (or install a {dist} release whose "
                f"range admits {req.name} {found})"
            )
    return own
