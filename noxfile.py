"""The one entry point for opstrata's checks: `nox -l` lists them, `nox -t ci` runs the CI set.

Every package is tested from built wheels (never editable installs: an editable install of a shared
PEP 420 namespace hides packaging mistakes) in a fresh venv holding only that package and the
packages below it. Wheels are built once per nox run into a temporary directory, so a changed source
tree is never served a stale wheel of the same version. See docs/architecture.md and docs/releasing.md.
"""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
LAYERS = ("ops", "graph", "runtime", "comm", "quant", "eval")

nox.options.default_venv_backend = "uv|virtualenv"
nox.options.error_on_missing_interpreters = False
nox.options.reuse_venv = "no"
nox.options.tags = ["ci"]  # a bare `nox` runs the CI set; `nox -s build` still runs build

sys.path.insert(0, str(ROOT / "tools"))

# ---------------------------------------------------------------- the compatibility matrix


def _load_matrix() -> tuple[list[tuple[str, str, str]], str | None]:
    """(package, lower, version) rows from versions.lock, or an error text for a session to report."""
    lock_file = ROOT / "versions.lock"
    if not lock_file.exists():
        return [], None
    try:
        import lockfile

        return lockfile.compat_matrix(lockfile.read_lock(lock_file), ROOT), None
    except Exception as exc:  # reported by the compat session: `nox -l` must still list everything
        return [], f"cannot build the compat matrix from {lock_file}: {type(exc).__name__}: {exc}"


MATRIX, MATRIX_ERROR = _load_matrix()

# ---------------------------------------------------------------- wheels, built once per nox run

_WHEEL_DIR = Path(tempfile.mkdtemp(prefix="opstrata-nox-wheels-"))
atexit.register(shutil.rmtree, _WHEEL_DIR, ignore_errors=True)
_built: dict[tuple[str, str | None], Path] = {}


def _uv() -> str | None:
    """Path of the uv executable (the PyPI `uv` package's binary first, then PATH), or None."""
    try:
        import uv

        return uv.find_uv_bin()
    except (ImportError, FileNotFoundError):
        return shutil.which("uv")


def _lower(package: str) -> list[str]:
    """The packages below `package`, bottom first."""
    return list(LAYERS[: LAYERS.index(package)])


def _higher(package: str) -> list[str]:
    """The packages above `package`, bottom first."""
    return list(LAYERS[LAYERS.index(package) + 1 :])


def _build_wheel(session: nox.Session, source: Path, out_dir: Path) -> Path:
    """Build one wheel of the package at `source` into the empty dir `out_dir` and return its path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    uv = _uv()
    if uv:
        session.run(uv, "build", "--wheel", "--quiet", "--out-dir", str(out_dir), str(source), external=True)
    else:
        session.run(
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "-w",
            str(out_dir),
            str(source),
            external=True,
        )
    wheels = sorted(out_dir.glob("*.whl"))
    if len(wheels) != 1:
        session.error(
            f"building {source}: expected exactly one wheel in {out_dir}, found {[w.name for w in wheels]}"
        )
    return wheels[0]


def _current_wheel(session: nox.Session, package: str) -> Path:
    """The wheel of packages/<package> as it is in the working tree (built once per nox run)."""
    key = (package, None)
    if key not in _built:
        _built[key] = _build_wheel(session, ROOT / "packages" / package, _WHEEL_DIR / "current" / package)
    return _built[key]


def _released_wheel(session: nox.Session, package: str, version: str) -> Path:
    """The wheel of `package` `version` rebuilt from the git tree recorded in versions.lock."""
    key = (package, version)
    if key not in _built:
        build_release = _find_build_release(session)
        out_dir = _WHEEL_DIR / "released" / package / version
        out_dir.mkdir(parents=True, exist_ok=True)
        wheel = Path(build_release(ROOT, package, version, out_dir))
        if wheel.suffix != ".whl" or not wheel.is_file():
            session.error(
                f"build_release({package!r}, {version!r}) returned {wheel}, expected a built .whl file"
            )
        _built[key] = wheel
    return _built[key]


def _find_build_release(session: nox.Session):  # -> Callable[[Path, str, str, Path], Path]
    """tools' `build_release(repo_root, package, version, out_dir) -> Path` (tools/wheels.py or tools/lockfile.py)."""
    for module_name in ("wheels", "lockfile"):
        try:
            module = __import__(module_name)
        except ImportError:
            continue
        if hasattr(module, "build_release"):
            return module.build_release
    session.error(
        "compat: no build_release(repo_root, package, version, out_dir) in tools/wheels.py or tools/lockfile.py; "
        "it rebuilds a released package from its recorded tree"
    )
    raise AssertionError("unreachable")


