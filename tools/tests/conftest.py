"""Fixtures for the tools/ tests: a throwaway monorepo (ops, graph, runtime) in a git repo under tmp.

The template repo is built once per session and copied per test, so each test may edit, commit and
release freely. The tools run as subprocesses with cwd set to the copy, exactly as a developer runs them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parents[1]
REAL_ROOT = TOOLS.parent
sys.path.insert(0, str(TOOLS))

GIT_ENV = {
    "GIT_AUTHOR_NAME": "opstrata test",
    "GIT_AUTHOR_EMAIL": "test@opstrata.invalid",
    "GIT_COMMITTER_NAME": "opstrata test",
    "GIT_COMMITTER_EMAIL": "test@opstrata.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,  # no user config (signing, hooks) leaks into the fake repos
    "GIT_CONFIG_NOSYSTEM": "1",
}
FAKE = {"ops": {}, "graph": {"ops": ">=0.1,<0.2"}, "runtime": {"graph": ">=0.1,<0.2", "ops": ">=0.1,<0.2"}}


def pyproject_text(name: str, requires: dict[str, str], version: str = "0.1.0") -> str:
    """A minimal hatchling pyproject for a fake package (no third-party deps, so installs work offline)."""
    deps = "".join(f'    "opstrata-{low}{spec}",\n' for low, spec in requires.items())
    return (
        '[build-system]\nrequires = ["hatchling>=1.21"]\nbuild-backend = "hatchling.build"\n\n'
        f'[project]\nname = "opstrata-{name}"\nversion = "{version}"  # bumped by tools/release.py\n'
        f'description = "fake {name}"\nrequires-python = ">=3.10"\ndependencies = [\n{deps}]\n\n'
        '[tool.hatch.build.targets.wheel]\npackages = ["src/opstrata"]\n'
    )


def git(root: Path, *args: str) -> str:
    """Run git in root with the test identity; return stdout."""
    proc = subprocess.run(
        ["git", *args], cwd=root, env={**os.environ, **GIT_ENV}, capture_output=True, text=True, check=True
    )
    return proc.stdout.strip()


def commit_all(root: Path, message: str = "change") -> None:
    """Stage everything in the fake repo and commit it."""
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", message)


def run(root: Path, tool: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run tools/<tool> with cwd=root (the tools find the repo from the cwd's git toplevel)."""
    return subprocess.run(
        [sys.executable, str(TOOLS / tool), *args],
        cwd=root,
        env={**os.environ, **GIT_ENV},
        capture_output=True,
        text=True,
        check=False,
    )


def write_package(root: Path, name: str, requires: dict[str, str]) -> None:
    """Create packages/<name> with pyproject, changelog, readme and one module."""
    pkg = root / "packages" / name
    (pkg / "src" / "opstrata" / name).mkdir(parents=True)
    (pkg / "src" / "opstrata" / name / "__init__.py").write_text(
        f'"""fake opstrata.{name}."""\n\nVALUE = 1\n'
    )
    (pkg / "pyproject.toml").write_text(pyproject_text(name, requires))
    (pkg / "README.md").write_text(f"# opstrata-{name}\n")
    (pkg / "CHANGELOG.md").write_text(
        f"# Changelog — opstrata-{name}\n\nIntro text.\n\n## Unreleased\n\n### Added\n- First cut of {name}.\n"
    )


@pytest.fixture(scope="session")
def template_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The fake monorepo, committed, with a synced versions.lock (nothing released yet)."""
    root = tmp_path_factory.mktemp("template") / "repo"
    root.mkdir()
    git(root, "init", "-q", "-b", "main")
    (root / ".gitignore").write_text("__pycache__/\n*.log\ndist/\n")
    for name, requires in FAKE.items():
        write_package(root, name, requires)
    proc = run(root, "lock.py", "sync")
    assert proc.returncode == 0, proc.stderr
    commit_all(root, "fake monorepo")
    return root


@pytest.fixture
def repo(template_repo: Path, tmp_path: Path) -> Path:
    """A private copy of the fake monorepo for one test."""
    dest = tmp_path / "repo"
    shutil.copytree(template_repo, dest, symlinks=True)
    return dest


@pytest.fixture
def released(repo: Path) -> Path:
    """The fake monorepo with ops 0.1.0 released (`current`) and committed."""
    proc = run(repo, "release.py", "ops", "current", "--date", "2026-12-03")
    assert proc.returncode == 0, proc.stderr
    commit_all(repo, "Release opstrata-ops 0.1.0")
    return repo
