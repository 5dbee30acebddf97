"""The release drill: in a temporary repository, release a breaking ops minor and follow what the tools say.

`release.py plan`, `lock.py check` and the compat matrix must agree, at every step, on exactly which
upper packages need what — so the documented process (docs/releasing.md) is tested, not only written.
"""

from __future__ import annotations

from pathlib import Path

import lockfile as lf
import ranges
from conftest import commit_all, git, run
from test_ranges import edit, release


def problems(repo: Path) -> list[str]:
    """`lock.py check` problem lines, without the header."""
    return [line[4:] for line in run(repo, "lock.py", "check").stderr.splitlines() if line.startswith("  - ")]


def plan(repo: Path, *args: str) -> str:
    proc = run(repo, "release.py", "plan", *args)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def matrix(repo: Path) -> list[tuple[str, str, str]]:
    return lf.compat_matrix(lf.read_lock(repo / "versions.lock"), repo)


def test_breaking_ops_minor_drill(repo: Path) -> None:
    for name in ("ops", "graph", "runtime"):
        assert run(repo, "release.py", name, "current", "--date", "2026-12-03").returncode == 0
    commit_all(repo, "first releases")
    assert run(repo, "lock.py", "check").returncode == 0

    # 1. before releasing: the plan names both uppers, the widening and the session that proves it
    out = plan(repo, "ops", "--version", "0.2.0")
    assert "release plan: opstrata-ops 0.2.0 — not released yet (working tree has 0.1.0)" in out
    admits, widens = out.split("must widen", 1)
    assert "(none)" in admits
    for upper in ("graph", "runtime"):
        assert (
            f"{upper:<8} opstrata-ops>=0.1,<0.2 excludes 0.2.0: widen to opstrata-ops>=0.1,<0.3 in "
            f"packages/{upper}/pyproject.toml, then `python tools/release.py {upper} patch` once "
            f"nox -s \"compat(package='{upper}', lower='ops', version='0.2.0')\" passes"
        ) in widens
    assert "order: release ops 0.2.0 first" in out and "graph, runtime bottom first" in out
    assert plan(repo, "ops", "--version", "0.1.5").count("admits 0.1.5") == 2  # a patch: nobody changes

    # 2. release the breaking minor: the tool warns, check names exactly the two ranges
    edit(repo, "packages/ops/src/opstrata/ops/__init__.py", "VALUE = 1", "VALUE = 2")
    edit(
        repo, "packages/ops/CHANGELOG.md", "## Unreleased\n", "## Unreleased\n\n### Changed\n- VALUE is 2.\n"
    )
    proc = run(repo, "release.py", "ops", "minor", "--date", "2026-12-04")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.count("warning:") == 2 and "graph requires opstrata-ops>=0.1,<0.2" in proc.stderr
    commit_all(repo, "Release ops 0.2.0")
    found = problems(repo)
    assert [p.split("]")[0] for p in found] == ["[range", "[range"]
    assert found[0].startswith("[range] graph requires opstrata-ops>=0.1,<0.2")
    assert found[1].startswith("[range] runtime requires opstrata-ops>=0.1,<0.2")
    assert all("locked ops version is 0.2.0" in p for p in found)
    # the matrix cannot test 0.2.0 against anyone yet: no range admits it
    assert [row for row in matrix(repo) if row[1] == "ops"] == [
        ("graph", "ops", "0.1.0"),
        ("runtime", "ops", "0.1.0"),
    ]
    assert plan(repo, "ops").startswith("release plan: opstrata-ops 0.2.0 — released; released: 0.1.0, 0.2.0")

    # 3. graph widens as the plan says: graph now admits it, runtime still must widen
    edit(repo, "packages/graph/pyproject.toml", "opstrata-ops>=0.1,<0.2", "opstrata-ops>=0.1,<0.3")
    run(repo, "lock.py", "sync")
    out = plan(repo, "ops")
    admits, widens = out.split("must widen", 1)
    assert "graph    opstrata-ops>=0.1,<0.3" in admits
    assert "nox -s \"compat(package='graph', lower='ops', version='0.2.0')\"" in admits
    assert "runtime  opstrata-ops>=0.1,<0.2 excludes 0.2.0" in widens and "graph " not in widens
    assert [p.split("]")[0] for p in problems(repo)] == ["[range", "[unreleased-change"]
    assert ("graph", "ops", "0.1.0") in matrix(repo) and ("graph", "ops", "0.2.0") in matrix(repo)

    # 4. runtime widens; both re-release (bottom first); everything is consistent again
    edit(repo, "packages/runtime/pyproject.toml", "opstrata-ops>=0.1,<0.2", "opstrata-ops>=0.1,<0.3")
    run(repo, "lock.py", "sync")
    release(repo, "graph", "patch", "Admits ops 0.2.")
    release(repo, "runtime", "patch", "Admits ops 0.2.")
    assert run(repo, "lock.py", "check").returncode == 0
    out = plan(repo, "ops")
    assert (
        out.count("admits 0.2.0") == 2
        and "must widen a range and re-release (bottom first):\n  (none)" in out
    )
    rows = matrix(repo)
    assert rows == [
        ("graph", "ops", "0.1.0"),
        ("graph", "ops", "0.2.0"),
        ("runtime", "graph", "0.1.0"),
        ("runtime", "graph", "0.1.1"),
        ("runtime", "ops", "0.1.0"),
        ("runtime", "ops", "0.2.0"),
    ]
    # each row installs a consistent set: graph 0.1.0 pulls the ops its own range wants
    universe = ranges.Universe.from_lock(repo, lf.read_lock(repo / "versions.lock"))
    labels = {row: {n: c.label() for n, c in universe.resolve_row(*row).items()} for row in rows[2:]}
    assert labels[("runtime", "graph", "0.1.0")] == {"graph": "graph 0.1.0", "ops": "ops 0.1.0"}
    assert labels[("runtime", "ops", "0.2.0")] == {"graph": "graph 0.1.1 (working tree)", "ops": "ops 0.2.0"}

    # 5. the tags the release tool makes, one per released package version
    assert run(repo, "release.py", "runtime", "tag").returncode == 0
    assert git(repo, "tag", "--list") == "runtime-v0.1.1"
    assert git(repo, "cat-file", "-t", "runtime-v0.1.1") == "tag"  # annotated
