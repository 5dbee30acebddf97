"""Which lower releases can really be installed together: the resolver behind `lock.py check`'s
[uninstallable-bound], `lock.py tighten`, the compat matrix and `release.py plan`.

A package's candidates are its releases recorded in versions.lock (their own ranges read from the
pyproject.toml in the recorded tree, `git show <tree>:pyproject.toml`) plus its current version in the
working tree. A declared range is honest when the oldest release it admits can be installed together
with the package's other declared ranges, the lower packages resolved consistently (every chosen
release's own ranges hold too) — what pip or uv would find, computed offline from the lock.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lockfile as lf
from lockfile import LockError
from packaging.specifiers import SpecifierSet
from packaging.version import Version

CURRENT = "current"


@dataclass(eq=False)
class Candidate:
    """One installable version of one package: a recorded release or the working tree's current version."""

    package: str
    version: str
    requires: dict[str, str] = field(default_factory=dict)  # lower short name -> specifier text
    source: str = CURRENT  # "current" (working tree) or the release's git tree hash

    @property
    def current(self) -> bool:
        return self.source == CURRENT

    def label(self) -> str:
        return f"{self.package} {self.version}" + (" (working tree)" if self.current else "")


@dataclass(frozen=True)
class BoundProblem:
    """A declared lower bound whose release cannot be installed with the package's other ranges."""

    package: str
    lower: str
    spec: str  # the declared range
    release: str  # the oldest version the range admits (uninstallable)
    reason: str
    replacement: str | None  # oldest admitted version that is installable, None when there is none
    new_spec: str | None  # the range with its lower bound raised to `replacement`


def _admits(spec: str, version: str) -> bool:
    return SpecifierSet(spec).contains(version, prereleases=True)


@functools.lru_cache(maxsize=512)
def _tree_requires(repo_root: str, tree: str) -> tuple[tuple[str, str], ...]:
    """The opstrata ranges declared by the pyproject.toml stored in a release tree."""
    try:
        text = lf.git(repo_root, "show", f"{tree}:pyproject.toml")
    except LockError as e:
        raise LockError(
            f"cannot read pyproject.toml of release tree {tree[:12]} ({e}); the compat resolver needs every "
            "recorded release tree in this clone's object db (fetch full history, not a shallow clone; a tree "
            "released but never committed: `python tools/lock.py relink PACKAGE VERSION`)"
        ) from None
    doc = lf.parse_toml(text, f"{tree[:12]}:pyproject.toml")
    problems: list[str] = []
    deps = doc.get("project", {}).get("dependencies", [])
    requires = lf._opstrata_requires(Path(f"{tree[:12]}:pyproject.toml"), deps, problems)
    if problems:
        raise LockError("\n".join(problems), problems)
    return tuple(requires.items())


def release_requires(repo_root: Path | str, tree: str) -> dict[str, str]:
    """Short name -> range declared by the release stored in `tree`."""
    return dict(_tree_requires(str(repo_root), tree))


