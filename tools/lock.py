"""Sync and check versions.lock against the package pyprojects and git.

    python tools/lock.py sync [--layers ops,graph,...]   # rewrite the lock from the pyprojects (keeps releases)
    python tools/lock.py check [--ref HEAD]              # exit 1 listing every inconsistency
    python tools/lock.py tighten [--dry-run]             # raise uninstallable lower bounds, then sync
    python tools/lock.py relink PACKAGE VERSION          # re-record a release whose tree no commit holds

check is what CI runs (nox -s lock): it catches code changed without a version bump, ranges that
exclude the locked lower version, lower bounds no installer can ever pick (the release at the bound
conflicts with the package's other ranges), upward/sideways/cyclic dependencies, release trees no commit holds (a fresh clone could not rebuild them)
and a malformed lock.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lockfile as lf
import ranges
import tomlkit
from lockfile import LockError
from packaging.specifiers import SpecifierSet
from tomlkit.toml_document import TOMLDocument

BUMP_HINT = "python tools/release.py {name} patch|minor|major"


@dataclass(frozen=True)
class Problem:
    """One inconsistency found by check: which package, what kind, and a message with the fix."""

    package: str | None
    kind: str  # malformed | not-in-lock | version | stale | layering | cycle | range | uninstallable-bound
    #            | unreleased-change | uncommitted-release
    message: str


# ---------------------------------------------------------------- sync


def sync(repo_root: Path, layers: list[str] | None = None) -> TOMLDocument:
    """The lock rewritten from the pyprojects: versions, ranges, tested-with; comments, order and releases kept."""
    path = lf.lock_path(repo_root)
    doc = lf.parse_toml(lf.read_text(path, "lock file"), path) if path.exists() else None
    if layers is None:
        old = doc.get("layers") if doc is not None else None
        valid = isinstance(old, list) and old and all(isinstance(x, str) for x in old)
        layers = [str(x) for x in old] if valid else lf.default_layers(repo_root)
    if doc is None:
        doc = lf.new_lock(layers)
    lf.set_keep_comment(doc, "schema", lf.SCHEMA)
    if [str(x) for x in doc.get("layers", [])] != layers:
        lf.set_keep_comment(doc, "layers", layers)
    pyprojects = lf.load_pyprojects(repo_root, layers)
    if not isinstance(doc.get("packages"), dict):
        doc["packages"] = tomlkit.table(is_super_table=True)
    packages = doc["packages"]
    for name in layers:
        if name not in packages:
            packages[name] = lf.package_table(name)
        _sync_package(packages[name], name, pyprojects)
    lf.write_lock(doc, path)
    return doc


def _sync_package(table: Any, name: str, pyprojects: dict[str, lf.PyProject]) -> None:
    """Rewrite one [packages.<name>] table's owned keys from its pyproject, leaving releases alone."""
    pp = pyprojects[name]
    lf.set_keep_comment(table, "distribution", pp.name)
    lf.set_keep_comment(table, "path", f"packages/{name}")
    lf.set_keep_comment(table, "version", pp.version)
    lf.set_keep_comment(table, "requires", lf.inline(pp.requires))
    tested = {low: pyprojects[low].version for low in pp.requires if low in pyprojects}
    lf.set_keep_comment(table, "tested-with", lf.inline(tested))


# ---------------------------------------------------------------- check


def check(repo_root: Path, ref: str | None = None) -> list[Problem]:
    """Every inconsistency between the lock, the pyprojects and the package trees (empty list = OK)."""
    try:
        lock = lf.read_lock(lf.lock_path(repo_root))
    except LockError as e:
        return [Problem(None, "malformed", p) for p in e.problems]
    layers = [str(x) for x in lock["layers"]]
    problems: list[Problem] = []
    pyprojects: dict[str, lf.PyProject] = {}
    for name in layers:
        try:
            pyprojects[name] = lf.read_pyproject(
                Path(repo_root) / str(lock["packages"][name]["path"]) / "pyproject.toml"
            )
        except LockError as e:
            problems += [Problem(name, "malformed", p) for p in e.problems]
    for extra in sorted(set(lf.package_dirs(repo_root)) - set(layers)):
        problems.append(
            Problem(
                extra,
                "not-in-lock",
                f"packages/{extra} has a pyproject.toml but is not in versions.lock "
                f"layers {layers}; add it with `python tools/lock.py sync --layers {','.join([*layers, extra])}`",
            )
        )
    for name, pp in pyprojects.items():
        problems += _check_fields(lock, name, pp)
    edges = _edges(lock, pyprojects)
    problems += _check_layering(layers, edges) + _check_cycles(layers, edges)
    problems += _check_ranges(lock, pyprojects)
    if len(pyprojects) == len(layers):
        problems += _check_bounds(repo_root, lock, pyprojects)
    problems += _check_trees(repo_root, lock, ref)
    problems += _check_release_history(repo_root, lock, ref)
    return problems