def _extras(package: str, name: str) -> list[str]:
    """Extras of `name` to install when testing `package`: its own [test], and graph[onnx] from graph up."""
    extras = ["test"] if name == package else []
    if name == "graph":
        extras.append("onnx")  # ONNX import/export is exercised by graph and every layer above it
    return extras


def _install(session: nox.Session, wheels: dict[str, Path], package: str) -> None:
    """Install the wheels by path (so no index can substitute a same-named release) with the test extras."""
    specs = []
    for name, wheel in wheels.items():
        extras = _extras(package, name)
        specs.append(f"{wheel}[{','.join(extras)}]" if extras else str(wheel))
    session.install(*specs)


_ISOLATION_CHECK = """\
import importlib.metadata, importlib.util, sys, sysconfig
present, absent = sys.argv[1].split(","), [n for n in sys.argv[2].split(",") if n]
site = sysconfig.get_paths()["purelib"]
bad = []
for name in absent:
    if importlib.util.find_spec("opstrata." + name) is not None:
        bad.append(f"opstrata.{name} is importable but sits above the package under test")
    try:
        importlib.metadata.distribution("opstrata-" + name)
        bad.append(f"distribution opstrata-{name} is installed but sits above the package under test")
    except importlib.metadata.PackageNotFoundError:
        pass
for name in present:
    spec = importlib.util.find_spec("opstrata." + name)
    if spec is None or not str(spec.origin).startswith(site):
        bad.append(f"opstrata.{name}: expected it in the venv's {site}, found {spec and spec.origin}")
if bad:
    sys.exit("isolation check failed:\\n  - " + "\\n  - ".join(bad) + "\\nfix: no package may depend on a "
             "higher one (see its pyproject.toml dependencies) and tests must import the installed wheel")
print(f"isolation ok: {present} import from the venv's wheels; none of {absent} is importable")
"""


def _assert_only(session: nox.Session, present: list[str], absent: list[str]) -> None:
    """Fail the session unless each `present` package imports from the venv and no `absent` one is importable."""
    tmp = Path(session.create_tmp()).resolve()
    script = tmp / "isolation_check.py"
    script.write_text(_ISOLATION_CHECK, encoding="utf-8")
    with session.chdir(tmp):  # no checkout directory on sys.path
        session.run("python", str(script), ",".join(present), ",".join(absent), env={"PYTHONPATH": ""})


# Suites that run in parallel under pytest-xdist. comm stays serial: every collective test spawns its
# own rank processes and its fault tests detect hangs and deaths by deadlines, which two test workers
# competing with those ranks for two cores would turn into flakes.
XDIST_SAFE = ("ops", "graph", "runtime", "quant", "eval", "tools")


def _xdist_args(session: nox.Session, package: str) -> list[str]:
    """`-n N --dist loadfile` for xdist-safe suites (N = cores, at most 4; OPSTRATA_TEST_WORKERS overrides)."""
    workers = os.environ.get("OPSTRATA_TEST_WORKERS") or str(min(4, os.cpu_count() or 1))
    if package not in XDIST_SAFE or workers in ("0", "1"):
        return []
    session.install("pytest-xdist>=3.5")
    return ["-n", workers, "--dist", "loadfile"]


