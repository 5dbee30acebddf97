"""versions.lock and pyproject access shared by tools/ and noxfile.py: read, validate, write, tree hashes.

The lock is TOML read and written only with tomlkit so comments and key order survive a rewrite. A
release is pinned by the git tree hash of its package directory (content-addressed, like
`git rev-parse HEAD:packages/ops`), so `git archive <tree>` rebuilds it from any clone.

Callers outside tools/ do `sys.path.insert(0, "tools"); import lockfile`.
"""

from __future__ import annotations

import datetime as _dt
import os
import re
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tomlkit
from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version
from tomlkit.exceptions import TOMLKitError
from tomlkit.toml_document import TOMLDocument

SCHEMA = 1
LOCK_NAME = "versions.lock"
DEFAULT_LAYERS = ("ops", "graph", "runtime", "comm", "quant", "eval")
DIST_PREFIX = "opstrata-"
HEADER = """\
# versions.lock — written by tools/lock.py and tools/release.py; never edit by hand.
# Per package: current version, declared ranges on lower packages (requires), the exact lower versions
# it was last tested with (tested-with), and every release with the git tree hash of its directory,
# so `git archive <tree>` rebuilds that release from any clone. See docs/releasing.md.
"""
_HEX40 = re.compile(r"[0-9a-f]{40}")
_NAME = re.compile(r"[a-z][a-z0-9_]*")
_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")
_FIX = "regenerate it with `python tools/lock.py sync` (releases are kept) or restore it from git"