def _check_fields(lock: Any, name: str, pp: lf.PyProject) -> list[Problem]:
    """Pyproject version, distribution and ranges must match what the lock records."""
    t = lock["packages"][name]
    rel = lf.show(pp.path)
    out: list[Problem] = []
    if pp.version != t["version"]:
        out.append(
            Problem(
                name,
                "version",
                (
                    f"{rel} has version {pp.version} but versions.lock has packages.{name}.version = {t['version']}; "
                    f"bump versions with `{BUMP_HINT.format(name=name)}` (it edits both), or run "
                    "`python tools/lock.py sync` if the pyproject edit is intended"
                ),
            )
        )
    if pp.name != t["distribution"]:
        out.append(
            Problem(
                name,
                "stale",
                f"{rel} names distribution {pp.name!r} but versions.lock has "
                f"{t['distribution']!r}; run `python tools/lock.py sync`",
            )
        )
    locked = {str(k): str(v) for k, v in t["requires"].items()}
    if pp.requires != locked:
        out.append(
            Problem(
                name,
                "stale",
                f"{rel} declares {pp.requires or 'no opstrata dependencies'} but "
                f"versions.lock has packages.{name}.requires = {locked}; run `python tools/lock.py sync`",
            )
        )
    return out


def _edges(lock: Any, pyprojects: dict[str, lf.PyProject]) -> dict[str, list[str]]:
    """Package -> lower packages it depends on, from the pyprojects and the lock together."""
    edges: dict[str, list[str]] = {}
    for name in lock["layers"]:
        from_lock = [str(k) for k in lock["packages"][name]["requires"]]
        from_pp = list(pyprojects[name].requires) if name in pyprojects else []
        edges[str(name)] = list(dict.fromkeys(from_pp + from_lock))
    return edges


def _check_layering(layers: list[str], edges: dict[str, list[str]]) -> list[Problem]:
    """A package may depend only on packages before it in `layers`."""
    out: list[Problem] = []
    for name, lowers in edges.items():
        for low in lowers:
            if low not in layers:
                out.append(
                    Problem(
                        name,
                        "layering",
                        f"{name} depends on opstrata-{low}, which is not a package in "
                        f"versions.lock layers {layers}; fix the dependency in packages/{name}/pyproject.toml",
                    )
                )
            elif layers.index(low) >= layers.index(name):
                where = "on itself" if low == name else f"upward on {low}"
                out.append(
                    Problem(
                        name,
                        "layering",
                        (
                            f"{name} depends {where}: layers are {' < '.join(layers)} and a package may depend only on "
                            f"packages before it; remove opstrata-{low} from packages/{name}/pyproject.toml "
                            "(move the shared code down a layer)"
                        ),
                    )
                )
    return out


def _check_cycles(layers: list[str], edges: dict[str, list[str]]) -> list[Problem]:
    """Dependency cycles, each reported once as a -> b -> a."""
    out: list[Problem] = []
    seen: set[frozenset[str]] = set()
    state: dict[str, int] = {}  # 1 = on the DFS stack, 2 = done

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in edges.get(node, []):
            if state.get(nxt) == 1:
                cycle = [*stack[stack.index(nxt) :], nxt]
                if frozenset(cycle) not in seen:
                    seen.add(frozenset(cycle))
                    out.append(
                        Problem(
                            node,
                            "cycle",
                            f"dependency cycle {' -> '.join(cycle)}; "
                            "break it by removing the upward dependency",
                        )
                    )
            elif nxt in edges and state.get(nxt) is None:
                visit(nxt, [*stack, nxt])
        state[node] = 2

    for name in layers:
        if state.get(name) is None:
            visit(name, [name])
    return out


