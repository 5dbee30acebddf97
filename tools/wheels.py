"""Build sdists and wheels of packages, and rebuild any recorded release from its git tree hash.

Shared by tools/build.py and noxfile.py (`sys.path.insert(0, "tools"); import wheels`). It is not named
build.py's module so it never shadows PyPI's `build`. Builds use `uv build` (fast, isolated), falling
back to `python -m build` when uv is missing.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import lockfile as lf
from lockfile import LockError

_DIST_SUFFIXES = (".whl", ".tar.gz")


def builder(*, sdist: bool, wheel: bool, out_dir: Path, src: Path) -> list[str]:
    """The build command: uv build when on PATH, else python -m build (both isolated, hatchling backend).

    Asking for both means no flag: then both tools build the sdist and the wheel *from the sdist*, which
    catches files missing from the sdist.
    """
    flags = [] if sdist and wheel else ["--sdist"] if sdist else ["--wheel"]
    if shutil.which("uv"):
        return ["uv", "build", "--quiet", *flags, "--out-dir", str(out_dir), str(src)]
    return [sys.executable, "-m", "build", *flags, "--outdir", str(out_dir), str(src)]


def build_dir(src: Path | str, out_dir: Path | str, *, sdist: bool = True, wheel: bool = True) -> list[Path]:
    """Build one package directory into out_dir; returns the files made (sdist+wheel: wheel built from sdist)."""
    src, out_dir = Path(src), Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="opstrata-build-") as tmp:
        cmd = builder(sdist=sdist, wheel=wheel, out_dir=Path(tmp), src=src)
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise LockError(
                f"building {src} failed ({' '.join(cmd[:2])}):\n{proc.stderr.strip() or proc.stdout.strip()}"
            )
        made = []
        for f in sorted(Path(tmp).iterdir()):
            if f.name.endswith(_DIST_SUFFIXES):
                dest = out_dir / f.name
                shutil.move(str(f), dest)
                made.append(dest)
    if not made:
        raise LockError(f"building {src} produced no sdist or wheel")
    return made


def build_packages(
    repo_root: Path | str, names: list[str] | None = None, out_dir: Path | str = "dist"
) -> list[Path]:
    """sdist + wheel of the named packages (default: all in layer order) into out_dir (relative to repo_root)."""
    root = Path(repo_root)
    layers = lf.current_layers(root)
    names = names or layers
    unknown = [n for n in names if n not in layers]
    if unknown:
        raise LockError(f"unknown package(s) {', '.join(unknown)}; known: {', '.join(layers)}")
    out = root / out_dir
    return [f for n in names for f in build_dir(root / "packages" / n, out)]


def export_tree(repo_root: Path | str, tree: str, dest: Path | str) -> Path:
    """Extract the files of a git tree object into dest (`git archive <tree> | tar -x -C dest`)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    proc = subprocess.run(
        ["git", "archive", "--format=tar", tree], cwd=repo_root, capture_output=True, check=False
    )
    if proc.returncode != 0:
        raise LockError(
            f"git archive {tree} failed in {repo_root}: {proc.stderr.decode(errors='replace').strip()}; "
            "the tree must be in this clone's object db (fetch full history, not a shallow clone)"
        )
    with tarfile.open(fileobj=io.BytesIO(proc.stdout)) as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
        else:  # Python < 3.11.4 has no extraction filters; git archive output has no absolute paths
            tar.extractall(dest)
    return dest


def build_tree(repo_root: Path | str, tree: str, out_dir: Path | str, *, sdist: bool = False) -> list[Path]:
    """Build the package stored in a git tree (e.g. a release's recorded tree) into out_dir."""
    with tempfile.TemporaryDirectory(prefix="opstrata-tree-") as tmp:
        src = export_tree(repo_root, tree, Path(tmp) / "pkg")
        return build_dir(src, out_dir, sdist=sdist, wheel=True)


def build_release(repo_root: Path | str, package: str, version: str, out_dir: Path | str) -> Path:
    """Rebuild the wheel of a recorded release from its tree hash in versions.lock; returns the wheel path."""
    root = Path(repo_root)
    lock = lf.read_lock(lf.lock_path(root))
    tree = lf.release_tree(lock, package, version)
    with tempfile.TemporaryDirectory(prefix="opstrata-release-") as tmp:
        src = export_tree(root, tree, Path(tmp) / package)
        pp = lf.read_pyproject(src / "pyproject.toml")
        if pp.version != version:
            raise LockError(
                f"tree {tree[:12]} recorded for {package} {version} has version {pp.version} in its pyproject.toml; "
                "the lock entry is wrong — restore versions.lock from git"
            )
        wheels = [f for f in build_dir(src, out_dir, sdist=False, wheel=True) if f.suffix == ".whl"]
    return wheels[0]