def _compat_tests(package: str, lower: str) -> list[str]:
    """The tests of `package` a compat session runs against a release of `lower` (docs/releasing.md).

    Import analysis: the test modules that import `opstrata.<lower>` (`import opstrata.<lower>...`,
    `from opstrata.<lower>... import`, `from opstrata import <lower>`), directly or through a helper
    module of the tests directory (`from _cases import ...`), exercise that package's API; when no
    module does, the whole suite runs.
    """
    import ast

    tests = ROOT / "packages" / package / "tests"
    imports: dict[str, tuple[bool, set[str]]] = {}  # module stem -> (imports lower, local modules it imports)
    for path in sorted(tests.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        except (SyntaxError, UnicodeDecodeError):
            imports[path.stem] = (True, set())  # let pytest report it
            continue
        names: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names += [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                module = node.module or ""
                names += [module, *(f"{module}.{a.name}".lstrip(".") for a in node.names)]
        direct = any(n == f"opstrata.{lower}" or n.startswith(f"opstrata.{lower}.") for n in names)
        imports[path.stem] = (direct, {n.split(".")[0] for n in names if n and not n.startswith("opstrata")})

    def reaches(stem: str, seen: set[str]) -> bool:
        direct, local = imports[stem]
        seen.add(stem)
        return direct or any(m in imports and m not in seen and reaches(m, seen) for m in local)

    chosen = [p for p in sorted(tests.rglob("test_*.py")) if reaches(p.stem, set())]
    return [str(p.relative_to(tests.parent)) for p in chosen] or ["tests"]


def _run_tests(
    session: nox.Session, package: str, paths: list[str] | None = None, env: dict[str, str] | None = None
) -> None:
    """Run packages/<package>/tests (or `paths` below the package) in their own pytest process.

    `env` adds environment variables to the pytest process.
    """
    pkg_dir = ROOT / "packages" / package
    tests = pkg_dir / "tests"
    if not tests.is_dir():
        session.error(f"{package}: expected a tests directory at {tests}, found none; add tests/test_*.py")
    run_env = {"PYTHONPATH": "", "OPSTRATA_CACHE_DIR": str(Path(session.create_tmp()).resolve() / "cache")}
    run_env.update(env or {})
    xdist = _xdist_args(session, package)
    with session.chdir(pkg_dir):
        session.run(
            "pytest", *(paths or ["tests"]), "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(pkg_dir),
            "-p", "no:cacheprovider", *xdist, *_hypothesis_seed(), *session.posargs, env=run_env,
        )  # fmt: skip


def _hypothesis_seed() -> list[str]:
    """Under CI, a fixed hypothesis seed: a red CI run is reproducible and never a coin toss.

    Locally tests keep drawing fresh examples; `HYPOTHESIS_SEED=<n>` pins any run.
    """
    seed = os.environ.get("HYPOTHESIS_SEED") or ("0" if os.environ.get("CI") else None)
    return [f"--hypothesis-seed={seed}"] if seed else []


# ---------------------------------------------------------------- sessions


def _install_tools(session: nox.Session, *extra: str) -> None:
    """Install tools/requirements.txt (what the tools and their tests need) plus `extra`."""
    requirements = ROOT / "tools" / "requirements.txt"
    if not requirements.is_file():
        session.error(f"expected {requirements} listing the tools' requirements, found none")
    session.install("-r", str(requirements), *extra)


@nox.session(python=None, tags=["ci"])
def lint(session: nox.Session) -> None:
    """ruff check and ruff format --check over the whole repository."""
    session.install("ruff>=0.17,<0.18")  # pinned: a new ruff release must not fail CI by itself
    with session.chdir(ROOT):
        session.run("ruff", "check", ".")
        session.run("ruff", "format", "--check", ".")


@nox.session(python=None, tags=["ci"])
def lock(session: nox.Session) -> None:
    """versions.lock agrees with the pyprojects and git (`tools/lock.py check`)."""
    _install_tools(session)
    session.run("python", str(ROOT / "tools" / "lock.py"), "check")


@nox.session(python=None, tags=["ci"])
def layers(session: nox.Session) -> None:
    """The import-linter layers contract over the six src trees, and the proof that it catches an upward import."""
    session.install("import-linter>=2", "pytest>=7", "tomlkit>=0.12")
    src = os.pathsep.join(str(ROOT / "packages" / name / "src") for name in LAYERS)
    with session.chdir(ROOT):  # lint-imports reads the contract from ./pyproject.toml
        session.run("lint-imports", "--no-cache", env={"PYTHONPATH": src})
        session.run("pytest", "tools/tests/test_layers.py", "-p", "no:cacheprovider", env={"PYTHONPATH": ""})


@nox.session(python=None, tags=["ci"])
def tools(session: nox.Session) -> None:
    """The tools' own tests (lock, release, build, deps, layers)."""
    # with ruff too: release.py refuses a package `ruff format` would change (tested with it)
    _install_tools(session, "import-linter>=2", "pytest>=7", "ruff>=0.17,<0.18")
    xdist = _xdist_args(session, "tools")  # each test works in its own temporary repository
    with session.chdir(ROOT):
        session.run("pytest", "tools/tests", "-p", "no:cacheprovider", *xdist, *session.posargs)


@nox.session(python=None, tags=["ci"])
@nox.parametrize("package", LAYERS)
def tests(session: nox.Session, package: str) -> None:
    """A package's tests with only it and its lower packages installed from freshly built wheels."""
    names = [*_lower(package), package]
    wheels = {name: _current_wheel(session, name) for name in names}
    _install(session, wheels, package)
    _assert_only(session, names, _higher(package))
    _run_tests(session, package)


@nox.session(python=None, tags=["ci"])
def cuda_sources(session: nox.Session) -> None:
    """The cuda device's kernel source compiles with NVRTC (pip's nvidia-cuda-nvrtc; no GPU needed).

    OPSTRATA_REQUIRE_NVRTC=1 turns the test's skip-without-NVRTC into a failure.
    """
    wheel = _current_wheel(session, "ops")
    _install(session, {"ops": wheel}, "ops")
    session.install("nvidia-cuda-nvrtc>=13")
    _run_tests(session, "ops", ["tests/cuda/test_cuda_sources.py"], env={"OPSTRATA_REQUIRE_NVRTC": "1"})


# ---------------------------------------------------------------- other interpreters

#: Interpreters besides the one running nox that the matrix covers where the machine has them (this
#: machine and CI's: pyenv's 3.10, 3.12 and 3.13; `uv python install` cannot download here). 3.12 is in
#: the CI set; 3.10 and 3.13 run with `nox -t interpreters` (docs/releasing.md, "Python versions").
OTHER_PYTHONS = ("3.10", "3.12", "3.13")
PYTHONS_IN_CI = ("3.12",)
#: The suites an interpreter session runs: every layer but comm, whose serial ~6 min suite (rank processes,
#: deadline-based fault tests) runs on 3.11 in CI; `OPSTRATA_INTERPRETER_SUITES=all` adds it.
INTERPRETER_SUITES = ("ops", "graph", "runtime", "quant", "eval")


def _add_pyenv_interpreters() -> None:
    """Make pyenv's `versions/X.Y.*/bin/pythonX.Y` findable as `pythonX.Y` (nox, uv).

    A directory of just those links goes first on PATH: pyenv's shims answer `pythonX.Y` with "command
    not found" for versions that are not pyenv's global, and its version directories also hold `python`
    and `python3`, which must not shadow the interpreter running nox.
    """
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    links = Path(tempfile.mkdtemp(prefix="opstrata-nox-pythons-"))
    atexit.register(shutil.rmtree, links, ignore_errors=True)
    for version in OTHER_PYTHONS:
        found = sorted(root.glob(f"{version}.*/bin/python{version}"))
        if found:
            (links / f"python{version}").symlink_to(found[-1])
    if any(links.iterdir()):
        os.environ["PATH"] = os.pathsep.join([str(links), os.environ.get("PATH", "")])
    # uv must take these, not try to download a managed CPython (no route to GitHub here)
    os.environ.setdefault("UV_PYTHON_DOWNLOADS", "never")


_add_pyenv_interpreters()


@nox.session(tags=["interpreters"])
@nox.parametrize(
    "python",
    [nox.param(v, tags=["ci"] if v in PYTHONS_IN_CI else []) for v in OTHER_PYTHONS],
)
def interpreter(session: nox.Session) -> None:
    """Every layer's tests (comm with OPSTRATA_INTERPRETER_SUITES=all) on another Python, in one venv of
    all six wheels with the suites' test extras."""
    everything = os.environ.get("OPSTRATA_INTERPRETER_SUITES") == "all"
    suites = LAYERS if everything else INTERPRETER_SUITES
    specs = []
    for name in LAYERS:
        wheel, extras = _current_wheel(session, name), ["test"] if name in suites else []
        if name == "graph":
            extras.append("onnx")
        specs.append(f"{wheel}[{','.join(extras)}]" if extras else str(wheel))
    session.install(*specs)
    session.run("python", "-c", "import sys; print('interpreter', sys.version)")
    for name in suites:
        _run_tests(session, name)


def _resolve_row(session: nox.Session, package: str, lower: str, version: str) -> dict:
    """What one compat row installs: released `lower` `version` and the other lower packages resolved
    consistently with it and with `package`'s ranges (tools/ranges.py). No row is ever skipped: a row that
    cannot be installed is an error, because `tools/lock.py check` ([uninstallable-bound]) should have
    caught the range first."""
    import lockfile
    import ranges

    universe = ranges.Universe.from_lock(ROOT, lockfile.read_lock(ROOT / "versions.lock"))
    chosen = universe.resolve_row(package, lower, version)
    if chosen is None:
        session.error(
            f"compat: opstrata-{lower} {version} cannot be installed with opstrata-{package}'s other ranges "
            f"({universe.explain(package, lower, version)}); `python tools/lock.py check` should have reported "
            "it as [uninstallable-bound]: run `python tools/lock.py tighten` and release the package"
        )
    return chosen


if MATRIX:

    @nox.session(python=None, tags=["ci"])
    @nox.parametrize(("package", "lower", "version"), MATRIX)
    def compat(session: nox.Session, package: str, lower: str, version: str) -> None:
        """A package's API tests against one released lower version (rebuilt from its tree), the rest resolved."""
        chosen = _resolve_row(session, package, lower, version)
        names = [*[n for n in _lower(package) if n in chosen], package]
        wheels = {
            n: _current_wheel(session, n)
            if chosen[n].current
            else _released_wheel(session, n, chosen[n].version)
            for n in names[:-1]
        }
        wheels[package] = _current_wheel(session, package)
        session.log("compat: installing " + ", ".join(chosen[n].label() for n in names[:-1]))
        _install(session, wheels, package)
        _assert_only(session, names, _higher(package))
        expected = {n: chosen[n].version for n in names[:-1]}
        code = "import importlib.metadata as m, sys; print(' '.join(m.version('opstrata-' + n) for n in sys.argv[1:]))"
        found = (session.run("python", "-c", code, *expected, silent=True) or "").split()
        installed = dict(zip(expected, found, strict=False))
        if installed != expected:
            session.error(f"compat: expected {expected} installed, found {installed}")
        _run_tests(session, package, _compat_tests(package, lower))

else:

    @nox.session(venv_backend="none", tags=["ci"])
    def compat(session: nox.Session) -> None:
        """Placeholder while versions.lock records no release a range admits (or cannot be read)."""
        if MATRIX_ERROR:
            session.error(MATRIX_ERROR + "; fix versions.lock (see `python tools/lock.py check`)")
        session.skip(
            "compat matrix is empty: versions.lock records no released lower version; see docs/releasing.md"
        )


# Third-party packages whose declared minimum (`numpy>=1.24`) the `lowest` sessions install and test.
MINIMUMS = ("numpy", "ml-dtypes", "onnx", "onnxruntime", "mpi4py", "mpich")


def _declared_minimums(package: str, names: list[str]) -> list[str]:
    """The MINIMUMS requirements (dependencies and the extras `_install` adds) of `names`, markers applied."""
    import tomlkit
    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.utils import canonicalize_name

    out: dict[str, str] = {}
    for name in names:
        text = (ROOT / "packages" / name / "pyproject.toml").read_text(encoding="utf-8")
        project = tomlkit.parse(text)["project"]
        reqs = list(project.get("dependencies", []))
        for extra in _extras(package, name):
            reqs += list(project.get("optional-dependencies", {}).get(extra, []))
        for text in reqs:
            req = Requirement(str(text))
            dist = canonicalize_name(req.name)
            if dist in MINIMUMS and (req.marker is None or req.marker.evaluate()):
                out[dist] = str(SpecifierSet(out.get(dist, "")) & req.specifier)
    return [f"{dist}{spec}" for dist, spec in sorted(out.items())]


#: The packages whose `lowest` session is also in the CI set (`nox -t ci`): ops (numpy 1.24, ml_dtypes
#: 0.3), graph, runtime, quant and eval (onnx 1.16, onnxruntime 1.21), each under a minute on the 2-core
#: machine (quant's joined after an fp8 path broke there unseen). comm's takes its serial suite's ~6 min
#: for the mpi4py/mpich minimums alone: it runs with `nox -t lowest` (docs/releasing.md, "Third-party
#: minimums").
LOWEST_IN_CI = ("ops", "graph", "runtime", "quant", "eval")


@nox.session(python=None, tags=["lowest"])
@nox.parametrize("package", [nox.param(p, tags=["ci"] if p in LOWEST_IN_CI else []) for p in LAYERS])
def lowest(session: nox.Session, package: str) -> None:
    """A package's tests with the declared minimums of numpy, ml_dtypes, onnx, onnxruntime, mpi4py installed.

    uv's lowest-direct resolution over the declared third-party ranges (passed as direct requirements),
    binary wheels only: the oldest release of each that a user of this interpreter can install.
    """
    if not _uv():
        session.error("lowest: needs uv (`pip install uv`): pip has no lowest-version resolution")
    names = [*_lower(package), package]
    minimums = _declared_minimums(package, names)
    specs = []
    for name in names:
        wheel, extras = _current_wheel(session, name), _extras(package, name)
        specs.append(f"{wheel}[{','.join(extras)}]" if extras else str(wheel))
    session.log(f"lowest: resolving {', '.join(minimums)} to their lowest installable releases")
    session.install("--resolution", "lowest-direct", "--only-binary", ":all:", *specs, *minimums)
    code = (
        "import importlib.metadata as m, sys\n"
        "for d in sys.argv[1:]:\n"
        "    try: print(f'  {d} {m.version(d)}')\n"
        "    except m.PackageNotFoundError: pass\n"
    )
    session.run("python", "-c", code, *[m.split(">")[0].split("<")[0].split("=")[0] for m in minimums])
    _assert_only(session, names, _higher(package))
    _run_tests(session, package)


@nox.session(python=None, tags=["ci"])
def docs(session: nox.Session) -> None:
    """Generated docs agree with the code: docs/op-coverage.md (ops registry), docs/ir-ops.md (graph OpDefs)."""
    _install(session, {name: _current_wheel(session, name) for name in ("ops", "graph")}, "graph")
    with session.chdir(ROOT):
        session.run("python", "tools/gen_op_coverage.py", "--check")
        session.run("python", "tools/gen_ir_ops.py", "--check")


def _bench_needs(script: Path) -> list[str]:
    """The modules a benchmark script cannot run without: its ``# bench-needs: a b`` line (none: [])."""
    for line in script.read_text(encoding="utf-8").splitlines():
        if line.startswith("# bench-needs:"):
            return line.split(":", 1)[1].split()
    return []


def _missing_modules(session: nox.Session, modules: list[str]) -> list[str]:
    """Those of ``modules`` the session's python cannot import (looked up, not imported)."""
    if not modules:
        return []
    probe = f"import importlib.util as u; print(' '.join(m for m in {modules!r} if u.find_spec(m) is None))"
    return (session.run("python", "-c", probe, silent=True) or "").split()


@nox.session(python=None)
def bench(session: nox.Session) -> None:
    """Benchmarks, then a gate against a stored baseline; not in the CI set (CI machines differ).

    Runs every packages/*/benchmarks/bench_*.py (ratios against same-run baselines; `-- --quick` is
    passed on), then `opstrata bench ops` and `opstrata bench models` with `--compare baseline
    --fail-on-regression 10` against the baseline stored in .benchmarks/SUITE/ (OPSTRATA_BENCH_RESULTS
    overrides the directory). Without a stored baseline the run is saved as it (`--save baseline`);
    `-- --rebaseline` replaces it. The baseline is only as good as the machine it was measured on:
    keep it per machine, and re-save it after an intended change.
    """
    wheels = {name: _current_wheel(session, name) for name in LAYERS}
    extras = {"graph": "[onnx]", "eval": "[peers]"}  # ONNX models, and onnxruntime as the peer
    session.install(*[f"{wheel}{extras.get(name, '')}" for name, wheel in wheels.items()])
    rebaseline = "--rebaseline" in session.posargs
    script_args = [a for a in session.posargs if a != "--rebaseline"]
    # torch's OpenMP, where a peer loads it, must not spin beside the kernels; no checkout on sys.path
    env = {"OMP_WAIT_POLICY": "PASSIVE", "PYTHONPATH": ""}
    mpi_check = (
        "import importlib.util as u, shutil; print(bool(u.find_spec('mpi4py') and shutil.which('mpiexec')))"
    )
    has_mpi = "True" in (session.run("python", "-c", mpi_check, silent=True) or "")
    for name in LAYERS:
        for script in sorted((ROOT / "packages" / name / "benchmarks").glob("bench_*.py")):
            if script.name == "bench_mpi.py" and not has_mpi:
                session.log(f"skipped {script.relative_to(ROOT)}: needs mpi4py and mpiexec (comm[mpi])")
                continue
            missing = _missing_modules(session, _bench_needs(script))
            if missing:
                session.log(
                    f"skipped {script.relative_to(ROOT)}: needs {', '.join(missing)} (its '# bench-needs:' line)"
                )
                continue
            session.run("python", str(script), *script_args, env=env)
    rounds = "10" if "--quick" in session.posargs else "20"
    base = Path(os.environ.get("OPSTRATA_BENCH_RESULTS") or ROOT / ".benchmarks")  # one dir per suite
    for suite in ("ops", "models"):
        results = base / suite
        command = ["opstrata", "bench", suite, "--rounds", rounds, "--results", str(results)]
        if rebaseline or not (results / "baseline.json").is_file():
            why = "--rebaseline" if rebaseline else "no stored baseline"
            session.log(f"bench {suite}: {why}: saving this run as the baseline in {results}")
            session.run(*command, "--save", "baseline", env=env)
        else:
            session.log(f"bench {suite}: gating against {results / 'baseline.json'} (slower by > 10 % fails)")
            session.run(*command, "--compare", "baseline", "--fail-on-regression", "10", env=env)


@nox.session(python=None)
def build(session: nox.Session) -> None:
    """sdists and wheels of all (or the named: `nox -s build -- ops graph`) packages into dist/."""
    _install_tools(session)
    with session.chdir(ROOT):
        session.run("python", "tools/build.py", *session.posargs)


@nox.session(python=None, venv_backend="virtualenv", tags=["ci"])
def zoo(session: nox.Session) -> None:
    """The model zoo's tests on wheels of all six packages plus opstrata-eval[zoo,test] (torch, exporters).

    virtualenv + pip, not uv: the zoo pins torch==2.14.1 / torchvision==0.29.1, which pip takes from the
    machine's local wheel store (its pip configuration) where uv would download a multi-GB CUDA build.
    """
    specs = []
    for name in LAYERS:
        extras = [*_extras("eval", name), *(["zoo"] if name == "eval" else [])]
        wheel = _current_wheel(session, name)
        specs.append(f"{wheel}[{','.join(extras)}]" if extras else str(wheel))
    session.install(*specs)
    _assert_only(session, list(LAYERS), [])
    pkg_dir = ROOT / "packages" / "eval"
    env = {
        "PYTHONPATH": "", "OPSTRATA_CACHE_DIR": str(Path(session.create_tmp()).resolve() / "cache"),
        "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1",
    }  # fmt: skip
    with session.chdir(pkg_dir):
        session.run(
            "pytest", "tests/test_zoo.py", "-c", str(ROOT / "pyproject.toml"), "--rootdir", str(pkg_dir),
            "-p", "no:cacheprovider", "-ra", *_hypothesis_seed(), *session.posargs, env=env,
        )  # fmt: skip
