"""Honest ranges: `lock.py check` [uninstallable-bound], `lock.py tighten`, the resolved compat matrix."""

from __future__ import annotations

from pathlib import Path

import lockfile as lf
import pytest
import ranges
from conftest import commit_all, run


def edit(repo: Path, rel: str, old: str, new: str) -> None:
    path = repo / rel
    text = path.read_text()
    assert old in text, f"{old!r} not in {rel}"
    path.write_text(text.replace(old, new, 1))


def release(repo: Path, name: str, part: str, note: str = "Changed things.") -> None:
    """Describe, release and commit one package of the fake repo (as a developer does)."""
    edit(
        repo, f"packages/{name}/CHANGELOG.md", "## Unreleased\n", f"## Unreleased\n\n### Changed\n- {note}\n"
    )
    proc = run(repo, "release.py", name, part, "--date", "2026-12-04")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    commit_all(repo, f"Release {name} {part}")


@pytest.fixture
def history(repo: Path) -> Path:
    """ops, graph, runtime released at 0.1.0; then ops 0.2.0 (breaking) and graph 0.2.0 needing it.

    runtime (0.1.0 released; its pyproject since edited) declares graph>=0.1,<0.2 and ops>=0.1,<0.3.
    """
    for name in ("ops", "graph", "runtime"):
        proc = run(repo, "release.py", name, "current", "--date", "2026-12-03")
        assert proc.returncode == 0, proc.stderr
    commit_all(repo, "first releases")
    edit(repo, "packages/ops/src/opstrata/ops/__init__.py", "VALUE = 1", "VALUE = 2")
    release(repo, "ops", "minor", "VALUE is 2 (breaking).")
    edit(repo, "packages/graph/pyproject.toml", "opstrata-ops>=0.1,<0.2", "opstrata-ops>=0.2,<0.3")
    edit(repo, "packages/runtime/pyproject.toml", "opstrata-ops>=0.1,<0.2", "opstrata-ops>=0.1,<0.3")
    kinds = [line.split("]")[0] for line in run(repo, "lock.py", "sync").stderr.splitlines() if "[" in line]
    assert kinds == ["  - [unreleased-change"] * 2, kinds  # graph and runtime edited since their releases
    release(repo, "graph", "minor", "Needs ops 0.2.")
    return repo


def widen_runtime(repo: Path) -> None:
    """runtime declares graph>=0.1,<0.3 and ops>=0.2,<0.3: graph 0.1.0 (ops<0.2) can never be installed."""
    edit(repo, "packages/runtime/pyproject.toml", "opstrata-graph>=0.1,<0.2", "opstrata-graph>=0.1,<0.3")
    edit(repo, "packages/runtime/pyproject.toml", "opstrata-ops>=0.1,<0.3", "opstrata-ops>=0.2,<0.3")
    run(repo, "lock.py", "sync")


def test_uninstallable_lower_bound_names_package_bound_release_and_fix(history: Path) -> None:
    widen_runtime(history)
    proc = run(history, "lock.py", "check")
    assert proc.returncode == 1
    lines = [line for line in proc.stderr.splitlines() if "[uninstallable-bound]" in line]
    assert len(lines) == 1, proc.stderr
    line = lines[0]
    assert "runtime declares opstrata-graph>=0.1,<0.3 (packages/runtime/pyproject.toml)" in line
    assert "graph 0.1.0 requires opstrata-ops>=0.1,<0.2, but runtime requires opstrata-ops>=0.2,<0.3" in line
    assert "the oldest installable release is graph 0.2.0: declare opstrata-graph>=0.2,<0.3" in line
    assert "`python tools/lock.py tighten`" in line
    assert "Traceback" not in proc.stderr


def test_consistent_ranges_have_no_bound_problem(history: Path) -> None:
    proc = run(history, "lock.py", "check")
    assert "[uninstallable-bound]" not in proc.stderr


def test_tighten_dry_run_then_tighten_rewrites_only_the_bound_and_syncs(history: Path) -> None:
    widen_runtime(history)
    pyproject = history / "packages/runtime/pyproject.toml"
    lock_file = history / "versions.lock"
    before = (pyproject.read_text(), lock_file.read_text())
    proc = run(history, "lock.py", "tighten", "--dry-run")
    assert proc.returncode == 0, proc.stderr
    assert "tighten: runtime: opstrata-graph>=0.1,<0.3 -> opstrata-graph>=0.2,<0.3" in proc.stdout
    assert '-    "opstrata-graph>=0.1,<0.3",\n+    "opstrata-graph>=0.2,<0.3",' in proc.stdout
    assert (pyproject.read_text(), lock_file.read_text()) == before

    proc = run(history, "lock.py", "tighten")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert pyproject.read_text() == before[0].replace("opstrata-graph>=0.1,<0.3", "opstrata-graph>=0.2,<0.3")
    assert "# bumped by tools/release.py" in pyproject.read_text()  # formatting and comments kept
    lock = lf.read_lock(lock_file)
    assert dict(lock["packages"]["runtime"]["requires"]) == {"graph": ">=0.2,<0.3", "ops": ">=0.2,<0.3"}
    check = run(history, "lock.py", "check")
    assert "[uninstallable-bound]" not in check.stderr and "[stale]" not in check.stderr
    assert "[unreleased-change]" in check.stderr  # runtime's pyproject changed: release it next
    assert run(history, "lock.py", "tighten").stdout.startswith("tighten: every declared lower bound")
    # the release tool's own checks accept the result
    release(history, "runtime", "patch", "Honest lower bound on graph.")
    assert run(history, "lock.py", "check").returncode == 0


