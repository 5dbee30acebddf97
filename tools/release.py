"""Release one package: bump its version, date its changelog, record its tree in versions.lock.

    python tools/release.py ops patch|minor|major|current [--dry-run] [--date YYYY-MM-DD] [--tag]
    python tools/release.py ops tag        # after committing: tag ops-v<version> at HEAD
    python tools/release.py plan ops [--version 0.4.0]   # what releasing it means for the upper packages
    python tools/release.py batch ops:minor graph:minor comm:patch   # a cascade, checked as a whole

Only packages/<name>/pyproject.toml, packages/<name>/CHANGELOG.md and the [packages.<name>] table of
versions.lock change; other packages stay byte-identical. The recorded tree is the hash of the package
directory as it will be committed (working tree after the edits), so commit everything under
packages/<name> together with versions.lock. A tag must point at that commit, hence the separate `tag`
step (it verifies HEAD really contains the recorded tree).
"""

from __future__ import annotations

import argparse
import datetime as dt
import difflib
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import lockfile as lf
import ranges
import tomlkit
from lock import check
from lockfile import LockError
from packaging.specifiers import SpecifierSet
from packaging.version import Version

_UNRELEASED = re.compile(r"^## +\[?Unreleased\]?[ \t]*$", re.IGNORECASE | re.MULTILINE)
_NEXT_H2 = re.compile(r"^## ", re.MULTILINE)


@dataclass(frozen=True)
class Plan:
    """Everything a release writes, computed before anything is written."""

    name: str
    old_version: str
    version: str
    date: str
    tree: str
    files: dict[Path, tuple[str, str]]  # path -> (old text, new text)


def bump(version: str, part: str) -> str:
    """The next X.Y.Z for part major|minor|patch (current returns the version unchanged)."""
    if part == "current":
        return version
    v = Version(version)
    if v.pre or v.post or v.dev or v.local or len(v.release) > 3:
        raise LockError(
            f"cannot {part}-bump {version}: release.py bumps plain X.Y.Z versions; set the version you want "
            "in pyproject.toml, run `python tools/lock.py sync`, then `release.py <name> current`"
        )
    major, minor, patch = (*v.release, 0, 0)[:3]
    return {
        "major": f"{major + 1}.0.0",
        "minor": f"{major}.{minor + 1}.0",
        "patch": f"{major}.{minor}.{patch + 1}",
    }[part]


def move_unreleased(text: str, path: Path, version: str, date: str) -> str:
    """CHANGELOG text with the Unreleased section's content moved under `## <version> — <date>`."""
    m = _UNRELEASED.search(text)
    if m is None:
        raise LockError(
            f"{lf.show(path)}: expected a '## Unreleased' heading, found none; add one listing the changes"
        )
    nxt = _NEXT_H2.search(text, m.end())
    end = nxt.start() if nxt else len(text)
    body = text[m.end() : end].strip("\n")
    if not body.strip():
        raise LockError(
            f"{lf.show(path)}: the '## Unreleased' section is empty; describe what changed in this release "
            "under it (Added / Changed / Fixed) and run release.py again"
        )
    rest = text[end:]
    new = f"{text[: m.start()]}## Unreleased\n\n## {version} — {date}\n\n{body}\n"
    return new + ("\n" + rest if rest else "")


def set_pyproject_version(text: str, path: Path, version: str) -> str:
    """pyproject.toml text with project.version replaced; everything else kept as written."""
    doc = lf.parse_toml(text, path)
    doc["project"]["version"] = version
    return tomlkit.dumps(doc)