def _check_ranges(lock: Any, pyprojects: dict[str, lf.PyProject]) -> list[Problem]:
    """Each declared range must admit the locked (current) version of the lower package."""
    out: list[Problem] = []
    for name, pp in pyprojects.items():
        for low, spec in pp.requires.items():
            if low not in lock["packages"]:
                continue
            current = str(lock["packages"][low]["version"])
            if not SpecifierSet(spec).contains(current, prereleases=True):
                out.append(
                    Problem(
                        name,
                        "range",
                        (
                            f"{name} requires opstrata-{low}{spec} ({lf.show(pp.path)}) but the locked {low} version is "
                            f"{current}; widen the range to admit {current} and release {name}, "
                            f"or keep {low} inside it"
                        ),
                    )
                )
    return out


def _check_bounds(repo_root: Path, lock: Any, pyprojects: dict[str, lf.PyProject]) -> list[Problem]:
    """Each declared lower bound must be installable: the release it names fits the package's other ranges."""
    try:
        universe = ranges.Universe.from_pyprojects(repo_root, lock, pyprojects)
        found = [p for name in universe.layers for p in universe.bound_problems(name)]
    except LockError as e:
        return [Problem(None, "malformed", p) for p in e.problems]
    return [Problem(p.package, "uninstallable-bound", bound_message(p, pyprojects[p.package])) for p in found]


def bound_message(p: ranges.BoundProblem, pp: lf.PyProject) -> str:
    """The [uninstallable-bound] text: package, bound, conflicting release, and the bound to use instead."""
    head = (
        f"{p.package} declares opstrata-{p.lower}{p.spec} ({lf.show(pp.path)}), but no installer can pick its "
        f"lower bound: {p.reason}"
    )
    if p.new_spec is None:
        return (
            f"{head}; no release of {p.lower} that the range admits can be installed with {p.package}'s other "
            f"ranges: widen them or release {p.lower} first"
        )
    return (
        f"{head}; the oldest installable release is {p.lower} {p.replacement}: declare "
        f"opstrata-{p.lower}{p.new_spec} (`python tools/lock.py tighten` rewrites it), then release {p.package}"
    )


def tighten(repo_root: Path, dry_run: bool = False) -> tuple[dict[str, dict[str, tuple[str, str]]], str]:
    """Raise every uninstallable lower bound in the pyprojects (tomlkit, formatting kept), then sync the lock.

    Returns the changes {package: {lower: (old, new)}} and the unified diff of the files (written unless
    dry_run). Bounds that no release can satisfy are left alone; check keeps reporting them.
    """
    import difflib

    lock = lf.read_lock(lf.lock_path(repo_root))
    layers = [str(x) for x in lock["layers"]]
    pyprojects = lf.load_pyprojects(repo_root, layers)
    universe = ranges.Universe.from_pyprojects(repo_root, lock, pyprojects)
    changes, _left = ranges.tighten(universe)
    chunks: list[str] = []
    new_texts: dict[Path, str] = {}
    for name, lowers in changes.items():
        path = pyprojects[name].path
        old = text = lf.read_text(path, "pyproject.toml")
        for lower, (_old_spec, new_spec) in lowers.items():
            text = ranges.set_requirement(text, path, lower, new_spec)
        new_texts[path] = text
        rel = str(Path(path).resolve().relative_to(Path(repo_root).resolve()))
        chunks += difflib.unified_diff(old.splitlines(True), text.splitlines(True), f"a/{rel}", f"b/{rel}")
    if not dry_run and new_texts:
        for path, text in new_texts.items():
            lf.atomic_write_text(path, text)
        sync(repo_root)
    return changes, "".join(chunks)