def test_matrix_rows_resolve_the_other_lowers_consistently(history: Path) -> None:
    widen_runtime(history)
    run(history, "lock.py", "tighten")
    lock = lf.read_lock(history / "versions.lock")
    rows = lf.compat_matrix(lock, history)
    assert ("runtime", "graph", "0.1.0") not in rows
    assert rows == [
        ("graph", "ops", "0.2.0"),
        ("runtime", "graph", "0.2.0"),
        ("runtime", "ops", "0.2.0"),
    ]
    universe = ranges.Universe.from_lock(history, lock)
    chosen = universe.resolve_row("runtime", "ops", "0.2.0")
    assert {n: c.label() for n, c in chosen.items()} == {
        "graph": "graph 0.2.0 (working tree)",
        "ops": "ops 0.2.0",
    }
    assert not chosen["ops"].current  # the released tree is what the session installs


def test_matrix_skips_nothing_but_resolves_old_rows_with_old_lowers(history: Path) -> None:
    # runtime admits graph 0.1 and 0.2 and ops 0.1 and 0.2: the graph 0.1.0 row needs ops 0.1.0 with it
    edit(history, "packages/runtime/pyproject.toml", "opstrata-graph>=0.1,<0.2", "opstrata-graph>=0.1,<0.3")
    run(history, "lock.py", "sync")
    assert "[uninstallable-bound]" not in run(history, "lock.py", "check").stderr
    universe = ranges.Universe.from_lock(history, lf.read_lock(history / "versions.lock"))
    assert ("runtime", "graph", "0.1.0") in universe.matrix()
    chosen = universe.resolve_row("runtime", "graph", "0.1.0")
    assert {n: c.label() for n, c in chosen.items()} == {"graph": "graph 0.1.0", "ops": "ops 0.1.0"}


def test_no_installable_release_says_so_and_tighten_leaves_it(history: Path) -> None:
    # graph 0.2.0 needs ops 0.2; a range admitting only graph 0.1.0 beside ops>=0.2 is hopeless
    edit(history, "packages/runtime/pyproject.toml", "opstrata-ops>=0.1,<0.3", "opstrata-ops>=0.2,<0.3")
    run(history, "lock.py", "sync")
    err = run(history, "lock.py", "check").stderr
    assert "[uninstallable-bound] runtime declares opstrata-graph>=0.1,<0.2" in err
    assert "no release of graph that the range admits can be installed" in err
    proc = run(history, "lock.py", "tighten")
    assert proc.returncode == 1 and "[uninstallable-bound]" in proc.stderr


@pytest.mark.parametrize(
    ("spec", "version", "expected"),
    [
        (">=0.1,<0.5", "0.4.0", ">=0.4,<0.5"),
        (">=0.1,<0.3", "0.1.3", ">=0.1.3,<0.3"),
        ("<0.3", "0.2.0", ">=0.2,<0.3"),
        (">0.1,<0.3", "0.2.1", ">=0.2.1,<0.3"),
    ],
)
def test_raise_lower_bound(spec: str, version: str, expected: str) -> None:
    assert ranges.raise_lower_bound(spec, version) == expected


def test_set_requirement_keeps_extras_markers_and_comments(tmp_path: Path) -> None:
    text = (
        '[project]\nname = "x"\ndependencies = [\n    "numpy>=1.24",\n'
        '    "opstrata-graph[onnx]>=0.1,<0.4",  # the main input\n'
        "    \"opstrata-ops>=0.1,<0.4; python_version >= '3.10'\",\n]\n"
    )
    out = ranges.set_requirement(text, tmp_path / "pyproject.toml", "graph", ">=0.3,<0.4")
    out = ranges.set_requirement(out, tmp_path / "pyproject.toml", "ops", ">=0.3.1,<0.4")
    assert out == text.replace("[onnx]>=0.1,<0.4", "[onnx]>=0.3,<0.4").replace(
        "opstrata-ops>=0.1,<0.4;", "opstrata-ops>=0.3.1,<0.4;"
    )
    with pytest.raises(lf.LockError, match="no opstrata-runtime dependency"):
        ranges.set_requirement(text, tmp_path / "pyproject.toml", "runtime", ">=0.1")