def plan_release(root: Path, name: str, part: str, date: str) -> Plan:
    """Compute the new pyproject, changelog and lock texts and the tree hash, writing nothing."""
    lock_file = lf.lock_path(root)
    lock = lf.read_lock(lock_file)
    if name not in lock["packages"]:
        raise LockError(f"unknown package {name!r}; versions.lock has: {', '.join(lock['layers'])}")
    table = lock["packages"][name]
    pkg_dir = root / str(table["path"])
    pp = lf.read_pyproject(pkg_dir / "pyproject.toml")
    old = str(table["version"])
    version = bump(old, part)
    released = lf.released_versions(lock, name)
    if version in released:
        hint = "use patch|minor|major to release the changes" if part == "current" else "pick another bump"
        raise LockError(
            f"{table['distribution']} {version} is already released (tree {table['releases'][version]['tree']}); {hint}"
        )
    if released and Version(version) < Version(released[-1]):
        raise LockError(f"{table['distribution']} {version} would be older than the released {released[-1]}")
    if old in released and lf.has_head(root):
        rel = str(table["path"])
        if str(table["releases"][old]["tree"]) not in lf.committed_trees(root, [rel])[rel.strip("/")]:
            raise LockError(
                f"{table['distribution']} {old} is released but not committed: releasing {version} on top would "
                f"leave {old}'s tree in no commit, and no clone could rebuild it; commit first "
                f"(git add {rel} {lf.LOCK_NAME} && git commit), then release again"
            )
    pyproject, changelog = pkg_dir / "pyproject.toml", pkg_dir / "CHANGELOG.md"
    texts = {
        pyproject: lf.read_text(pyproject, "pyproject.toml"),
        changelog: lf.read_text(changelog, "CHANGELOG.md"),
    }
    new = {
        pyproject: set_pyproject_version(texts[pyproject], pyproject, version),
        changelog: move_unreleased(texts[changelog], changelog, version, date),
    }
    overrides = {str(p.relative_to(root)): t.encode() for p, t in new.items()}
    tree = lf.tree_of(root, str(table["path"]), overrides=overrides)
    lock_old = lf.read_text(lock_file, "lock file")
    _update_lock(lock, name, pp, version, tree, date)
    problems = lf.validate_lock(lock, lock_file)
    if problems:
        raise LockError("the updated lock would be invalid:\n  - " + "\n  - ".join(problems))
    files = {p: (texts[p], new[p]) for p in new}
    files[lock_file] = (lock_old, tomlkit.dumps(lock))
    return Plan(name, old, version, date, tree, files)


def _update_lock(
    lock: lf.TOMLDocument, name: str, pp: lf.PyProject, version: str, tree: str, date: str
) -> None:
    """Record version, ranges, tested-with and the new release in [packages.<name>] only."""
    table = lock["packages"][name]
    lf.set_keep_comment(table, "version", version)
    lf.set_keep_comment(table, "requires", lf.inline(pp.requires))
    tested = {low: str(lock["packages"][low]["version"]) for low in pp.requires if low in lock["packages"]}
    lf.set_keep_comment(table, "tested-with", lf.inline(tested))
    if "releases" not in table:
        table["releases"] = tomlkit.table(is_super_table=True)
    entry = tomlkit.table()
    entry["tree"] = tree
    entry["date"] = date
    entry.add(tomlkit.nl())
    table["releases"][version] = entry


def blocking_problems(root: Path, name: str) -> list[str]:
    """check() problems a release must not paper over: all except changed-since-release trees."""
    return [p.message for p in check(root) if p.kind != "unreleased-change"]