class LockError(Exception):
    """A lock, pyproject or git problem, phrased as file, key, expected, found and the fix."""

    def __init__(self, message: str, problems: list[str] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or [message]


@dataclass(frozen=True)
class PyProject:
    """What the tools need from one package's pyproject.toml."""

    path: Path
    name: str  # distribution name as written, e.g. "opstrata-ops"
    version: str
    requires: dict[str, str] = field(default_factory=dict)  # short name -> specifier text, in file order


# ---------------------------------------------------------------- paths and git


def show(path: Path | str) -> str:
    """Path relative to the cwd when below it, so messages stay short and clickable."""
    p = Path(path)
    try:
        return str(p.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(p)


def git(
    repo_root: Path | str, *args: str, env: Mapping[str, str] | None = None, input: bytes | None = None
) -> str:
    """Run git in repo_root and return stdout; raise LockError with git's own message on failure."""
    full_env = {**os.environ, **env} if env else None
    proc = subprocess.run(
        ["git", *args], cwd=repo_root, env=full_env, input=input, capture_output=True, check=False
    )
    if proc.returncode != 0:
        err = proc.stderr.decode(errors="replace").strip()
        raise LockError(f"git {' '.join(args)} failed in {repo_root}: {err}")
    return proc.stdout.decode(errors="replace").strip()


def find_root(start: Path | str | None = None) -> Path:
    """The git toplevel containing `start` (default: cwd); the tools operate on that checkout."""
    start = Path(start or Path.cwd())
    try:
        return Path(git(start, "rev-parse", "--show-toplevel"))
    except (LockError, FileNotFoundError) as e:
        raise LockError(
            f"{start} is not inside a git checkout ({e}); run the tools from the repo or pass --root"
        ) from e


def lock_path(repo_root: Path | str) -> Path:
    """Where the lock of a checkout lives."""
    return Path(repo_root) / LOCK_NAME


def tree_of(
    repo_root: Path | str, rel_path: str, ref: str | None = None, overrides: Mapping[str, bytes] | None = None
) -> str:
    """Git tree hash of `rel_path` at `ref`, or of its working-tree contents (respecting .gitignore) if ref is None.

    The working-tree hash uses a throwaway index (GIT_INDEX_FILE), so uncommitted edits count, the real
    index is untouched, and the blobs and trees land in the object db (so `git archive <tree>` works).
    `overrides` maps repo-relative file paths to contents to hash instead of the file on disk (dry runs).
    """
    rel = rel_path.strip("/")
    if ref is not None:
        try:
            return git(repo_root, "rev-parse", "--verify", "--quiet", f"{ref}:{rel}")
        except LockError as e:
            raise LockError(f"{rel}: no such directory at git ref {ref!r}; is it committed?") from e
    if not (Path(repo_root) / rel).is_dir():
        raise LockError(f"{rel}: expected a package directory in {repo_root}, found none")
    with tempfile.TemporaryDirectory(prefix="opstrata-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        if has_head(repo_root):
            git(repo_root, "read-tree", "HEAD", env=env)  # keeps tracked-but-ignored files, as a commit would
        git(repo_root, "add", "-A", "--", rel, env=env)
        for file_rel, data in (overrides or {}).items():
            blob = git(repo_root, "hash-object", "-w", f"--path={file_rel}", "--stdin", input=data)
            mode = "100755" if os.access(Path(repo_root) / file_rel, os.X_OK) else "100644"
            git(repo_root, "update-index", "--add", "--cacheinfo", f"{mode},{blob},{file_rel}", env=env)
        try:
            return git(repo_root, "write-tree", f"--prefix={rel}/", env=env)
        except LockError as e:
            raise LockError(f"{rel}: has no files git would track (all ignored or empty?)") from e


def committed_trees(
    repo_root: Path | str, rel_paths: Sequence[str], ref: str = "HEAD"
) -> dict[str, set[str]]:
    """Per directory, every tree hash it had in a commit reachable from `ref` (what a fresh clone holds).

    One `git log` and one `git cat-file --batch-check` for all directories, so it stays fast on long
    histories. An empty dict entry means the directory was never committed.
    """
    commits = git(repo_root, "log", "--format=%H", ref).split()
    rels = [r.strip("/") for r in rel_paths]
    query = "".join(f"{c}:{rel}\n" for c in commits for rel in rels).encode()
    out = (
        git(repo_root, "cat-file", "--batch-check=%(objectname) %(objecttype)", input=query)
        if commits
        else ""
    )
    found: dict[str, set[str]] = {rel: set() for rel in rels}
    for (_, rel), line in zip(((c, rel) for c in commits for rel in rels), out.splitlines(), strict=True):
        name, _, kind = line.partition(" ")
        if kind == "tree":
            found[rel].add(name)
    return found


def commit_with_version(repo_root: Path | str, rel_path: str, version: str, ref: str = "HEAD") -> str | None:
    """The oldest commit reachable from `ref` whose `rel_path`/pyproject.toml declares `version` (None if none)."""
    rel = rel_path.strip("/")
    commits = git(repo_root, "log", "--reverse", "--format=%H", ref, "--", f"{rel}/pyproject.toml").split()
    for commit in commits:
        try:
            text = git(repo_root, "show", f"{commit}:{rel}/pyproject.toml")
        except LockError:
            continue  # deleted in this commit
        project = parse_toml(text, f"{commit[:12]}:{rel}/pyproject.toml").get("project", {})
        if str(project.get("version", "")) == version:
            return commit
    return None


def has_head(repo_root: Path | str) -> bool:
    """True once the repository has a first commit."""
    proc = subprocess.run(
        ["git", "rev-parse", "--verify", "--quiet", "HEAD"], cwd=repo_root, capture_output=True, check=False
    )
    return proc.returncode == 0


# ---------------------------------------------------------------- TOML helpers


def parse_toml(text: str, path: Path | str) -> TOMLDocument:
    """Parse TOML with tomlkit; a syntax error becomes a LockError naming the file, line and column."""
    try:
        return tomlkit.parse(text)
    except TOMLKitError as e:
        line, col = getattr(e, "line", None), getattr(e, "col", None)
        where = f" at line {line}, column {col + 1}" if line is not None and col is not None else ""
        reason = str(e).rsplit(" at line ", 1)[0]
        raise LockError(f"{show(path)}: not valid TOML{where}: {reason}; fix the syntax there") from None


def _found(value: Any) -> str:
    """How a found value reads in an error: the value and its TOML type."""
    if value is None:
        return "nothing (key missing)"
    kind = {bool: "boolean", int: "integer", float: "float", str: "string", list: "array", dict: "table"}
    plain = value.unwrap() if hasattr(value, "unwrap") else value
    for py, name in kind.items():
        if isinstance(plain, py):
            return f"{plain!r} ({name})"
    return f"{plain!r}"


def _expect(problems: list[str], path: Path | str, key: str, expected: str, found: Any) -> None:
    """Record one 'file: key: expected X, found Y' problem."""
    problems.append(f"{show(path)}: key '{key}': expected {expected}, found {_found(found)}")


def read_text(path: Path | str, what: str) -> str:
    """Read a UTF-8 file or raise a LockError that says which file and why."""
    try:
        return Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise LockError(f"{show(path)}: {what} not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise LockError(f"{show(path)}: cannot read {what}: {e}") from None


def atomic_write_text(path: Path | str, text: str) -> None:
    """Write text via a temp file in the same directory + os.replace, so readers never see half a file."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o7777)
        else:
            os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def inline(mapping: Mapping[str, str]) -> Any:
    """A tomlkit inline table formatted `{ a = "x", b = "y" }` (tomlkit's own builder drops the spaces)."""
    if not mapping:
        return tomlkit.parse("x = {}")["x"]
    body = ", ".join(f"{k} = {tomlkit.string(v).as_string()}" for k, v in mapping.items())
    return tomlkit.parse(f"x = {{ {body} }}")["x"]


def set_keep_comment(table: Any, key: str, value: Any) -> None:
    """Set table[key] keeping the old item's trailing comment at the same column."""
    if key not in table:
        table[key] = value
        return
    old = table.item(key)
    new = value if hasattr(value, "trivia") else tomlkit.item(value)
    if old.as_string() == new.as_string():
        return  # unchanged: leave the item (and its formatting) alone
    if old.trivia.comment:
        col = len(old.as_string()) + len(old.trivia.comment_ws)
        new.trivia.comment_ws = " " * max(1, col - len(new.as_string()))
        new.trivia.comment = old.trivia.comment
    new.trivia.indent = old.trivia.indent
    new.trivia.trail = old.trivia.trail
    table[key] = new


# ---------------------------------------------------------------- pyproject


def read_pyproject(path: Path | str) -> PyProject:
    """Name, version and opstrata-* requirements of one pyproject.toml, with clear errors when malformed."""
    path = Path(path)
    doc = parse_toml(read_text(path, "pyproject.toml"), path)
    problems: list[str] = []
    project = doc.get("project")
    if not isinstance(project, dict):
        _expect(problems, path, "project", "a [project] table", project)
        raise LockError(problems[0], problems)
    name, version = project.get("name"), project.get("version")
    if not isinstance(name, str) or not name:
        _expect(problems, path, "project.name", 'a distribution name like "opstrata-ops"', name)
    if not isinstance(version, str) or not _is_version(version):
        hint = ' (dynamic versions are not supported: the lock and release.py edit "version")'
        _expect(problems, path, "project.version", 'a PEP 440 version string like "0.1.0"' + hint, version)
    requires = _opstrata_requires(path, project.get("dependencies", []), problems)
    if problems:
        raise LockError("\n".join(problems), problems)
    return PyProject(path=path, name=str(name), version=str(version), requires=requires)


def _opstrata_requires(path: Path, deps: Any, problems: list[str]) -> dict[str, str]:
    """Map short name -> specifier text for every opstrata-* dependency, keeping the author's spelling."""
    if not isinstance(deps, list) or not all(isinstance(d, str) for d in deps):
        _expect(problems, path, "project.dependencies", "an array of requirement strings", deps)
        return {}
    out: dict[str, str] = {}
    for i, dep in enumerate(deps):
        try:
            req = Requirement(dep)
        except InvalidRequirement as e:
            _expect(problems, path, f"project.dependencies[{i}]", f"a PEP 508 requirement ({e})", dep)
            continue
        canon = canonicalize_name(req.name)
        if canon.startswith(DIST_PREFIX):
            spec = re.sub(r"\s+", "", dep.split(";", 1)[0])
            spec = re.sub(r"^[A-Za-z0-9._-]+(\[[^\]]*\])?", "", spec)
            if spec.startswith("(") and spec.endswith(")"):
                spec = spec[1:-1]
            if not _is_specifier(spec):
                spec = str(req.specifier)  # URL or unusual spelling: packaging's normal form
            out[canon[len(DIST_PREFIX) :].replace("-", "_")] = spec
    return out


def _is_version(text: str) -> bool:
    """True if text is a PEP 440 version."""
    try:
        Version(text)
    except InvalidVersion:
        return False
    return True


def _is_specifier(text: str) -> bool:
    """True if text is a PEP 440 specifier set."""
    try:
        SpecifierSet(text)
    except InvalidSpecifier:
        return False
    return True


def load_pyprojects(repo_root: Path | str, names: list[str] | tuple[str, ...]) -> dict[str, PyProject]:
    """read_pyproject for packages/<name>/pyproject.toml of each name (raises on the first bad one)."""
    return {n: read_pyproject(Path(repo_root) / "packages" / n / "pyproject.toml") for n in names}


def package_dirs(repo_root: Path | str) -> list[str]:
    """Short names of the directories under packages/ that hold a pyproject.toml."""
    base = Path(repo_root) / "packages"
    return sorted(p.parent.name for p in base.glob("*/pyproject.toml")) if base.is_dir() else []


def default_layers(repo_root: Path | str) -> list[str]:
    """The default layer order, filtered to the packages present under packages/."""
    present = set(package_dirs(repo_root))
    return [n for n in DEFAULT_LAYERS if n in present]


def current_layers(repo_root: Path | str) -> list[str]:
    """Layer order: from the lock when it exists, else default_layers."""
    path = lock_path(repo_root)
    if path.exists():
        return [str(x) for x in read_lock(path)["layers"]]
    return default_layers(repo_root)


# ---------------------------------------------------------------- the lock


def read_lock(path: Path | str) -> TOMLDocument:
    """Parse and validate versions.lock; every problem is listed in one LockError."""
    path = Path(path)
    if not path.exists():
        raise LockError(f"{show(path)}: not found; create it with `python tools/lock.py sync`")
    doc = parse_toml(read_text(path, "lock file"), path)
    problems = validate_lock(doc, path)
    if problems:
        raise LockError(f"{show(path)} is malformed; {_FIX}:\n  - " + "\n  - ".join(problems), problems)
    return doc


def write_lock(doc: TOMLDocument, path: Path | str) -> None:
    """Validate and atomically write the lock (temp file in the same directory + os.replace)."""
    problems = validate_lock(doc, path)
    if problems:
        raise LockError(
            f"refusing to write an invalid {show(path)}:\n  - " + "\n  - ".join(problems), problems
        )
    atomic_write_text(path, tomlkit.dumps(doc))


def validate_lock(doc: Mapping[str, Any], path: Path | str) -> list[str]:
    """Every schema problem in a parsed lock, each naming the key, the expected and the found."""
    problems: list[str] = []
    schema = doc.get("schema")
    if schema != SCHEMA or isinstance(schema, bool):
        _expect(problems, path, "schema", f"the integer {SCHEMA}", schema)
    layers = doc.get("layers")
    if (
        not isinstance(layers, list)
        or not layers
        or not all(isinstance(x, str) and _NAME.fullmatch(x) for x in layers)
    ):
        _expect(
            problems, path, "layers", 'a non-empty array of package short names like ["ops", "graph"]', layers
        )
        layers = []
    elif len(set(layers)) != len(layers):
        _expect(problems, path, "layers", "each package once", layers)
    packages = doc.get("packages")
    if not isinstance(packages, dict):
        _expect(problems, path, "packages", "a table with one [packages.<name>] per layer", packages)
        return problems
    for name in layers:
        if name not in packages:
            _expect(problems, path, f"packages.{name}", f"a table (layers lists {name!r})", None)
    for name, table in packages.items():
        if name not in layers:
            problems.append(f"{show(path)}: key 'packages.{name}': not listed in 'layers' {list(layers)}")
        elif not isinstance(table, dict):
            _expect(problems, path, f"packages.{name}", "a table", table)
        else:
            _validate_package(problems, path, name, table, list(layers))
    return problems


def _validate_package(
    problems: list[str], path: Path | str, name: str, t: Mapping[str, Any], layers: list[str]
) -> None:
    """Schema problems of one [packages.<name>] table."""
    key = f"packages.{name}"
    for field_, expected in (("distribution", f'"{DIST_PREFIX}{name}"'), ("path", f'"packages/{name}"')):
        if not isinstance(t.get(field_), str) or not t.get(field_):
            _expect(problems, path, f"{key}.{field_}", f"a string like {expected}", t.get(field_))
    if not isinstance(t.get("version"), str) or not _is_version(t["version"]):
        _expect(problems, path, f"{key}.version", 'a PEP 440 version string like "0.1.0"', t.get("version"))
    _validate_map(
        problems, path, f"{key}.requires", t.get("requires"), _is_specifier, 'a specifier like ">=0.1,<0.2"'
    )
    _validate_map(
        problems,
        path,
        f"{key}.tested-with",
        t.get("tested-with"),
        _is_version,
        'an exact version like "0.1.0"',
    )
    releases = t.get("releases", {})
    if not isinstance(releases, dict):
        _expect(problems, path, f"{key}.releases", 'a table of [releases."<version>"] tables', releases)
        return
    for ver, rel in releases.items():
        rkey = f'{key}.releases."{ver}"'
        if not _is_version(ver):
            _expect(problems, path, rkey, "a PEP 440 version as the table name", ver)
        if not isinstance(rel, dict):
            _expect(problems, path, rkey, "a table with tree and date", rel)
            continue
        tree, date = rel.get("tree"), rel.get("date")
        if not isinstance(tree, str) or not _HEX40.fullmatch(tree):
            _expect(problems, path, f"{rkey}.tree", "a 40-hex git tree hash", tree)
        if not isinstance(date, str) or not _DATE.fullmatch(date) or not _valid_date(date):
            _expect(problems, path, f"{rkey}.date", 'a date string "YYYY-MM-DD"', date)


def _validate_map(
    problems: list[str], path: Path | str, key: str, value: Any, ok: Any, expected: str
) -> None:
    """A {short name -> string} table whose values pass `ok`."""
    if not isinstance(value, dict):
        _expect(problems, path, key, "a table like { ops = ... } (may be empty: {})", value)
        return
    for k, v in value.items():
        if not isinstance(v, str) or not ok(v):
            _expect(problems, path, f"{key}.{k}", expected, v)


def _valid_date(text: str) -> bool:
    """True for a real calendar date."""
    try:
        _dt.date.fromisoformat(text)
    except ValueError:
        return False
    return True


def new_lock(layers: list[str] | tuple[str, ...]) -> TOMLDocument:
    """An empty lock document (header comment, schema, layers) for `lock.py sync` to fill."""
    layer_list = ", ".join(f'"{n}"' for n in layers)
    return tomlkit.parse(f"{HEADER}schema = {SCHEMA}\nlayers = [{layer_list}]\n")


def package_table(name: str) -> Any:
    """A fresh [packages.<name>] table with the keys in the documented order."""
    text = (
        f'\n[packages.{name}]\ndistribution = "{DIST_PREFIX}{name}"\npath = "packages/{name}"\n'
        'version = "0.0.0"\nrequires = {}\ntested-with = {}\n'
    )
    return tomlkit.parse(text)["packages"][name]


# ---------------------------------------------------------------- queries used by release.py and nox


def released_versions(lock: Mapping[str, Any], package: str) -> list[str]:
    """Released versions of a package, oldest first (by PEP 440 order, not file order)."""
    releases = lock["packages"][package].get("releases", {})
    return sorted((str(v) for v in releases), key=Version)


def release_tree(lock: Mapping[str, Any], package: str, version: str) -> str:
    """The git tree hash recorded for `package` `version`; LockError listing the known releases if absent."""
    packages = lock["packages"]
    if package not in packages:
        raise LockError(f"{LOCK_NAME}: no package {package!r}; known: {', '.join(packages)}")
    releases = packages[package].get("releases", {})
    if version not in releases:
        known = ", ".join(released_versions(lock, package)) or "none yet"
        raise LockError(
            f"{LOCK_NAME}: key 'packages.{package}.releases.\"{version}\"': expected a recorded release, "
            f"found none (released: {known}); release it with `python tools/release.py {package} ...`"
        )
    return str(releases[version]["tree"])


def compat_matrix(lock: Mapping[str, Any], repo_root: Path | str | None = None) -> list[tuple[str, str, str]]:
    """(package, lower, version): each declared lower at its oldest and newest released version the range admits.

    With `repo_root` (the checkout whose git holds the release trees) the newest is the newest admitted
    release that can be installed with the package's other ranges (tools/ranges.py resolves them; the
    oldest stays the declared bound, which `lock.py check` proves installable). Without it, the plain
    oldest and newest admitted releases.
    """
    if repo_root is not None:
        import ranges

        return ranges.Universe.from_lock(repo_root, lock).matrix()
    out: list[tuple[str, str, str]] = []
    packages = lock["packages"]
    for name in lock["layers"]:
        for lower, spec in packages[name]["requires"].items():
            if lower not in packages:
                continue
            admitted = [
                v
                for v in released_versions(lock, lower)
                if SpecifierSet(str(spec)).contains(v, prereleases=True)
            ]
            for v in dict.fromkeys(admitted[:1] + admitted[-1:]):
                out.append((str(name), str(lower), v))
    return out
