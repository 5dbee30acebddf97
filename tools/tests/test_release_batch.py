"""tools/release.py batch: a breaking lower minor and the uppers it forces, released and checked as a whole."""

from __future__ import annotations

from pathlib import Path

import lockfile as lf
from conftest import commit_all, run


def _release_all_current(repo: Path) -> None:
    for name in ("ops", "graph", "runtime"):
        proc = run(repo, "release.py", name, "current", "--date", "2026-12-03")
        assert proc.returncode == 0, proc.stderr
    commit_all(repo, "first releases")


def _breaking_ops_minor(repo: Path, widen: tuple[str, ...]) -> None:
    """Change ops, and move the named uppers' ranges to the coming ops 0.2 (what a cascade needs)."""
    (repo / "packages/ops/src/opstrata/ops/__init__.py").write_text('"""fake opstrata.ops."""\n\nVALUE = 2\n')
    for name in ("ops", *widen):
        cl = repo / f"packages/{name}/CHANGELOG.md"
        cl.write_text(
            cl.read_text().replace("## Unreleased\n", "## Unreleased\n\n### Changed\n- ops 0.2.\n", 1)
        )
    for name in widen:
        pp = repo / f"packages/{name}/pyproject.toml"
        pp.write_text(pp.read_text().replace('"opstrata-ops>=0.1,<0.2"', '"opstrata-ops>=0.2,<0.3"'))
    if "runtime" in widen:
        pp = repo / "packages/runtime/pyproject.toml"
        pp.write_text(pp.read_text().replace('"opstrata-graph>=0.1,<0.2"', '"opstrata-graph>=0.1.1,<0.2"'))


def test_batch_releases_a_cascade_bottom_first(repo: Path) -> None:
    _release_all_current(repo)
    _breaking_ops_minor(repo, ("graph", "runtime"))
    one = run(repo, "release.py", "ops", "minor")
    assert one.returncode == 2, "one at a time, ops sees graph's and runtime's not-yet-released ranges"
    proc = run(
        repo, "release.py", "batch", "runtime:patch", "ops:minor", "graph:patch", "--date", "2026-12-04"
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[:3] == [
        line for line in proc.stdout.splitlines()[:3] if line.startswith("released opstrata-")
    ]
    lock = lf.read_lock(repo / "versions.lock")
    assert [str(lock["packages"][n]["version"]) for n in ("ops", "graph", "runtime")] == [
        "0.2.0",
        "0.1.1",
        "0.1.1",
    ]
    assert dict(lock["packages"]["runtime"]["tested-with"]) == {"graph": "0.1.1", "ops": "0.2.0"}
    assert run(repo, "lock.py", "check").returncode == 0


def test_batch_that_leaves_a_problem_writes_nothing(repo: Path) -> None:
    _release_all_current(repo)
    _breaking_ops_minor(repo, ("graph",))  # runtime still requires ops<0.2: the cascade is incomplete
    before = {p: (repo / p).read_text() for p in ("versions.lock", "packages/ops/pyproject.toml")}
    proc = run(repo, "release.py", "batch", "ops:minor", "graph:patch")
    assert proc.returncode == 2
    assert "lock check still fails (nothing was kept)" in proc.stderr and "runtime" in proc.stderr
    assert {p: (repo / p).read_text() for p in before} == before


def test_batch_refuses_bad_steps(repo: Path) -> None:
    assert "expected name:major|minor|patch|current" in run(repo, "release.py", "batch", "ops").stderr
    assert "unknown package" in run(repo, "release.py", "batch", "nope:patch").stderr
    assert "named twice" in run(repo, "release.py", "batch", "ops:patch", "ops:minor").stderr