def unformatted(root: Path, names: list[str]) -> list[str]:
    """Packages ``ruff format`` would still change, where the repository configures ruff.

    The release records the package directory's tree as it is on disk; a formatter run after it changes
    the files, so the commit holds another tree and the recorded one exists nowhere (a CI clone fails
    ``lock.py check``). Without ``[tool.ruff]`` in the root pyproject.toml nothing is checked; with it and
    no ruff on PATH, that is an error too (the check would be silently skipped)."""
    cfg = root / "pyproject.toml"
    if not cfg.is_file() or "[tool.ruff" not in cfg.read_text(encoding="utf-8"):
        return []
    ruff = shutil.which("ruff")
    if ruff is None:
        return ["ruff is not on PATH, and pyproject.toml configures it: install it (`pip install ruff`) so a "
                "release records formatted files"]  # fmt: skip
    lock = lf.read_lock(lf.lock_path(root))
    out = []
    for name in names:
        path = str(lock["packages"][name]["path"])
        proc = subprocess.run(
            [ruff, "format", "--check", "--no-cache", "--output-format", "concise", path],
            cwd=root, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if proc.returncode != 0:  # concise lines: "path:row:col: unformatted: File would be reformatted"
            files = [ln.split(":", 1)[0] for ln in proc.stdout.splitlines() if ": unformatted:" in ln]
            out.append(
                f"{path} is not as `ruff format` leaves it ({', '.join(files) or proc.stderr.strip()}): the release "
                f"would record a tree the formatter changes afterwards; run `ruff format {path}` and release again"
            )  # fmt: skip
    return out


def warn_dependents(root: Path, name: str, version: str) -> list[str]:
    """Packages whose declared range on `name` excludes the new version (they need a widened range + release)."""
    lock = lf.read_lock(lf.lock_path(root))
    out = []
    for upper in lock["layers"]:
        spec = lock["packages"][upper]["requires"].get(name)
        if spec is not None and not SpecifierSet(str(spec)).contains(version, prereleases=True):
            out.append(
                f"{upper} requires opstrata-{name}{spec}, which excludes {version}: widen it in "
                f"packages/{upper}/pyproject.toml and release {upper}, or `lock.py check` will fail"
            )
    return out


def apply(plan: Plan, root: Path) -> None:
    """Write the planned files (lock last); on failure restore what was already written."""
    written: list[Path] = []
    try:
        for path, (_old, new) in plan.files.items():
            lf.atomic_write_text(path, new)
            written.append(path)
    except BaseException:
        for path in written:
            lf.atomic_write_text(path, plan.files[path][0])
        raise
    actual = lf.tree_of(root, str(lf.read_lock(lf.lock_path(root))["packages"][plan.name]["path"]))
    if actual != plan.tree:
        raise LockError(
            f"packages/{plan.name} changed while releasing (expected tree {plan.tree}, found {actual}); "
            "run `python tools/lock.py check` and release again"
        )


def diff(plan: Plan, root: Path) -> str:
    """Unified diff of every planned change (the --dry-run output)."""
    chunks = []
    for path, (old, new) in plan.files.items():
        rel = str(path.relative_to(root))
        chunks += difflib.unified_diff(old.splitlines(True), new.splitlines(True), f"a/{rel}", f"b/{rel}")
    return "".join(chunks)


def tag(root: Path, name: str) -> str:
    """Create the annotated tag <name>-v<version> at HEAD after checking HEAD holds the recorded release."""
    lock = lf.read_lock(lf.lock_path(root))
    if name not in lock["packages"]:
        raise LockError(f"unknown package {name!r}; versions.lock has: {', '.join(lock['layers'])}")
    table = lock["packages"][name]
    version = str(table["version"])
    recorded = lf.release_tree(lock, name, version)
    at_head = lf.tree_of(root, str(table["path"]), ref="HEAD")
    head_lock = lf.parse_toml(lf.git(root, "show", f"HEAD:{lf.LOCK_NAME}"), f"HEAD:{lf.LOCK_NAME}")
    head_release = head_lock.get("packages", {}).get(name, {}).get("releases", {}).get(version, {})
    if at_head != recorded or head_release.get("tree") != recorded:
        raise LockError(
            f"HEAD does not contain {table['distribution']} {version} as recorded (tree {recorded[:12]}, HEAD has "
            f"{at_head[:12]}); commit {table['path']} and {lf.LOCK_NAME} first, then run the tag step again"
        )
    name_tag = f"{name}-v{version}"
    if lf.git(root, "tag", "--list", name_tag):
        raise LockError(f"tag {name_tag} already exists; a release is tagged once")
    lf.git(root, "tag", "-a", name_tag, "-m", f"{table['distribution']} {version}")
    return name_tag


def release_batch(root: Path, steps: list[tuple[str, str]], date: str) -> list[Plan]:
    """Release several packages in one step, bottom layer first: a cascade whose ranges only agree at the end.

    A breaking lower minor makes every upper range that stops at it wrong until each upper is widened and
    re-released, so one-at-a-time releases would each see the others' problems. Here the pyprojects
    already hold the final ranges; every package is released in layer order (each one's tested-with sees
    the new lower versions) and the result must pass ``lock.py check`` with no problem at all, or every
    written file is restored.
    """
    lock = lf.read_lock(lf.lock_path(root))
    layers = [str(x) for x in lock["layers"]]
    unknown = [n for n, _ in steps if n not in layers]
    if unknown:
        raise LockError(f"batch: unknown package(s) {unknown}; versions.lock has: {', '.join(layers)}")
    if len({n for n, _ in steps}) != len(steps):
        raise LockError("batch: a package is named twice; give each package one part")
    steps = sorted(steps, key=lambda s: layers.index(s[0]))
    originals: dict[Path, str] = {}
    plans: list[Plan] = []
    try:
        for name, part in steps:
            plan = plan_release(root, name, part, date)
            for path, (old, _new) in plan.files.items():
                originals.setdefault(path, old)
            apply(plan, root)
            plans.append(plan)
        problems = check(root)
        if problems:
            raise LockError(
                "batch: after releasing "
                + ", ".join(f"{p.name} {p.version}" for p in plans)
                + " the lock check still fails (nothing was kept):\n  - "
                + "\n  - ".join(p.message for p in problems)
            )
    except BaseException:
        for path, text in originals.items():
            lf.atomic_write_text(path, text)
        raise
    return plans


def widen_upper_bound(spec: str, version: str) -> str:
    """`spec` with its upper bound moved just past `version`'s series: <0.5 for 0.4.x, <2 for 1.x."""
    v = Version(version)
    upper = f"0.{v.minor + 1}" if v.major == 0 else f"{v.major + 1}"
    clauses = [c.strip() for c in spec.split(",") if c.strip()]
    kept = [c for c in clauses if not c.startswith("<") and not c.startswith("==")]
    return ",".join([*kept, f"<{upper}"])


def _session(package: str, lower: str, version: str) -> str:
    return f"nox -s \"compat(package='{package}', lower='{lower}', version='{version}')\""


def release_plan(root: Path, name: str, version: str | None = None) -> str:
    """What releasing `name` `version` (default: its pyproject version) means for every upper package.

    Which uppers' ranges admit it, which must widen a range and re-release (in layer order, and whether
    the widened range is installable once the packages between them are re-released too), and the compat
    sessions that prove each admitting range.
    """
    lock = lf.read_lock(lf.lock_path(root))
    layers = [str(x) for x in lock["layers"]]
    if name not in layers:
        raise LockError(f"unknown package {name!r}; versions.lock has: {', '.join(layers)}")
    pyprojects = lf.load_pyprojects(root, layers)
    current = pyprojects[name].version
    version = version or current
    if not lf._is_version(version):
        raise LockError(f"--version: expected a PEP 440 version like 0.4.0, found {version!r}")
    universe = ranges.Universe.from_pyprojects(root, lock, pyprojects)
    released = lf.released_versions(lock, name)
    if version not in released:  # the release as it would be cut from the working tree
        universe.candidates[name].insert(
            1, ranges.Candidate(name, version, dict(universe.requires[name]), "planned")
        )
    state = "released" if version in released else f"not released yet (working tree has {current})"
    lines = [
        f"release plan: opstrata-{name} {version} — {state}; released: {', '.join(released) or 'none'}",
    ]
    uppers = layers[layers.index(name) + 1 :]
    widen: dict[str, tuple[str, str]] = {}
    admit: list[str] = []
    below: list[str] = []
    for upper in uppers:
        spec = universe.requires[upper].get(name)
        if spec is None:
            continue
        if ranges._admits(spec, version):
            admit.append(upper)
        elif _spec_above(spec, version):
            widen[upper] = (spec, widen_upper_bound(spec, version))
        else:
            below.append(upper)
    for upper, (_old, new) in widen.items():  # as if each re-released with the widened range
        universe.requires[upper][name] = new
    rows = set(universe.matrix())
    lines.append("upper packages whose range admits it (no change; the compat session proves it):")
    for upper in admit or []:
        spec = universe.requires[upper][name]
        if universe.installable(upper, name, version):
            row = (upper, name, version)
            proof = _session(*row) if row in rows else f"covered by nox -s \"tests(package='{upper}')\""
            lines.append(f"  {upper:<8} opstrata-{name}{spec:<16} admits {version}: {proof}")
        else:
            lines.append(
                f"  {upper:<8} opstrata-{name}{spec:<16} admits {version} but cannot install it: "
                f"{universe.explain(upper, name, version)}"
            )
    if not admit:
        lines.append("  (none)")
    lines.append("upper packages that must widen a range and re-release (bottom first):")
    for upper, (old, new) in widen.items():
        ok = universe.installable(upper, name, version)
        after = (
            f"then `python tools/release.py {upper} patch` once {_session(upper, name, version)} passes"
            if ok
            else f"still not installable after widening: {universe.explain(upper, name, version)}"
        )
        lines.append(
            f"  {upper:<8} opstrata-{name}{old} excludes {version}: widen to opstrata-{name}{new} in "
            f"packages/{upper}/pyproject.toml, {after}"
        )
    if not widen:
        lines.append("  (none)")
    else:
        order = ", ".join([name, *widen])
        lines.append(
            f"  order: release {name} {version} first (the compat sessions rebuild it from its recorded tree), "
            f"then widen, prove and release {order.split(', ', 1)[1]} bottom first; a session that fails means "
            "that package must change its code (a minor of its own), not just its range"
        )
    if below:
        lines.append(
            "upper packages that require a newer release (no change): "
            + ", ".join(f"{u} (opstrata-{name}{universe.requires[u][name]})" for u in below)
        )

    def depends(pkg: str) -> bool:
        return any(
            low == name or (low in universe.requires and depends(low)) for low in universe.requires[pkg]
        )

    indirect = [u for u in uppers if name not in universe.requires[u] and depends(u)]
    if indirect:
        lines.append(
            "no direct range (they get it through their own lower packages' ranges): "
            + ", ".join(f"{u} (via {', '.join(universe.requires[u])})" for u in indirect)
        )
    return "\n".join(lines)


def _spec_above(spec: str, version: str) -> bool:
    """True when `spec` has an upper bound (< or <=) that `version` reaches: the range is too narrow above."""
    from packaging.specifiers import Specifier

    for clause in SpecifierSet(spec):
        if clause.operator in ("<", "<=") and not Specifier(str(clause)).contains(version, prereleases=True):
            return True
    return False


def _today(value: str | None) -> str:
    """--date validated as YYYY-MM-DD, default today."""
    if value is None:
        return dt.date.today().isoformat()
    try:
        return dt.date.fromisoformat(value).isoformat()
    except ValueError:
        raise LockError(f"--date: expected YYYY-MM-DD, found {value!r}") from None


def run(args: argparse.Namespace) -> int:
    """Carry out one release.py invocation."""
    root = lf.find_root(args.root)
    if args.part == "tag":
        name_tag = tag(root, args.package)
        print(f"tagged {name_tag}; publish it with `git push origin {name_tag}` (CI builds that package)")
        return 0
    blocking = blocking_problems(root, args.package)
    if not args.dry_run:
        blocking += unformatted(root, [args.package])
    if blocking:
        raise LockError(
            "fix these `lock.py check` problems before releasing:\n  - " + "\n  - ".join(blocking)
        )
    plan = plan_release(root, args.package, args.part, _today(args.date))
    head = f"{plan.name} {plan.old_version} -> {plan.version} ({plan.date}, tree {plan.tree})"
    if args.dry_run:
        print(f"dry run, nothing written: release {head}\n{diff(plan, root)}", end="")
    else:
        apply(plan, root)
        print(f"released {head}")
        pkg = lf.read_lock(lf.lock_path(root))["packages"][plan.name]["path"]
        # the recorded tree is all of the package directory as on disk, so commit all of it
        print(
            f"next: git add {pkg} {lf.LOCK_NAME} && git commit -m 'Release opstrata-{plan.name} {plan.version}'"
        )
        print(
            "      then `python tools/lock.py check --ref HEAD` confirms the commit holds the recorded tree"
        )
        if args.tag:
            print(
                f"then: python tools/release.py {plan.name} tag   # tags {plan.name}-v{plan.version} at that commit"
            )
    for warning in warn_dependents(root, plan.name, plan.version):
        print(f"warning: {warning}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; LockErrors print as one clear message and exit 2."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["batch"]:
        ap = argparse.ArgumentParser(
            prog="tools/release.py batch", description=release_batch.__doc__.splitlines()[0]
        )
        ap.add_argument("steps", nargs="+", help="name:part, e.g. ops:minor graph:minor comm:patch")
        ap.add_argument("--date", help="release date YYYY-MM-DD (default: today)")
        ap.add_argument("--root", type=Path, help="repository root (default: git toplevel of the cwd)")
        args = ap.parse_args(argv[1:])
        try:
            steps = [tuple(s.split(":", 1)) for s in args.steps]
            bad = [
                s
                for s, st in zip(args.steps, steps, strict=True)
                if len(st) != 2 or st[1] not in ("major", "minor", "patch", "current")
            ]
            if bad:
                raise LockError(f"batch: expected name:major|minor|patch|current, got {bad}")
            root = lf.find_root(args.root)
            messy = unformatted(
                root, [n for n, _ in steps if n in lf.read_lock(lf.lock_path(root))["packages"]]
            )
            if messy:
                raise LockError("batch: format first:\n  - " + "\n  - ".join(messy))
            plans = release_batch(root, steps, _today(args.date))  # type: ignore[arg-type]
        except LockError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        for p in plans:
            print(f"released opstrata-{p.name} {p.old_version} -> {p.version} (tree {p.tree[:12]})")
        names = " ".join(f"packages/{p.name}" for p in plans)
        print(
            f"next: git add {names} versions.lock && git commit; then `python tools/release.py <name> tag` for each"
        )
        return 0
    if argv[:1] == ["plan"]:
        ap = argparse.ArgumentParser(
            prog="tools/release.py plan", description=release_plan.__doc__.splitlines()[0]
        )
        ap.add_argument("package", help="short name, e.g. ops")
        ap.add_argument(
            "--version", help="the version to plan for (default: the package's pyproject version)"
        )
        ap.add_argument("--root", type=Path, help="repository root (default: git toplevel of the cwd)")
        args = ap.parse_args(argv[1:])
        try:
            print(release_plan(lf.find_root(args.root), args.package, args.version))
        except LockError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    ap = argparse.ArgumentParser(prog="tools/release.py", description=__doc__.splitlines()[0])
    ap.add_argument("package", help="short name, e.g. ops")
    ap.add_argument("part", choices=["major", "minor", "patch", "current", "tag"])
    ap.add_argument("--dry-run", action="store_true", help="print the diff; write nothing")
    ap.add_argument("--date", help="release date YYYY-MM-DD (default: today)")
    ap.add_argument("--tag", action="store_true", help="print the tag step to run after committing")
    ap.add_argument("--root", type=Path, help="repository root (default: git toplevel of the cwd)")
    try:
        return run(ap.parse_args(argv))
    except LockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