def _check_trees(repo_root: Path, lock: Any, ref: str | None) -> list[Problem]:
    """A package whose current version is released must still have that release's tree."""
    out: list[Problem] = []
    for name in lock["layers"]:
        t = lock["packages"][name]
        version = str(t["version"])
        if version not in t.get("releases", {}):
            continue  # not released yet: free to change
        recorded = str(t["releases"][version]["tree"])
        try:
            actual = lf.tree_of(repo_root, str(t["path"]), ref=ref)
        except LockError as e:
            out.append(Problem(str(name), "malformed", str(e)))
            continue
        if actual != recorded:
            where = "the working tree" if ref is None else ref
            out.append(
                Problem(
                    str(name),
                    "unreleased-change",
                    (
                        f"{t['path']} in {where} differs from the tree recorded for released {t['distribution']} {version} "
                        f"(recorded {recorded[:12]}, now {actual[:12]}{_changed_files(repo_root, recorded, actual, str(t['path']))}) but the "
                        f"version was not bumped; run `{BUMP_HINT.format(name=name)}`"
                    ),
                )
            )
    return out


def _check_release_history(repo_root: Path, lock: Any, ref: str | None) -> list[Problem]:
    """Every recorded release tree is the package's directory in some commit, so any full clone can rebuild it.

    A tree recorded by release.py and then edited before the commit (a formatter run, a late fix) lives
    only in the releasing machine's object db: CI's clone cannot build that release and the compat matrix
    fails. Checking the working tree (no ref), the current version's release may still be uncommitted.
    """
    if ref is None and not lf.has_head(repo_root):
        return []
    names = [str(n) for n in lock["layers"]]
    paths = {n: str(lock["packages"][n]["path"]) for n in names}
    try:
        committed = lf.committed_trees(repo_root, list(paths.values()), ref=ref or "HEAD")
    except LockError as e:
        return [Problem(None, "malformed", str(e))]
    out: list[Problem] = []
    for name in names:
        t = lock["packages"][name]
        for version in lf.released_versions(lock, name):
            if ref is None and version == str(t["version"]):
                continue  # _check_trees compares it with the working tree
            tree = str(t["releases"][version]["tree"])
            if tree in committed[paths[name].strip("/")]:
                continue
            out.append(
                Problem(
                    name,
                    "uncommitted-release",
                    f"{t['distribution']} {version}'s recorded tree {tree[:12]} is {paths[name]} in no commit of "
                    f"{ref or 'HEAD'}'s history (released, then edited before the commit?), so a fresh clone "
                    f"cannot rebuild it; run `python tools/lock.py relink {name} {version}` to record the tree "
                    f"committed as {version}",
                )
            )
    return out


def relink(repo_root: Path, name: str, version: str) -> tuple[str, str, str]:
    """Record, for a release whose tree no commit holds, the tree of the oldest commit declaring that version.

    Returns (old tree, new tree, commit). Refuses a release whose tree is committed: history is not
    rewritten for releases a clone can already rebuild.
    """
    path = lf.lock_path(repo_root)
    doc = lf.read_lock(path)
    if name not in doc["packages"]:
        raise LockError(f"relink: no package {name!r} in versions.lock; known: {', '.join(doc['layers'])}")
    table = doc["packages"][name]
    old = lf.release_tree(doc, name, version)
    rel = str(table["path"])
    if old in lf.committed_trees(repo_root, [rel])[rel.strip("/")]:
        raise LockError(
            f"relink: {table['distribution']} {version}'s tree {old[:12]} is committed; nothing to relink"
        )
    commit = lf.commit_with_version(repo_root, rel, version)
    if commit is None:
        raise LockError(
            f"relink: no commit of HEAD declares {table['distribution']} {version} in {rel}/pyproject.toml; "
            "commit the release first"
        )
    new = lf.tree_of(repo_root, rel, ref=commit)
    table["releases"][version]["tree"] = new
    lf.write_lock(doc, path)
    return old, new, commit


def _changed_files(repo_root: Path, old: str, new: str, prefix: str, limit: int = 8) -> str:
    """'; changed: a, b, ...' between two trees, or a note that the recorded tree is not in this clone."""
    try:
        names = [
            f"{prefix}/{n}"
            for n in lf.git(repo_root, "diff-tree", "-r", "--name-only", old, new).splitlines()
        ]
    except LockError:
        return "; the recorded tree is not in this clone's object db (shallow clone or bad hash?)"
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return f"; changed: {', '.join(names[:limit])}{more}" if names else ""