class Universe:
    """Every candidate of every package, and the declared ranges of the current versions (editable for tighten)."""

    def __init__(
        self, repo_root: Path | str, lock: Mapping[str, Any], current: Mapping[str, tuple[str, dict]]
    ):
        self.root = Path(repo_root)
        self.lock = lock
        self.layers = [str(x) for x in lock["layers"]]
        self.requires: dict[str, dict[str, str]] = {n: dict(current[n][1]) for n in self.layers}
        self.candidates: dict[str, list[Candidate]] = {}
        for name in self.layers:
            version = current[name][0]
            # the current candidate shares the requires dict: tighten's edits are seen by the uppers
            cands = [Candidate(name, version, self.requires[name], CURRENT)]
            releases = lock["packages"][name].get("releases", {})
            for v in reversed(lf.released_versions(lock, name)):  # newest first: the resolver's preference
                tree = str(releases[v]["tree"])
                cands.append(Candidate(name, v, release_requires(self.root, tree), tree))
            self.candidates[name] = cands

    @classmethod
    def from_lock(cls, repo_root: Path | str, lock: Mapping[str, Any]) -> Universe:
        """Current versions and ranges as versions.lock records them."""
        current = {
            str(n): (str(t["version"]), {str(k): str(v) for k, v in t["requires"].items()})
            for n, t in lock["packages"].items()
        }
        return cls(repo_root, lock, current)

    @classmethod
    def from_pyprojects(
        cls, repo_root: Path | str, lock: Mapping[str, Any], pyprojects: Mapping[str, lf.PyProject]
    ) -> Universe:
        """Current versions and ranges from the pyprojects (the lock's where a pyproject is missing)."""
        base = cls.from_lock(repo_root, lock)
        current = {n: (base.candidates[n][0].version, base.requires[n]) for n in base.layers}
        for n, pp in pyprojects.items():
            current[n] = (pp.version, dict(pp.requires))
        return cls(repo_root, lock, current)

    # ------------------------------------------------------------ resolving

    def resolve(self, package: str, pin: Candidate | None = None) -> dict[str, Candidate] | None:
        """A consistent choice of every package below `package` that its ranges need, or None.

        `pin` fixes one lower package to that candidate. Preference: the working-tree version first,
        then releases newest first — the others are resolved as an installer would, consistently.
        """
        below = list(reversed(self.layers[: self.layers.index(package)]))  # highest first: ranges point down
        top = self.requires[package]

        def rec(i: int, constraints: dict[str, list[str]], chosen: dict[str, Candidate]):
            if i == len(below):
                return dict(chosen)
            name = below[i]
            specs = constraints.get(name, [])
            if not specs and (pin is None or pin.package != name):
                return rec(i + 1, constraints, chosen)  # nothing needs it
            options = [pin] if pin is not None and pin.package == name else self.candidates[name]
            for cand in options:
                if not all(_admits(s, cand.version) for s in specs):
                    continue
                if any(
                    low in chosen and not _admits(s, chosen[low].version) for low, s in cand.requires.items()
                ):
                    continue
                nxt = {k: list(v) for k, v in constraints.items()}
                for low, s in cand.requires.items():
                    nxt.setdefault(low, []).append(s)
                found = rec(i + 1, nxt, {**chosen, name: cand})
                if found is not None:
                    return found
            return None

        return rec(0, {low: [s] for low, s in top.items()}, {})

    def installable(self, package: str, lower: str, version: str, *, released_only: bool = False) -> bool:
        """True if some candidate of `lower` at `version` resolves with `package`'s ranges."""
        return any(
            self.resolve(package, c) is not None
            for c in self.candidates[lower]
            if c.version == version and not (released_only and c.current)
        )

    def admitted(self, package: str, lower: str, *, released_only: bool = False) -> list[str]:
        """Versions of `lower` that `package`'s range admits, oldest first."""
        spec = self.requires[package].get(lower)
        if spec is None or lower not in self.candidates:
            return []
        versions = {
            c.version
            for c in self.candidates[lower]
            if _admits(spec, c.version) and not (released_only and c.current)
        }
        return sorted(versions, key=Version)

    def explain(self, package: str, lower: str, version: str) -> str:
        """Why `lower` `version` cannot be installed with `package`'s other ranges (one sentence)."""
        top = self.requires[package]
        cands = [c for c in self.candidates[lower] if c.version == version]
        cand = next((c for c in cands if not c.current), cands[0])
        for low, spec in cand.requires.items():
            if low not in self.candidates:
                continue
            ours = top.get(low)
            both = [
                c
                for c in self.candidates[low]
                if _admits(spec, c.version) and (ours is None or _admits(ours, c.version))
            ]
            if not both and ours is not None:
                return f"{lower} {version} requires opstrata-{low}{spec}, but {package} requires opstrata-{low}{ours}"
            if not both:
                return f"{lower} {version} requires opstrata-{low}{spec}, which no release of {low} satisfies"
        others = ", ".join(f"opstrata-{low}{s}" for low, s in top.items() if low != lower) or "none"
        return (
            f"no consistent set of releases of the other lower packages satisfies both {lower} {version}'s "
            f"ranges {cand.requires or '{}'} and {package}'s ({others})"
        )

    # ------------------------------------------------------------ the checks built on it

    def bound_problems(self, package: str) -> list[BoundProblem]:
        """Each declared range of `package` whose oldest admitted version cannot be installed."""
        out = []
        for lower, spec in self.requires[package].items():
            versions = self.admitted(package, lower)
            if not versions or self.installable(package, lower, versions[0]):
                continue
            replacement = next((v for v in versions[1:] if self.installable(package, lower, v)), None)
            new_spec = raise_lower_bound(spec, replacement) if replacement else None
            out.append(
                BoundProblem(
                    package,
                    lower,
                    spec,
                    versions[0],
                    self.explain(package, lower, versions[0]),
                    replacement,
                    new_spec,
                )
            )
        return out

    def matrix(self) -> list[tuple[str, str, str]]:
        """(package, lower, version): the oldest release each range admits and the newest installable one."""
        out: list[tuple[str, str, str]] = []
        for name in self.layers:
            for lower in self.requires[name]:
                versions = self.admitted(name, lower, released_only=True)
                if not versions:
                    continue
                newest = next(
                    (v for v in reversed(versions) if self.installable(name, lower, v, released_only=True)),
                    versions[-1],
                )
                for v in dict.fromkeys([versions[0], newest]):
                    out.append((name, lower, v))
        return out

    def resolve_row(self, package: str, lower: str, version: str) -> dict[str, Candidate] | None:
        """What a compat session installs for one matrix row: the released `lower` `version`, the rest resolved."""
        for cand in self.candidates[lower]:
            if cand.version == version and not cand.current:
                found = self.resolve(package, cand)
                if found is not None:
                    return found
        return None