# ---------------------------------------------------------------- CLI


def format_problems(problems: list[Problem]) -> str:
    """The multi-line report printed by check."""
    lines = [f"versions.lock check: {len(problems)} problem(s)"]
    lines += [f"  - [{p.kind}] {p.message}" for p in problems]
    return "\n".join(lines)


def summary(repo_root: Path) -> str:
    """One OK line: packages with versions and how many releases the lock records."""
    lock = lf.read_lock(lf.lock_path(repo_root))
    layers = [str(x) for x in lock["layers"]]
    versions = ", ".join(f"{n} {lock['packages'][n]['version']}" for n in layers)
    n_rel = sum(len(lf.released_versions(lock, n)) for n in layers)
    return f"versions.lock OK: {len(layers)} packages ({versions}); {n_rel} release(s) recorded; layering {' < '.join(layers)}"


def main(argv: list[str] | None = None) -> int:
    """Entry point: `sync`, `check`, `tighten` or `relink`."""
    ap = argparse.ArgumentParser(prog="tools/lock.py", description=__doc__.splitlines()[0])
    ap.add_argument("command", choices=["sync", "check", "tighten", "relink"])
    ap.add_argument("package", nargs="?", help="relink: the package (e.g. eval)")
    ap.add_argument("version", nargs="?", help="relink: the released version (e.g. 0.7.19)")
    ap.add_argument("--root", type=Path, help="repository root (default: git toplevel of the cwd)")
    ap.add_argument(
        "--layers", help="sync: comma-separated layer order, bottom first (default: keep the lock's)"
    )
    ap.add_argument("--ref", help="check: compare trees at this git ref instead of the working tree")
    ap.add_argument("--dry-run", action="store_true", help="tighten: print the diff, write nothing")
    args = ap.parse_args(argv)
    try:
        root = lf.find_root(args.root)
        if args.command == "sync":
            layers = [x.strip() for x in args.layers.split(",") if x.strip()] if args.layers else None
            sync(root, layers)
            print(f"wrote {lf.show(lf.lock_path(root))}")
            return _report(root, check(root))
        if args.command == "tighten":
            return _tighten_cli(root, args.dry_run)
        if args.command == "relink":
            if not (args.package and args.version):
                ap.error("relink needs PACKAGE VERSION, e.g. `lock.py relink eval 0.7.19`")
            old, new, commit = relink(root, args.package, args.version)
            changed = _changed_files(root, old, new, f"packages/{args.package}")
            print(
                f"relinked {args.package} {args.version}: tree {old[:12]} -> {new[:12]} "
                f"(as committed in {commit[:12]}{changed})"
            )
            return _report(root, check(root))
        return _report(root, check(root, ref=args.ref))
    except LockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


def _report(root: Path, problems: list[Problem]) -> int:
    """Print the problems (exit 1) or the one OK line (exit 0)."""
    if problems:
        print(format_problems(problems), file=sys.stderr)
        return 1
    print(summary(root))
    return 0


def _tighten_cli(root: Path, dry_run: bool) -> int:
    """`lock.py tighten [--dry-run]`: print what changes (and the diff), write unless dry run, re-check."""
    changes, text = tighten(root, dry_run=dry_run)
    if not changes:
        print("tighten: every declared lower bound is installable; nothing to change")
    for name, lowers in changes.items():
        for lower, (old, new) in lowers.items():
            print(f"tighten: {name}: opstrata-{lower}{old} -> opstrata-{lower}{new}")
    if changes:
        released = [n for n in changes if n in lf.read_lock(lf.lock_path(root))["packages"]]
        verb = "would change" if dry_run else "changed"
        print(
            f"{verb} the ranges of {', '.join(released)}; release each with "
            f"`python tools/release.py <name> patch` (a raised lower bound is a patch)"
        )
    if dry_run:
        print(f"dry run, nothing written\n{text}", end="")
        return 0
    left = [p for p in check(root) if p.kind not in ("unreleased-change",)]
    if left:
        print(format_problems(left), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