def raise_lower_bound(spec: str, version: str) -> str:
    """`spec` with its lower bound replaced by `>=version` (`0.4.0` is written `0.4`), other clauses kept."""
    v = Version(version)
    short = f"{v.major}.{v.minor}" if v.micro == 0 and str(v) == f"{v.major}.{v.minor}.0" else str(v)
    out: list[str] = []
    placed = False
    for clause in (c.strip() for c in spec.split(",")):
        if not clause:
            continue
        if clause.startswith(">") and not clause.startswith(">=="):
            if not placed:
                out.append(f">={short}")
                placed = True
            continue
        out.append(clause)
    if not placed:
        out.insert(0, f">={short}")
    return ",".join(out)


def tighten(
    universe: Universe, rounds: int = 10
) -> tuple[dict[str, dict[str, tuple[str, str]]], list[BoundProblem]]:
    """Raise every uninstallable lower bound to the oldest installable release, until none is left.

    Returns ({package: {lower: (old range, new range)}}, problems no bound can fix). The universe's
    ranges are edited in place (a raised bound of one package can change what is installable above it,
    hence the rounds).
    """
    changes: dict[str, dict[str, tuple[str, str]]] = {}
    for _ in range(rounds):
        problems = [p for name in universe.layers for p in universe.bound_problems(name)]
        fixable = [p for p in problems if p.new_spec]
        if not fixable:
            return changes, problems
        for p in fixable:
            old = changes.get(p.package, {}).get(p.lower, (p.spec, p.spec))[0]
            universe.requires[p.package][p.lower] = str(p.new_spec)
            changes.setdefault(p.package, {})[p.lower] = (old, str(p.new_spec))
    return changes, [p for name in universe.layers for p in universe.bound_problems(name)]


def set_requirement(text: str, path: Path | str, lower: str, spec: str) -> str:
    """pyproject.toml text with the range of its opstrata-<lower> dependency replaced (extras, markers,
    comments and everything else kept as written)."""
    import re

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    doc = lf.parse_toml(text, path)
    deps = doc["project"]["dependencies"]
    target = canonicalize_name(f"{lf.DIST_PREFIX}{lower}")
    for i, dep in enumerate(deps):
        if canonicalize_name(Requirement(str(dep)).name) != target:
            continue
        head = re.match(r"\s*[A-Za-z0-9._-]+\s*(\[[^\]]*\])?\s*", str(dep))
        marker = str(dep).split(";", 1)[1] if ";" in str(dep) else None
        deps[i] = f"{head.group(0).rstrip() if head else lf.DIST_PREFIX + lower}{spec}" + (
            f";{marker}" if marker is not None else ""
        )
        import tomlkit

        return tomlkit.dumps(doc)
    raise LockError(f"{lf.show(path)}: no opstrata-{lower} dependency to tighten")
