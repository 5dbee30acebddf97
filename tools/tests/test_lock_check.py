"""tools/lock.py check: each failure mode fires with a clear message; a consistent repo passes."""

from __future__ import annotations

from pathlib import Path

import lock
from conftest import commit_all, git, run


def _edit(repo: Path, rel: str, old: str, new: str) -> None:
    path = repo / rel
    text = path.read_text()
    assert old in text, f"{old!r} not in {rel}"
    path.write_text(text.replace(old, new, 1))


def _check(repo: Path) -> str:
    proc = run(repo, "lock.py", "check")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_consistent_repo_passes_with_one_line_summary(repo: Path) -> None:
    proc = run(repo, "lock.py", "check")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.count("\n") == 1 and proc.stdout.startswith("versions.lock OK: 3 packages (ops 0.1.0")


def test_pyproject_version_differs_from_lock(repo: Path) -> None:
    _edit(repo, "packages/graph/pyproject.toml", 'version = "0.1.0"', 'version = "0.1.5"')
    err = _check(repo)
    assert "[version]" in err and "version 0.1.5" in err and "packages.graph.version = 0.1.0" in err
    assert "release.py graph patch|minor|major" in err


def test_declared_range_excludes_locked_lower_version(repo: Path) -> None:
    _edit(repo, "packages/graph/pyproject.toml", "opstrata-ops>=0.1,<0.2", "opstrata-ops>=0.2,<0.3")
    assert run(repo, "lock.py", "sync").returncode == 1  # sync records it, then reports the problem
    err = _check(repo)
    assert (
        "[range]" in err
        and "graph requires opstrata-ops>=0.2,<0.3" in err
        and "locked ops version is 0.1.0" in err
    )
    assert "[stale]" not in err  # after sync only the real problem remains


def test_changed_tree_without_version_bump(released: Path) -> None:
    assert run(released, "lock.py", "check").returncode == 0
    _edit(released, "packages/ops/src/opstrata/ops/__init__.py", "VALUE = 1", "VALUE = 2")
    err = _check(released)
    assert "[unreleased-change]" in err and "packages/ops" in err and "opstrata-ops 0.1.0" in err
    assert "changed: packages/ops/src/opstrata/ops/__init__.py" in err
    assert "python tools/release.py ops patch|minor|major" in err
    # the committed state is still consistent: --ref compares trees at a git ref instead
    assert run(released, "lock.py", "check", "--ref", "HEAD").returncode == 0


def test_untracked_file_in_released_package_counts_but_ignored_does_not(released: Path) -> None:
    (released / "packages/ops/scratch.log").write_text("ignored by .gitignore\n")
    assert run(released, "lock.py", "check").returncode == 0
    (released / "packages/ops/NEW.md").write_text("new file\n")
    assert "changed: packages/ops/NEW.md" in _check(released)


def test_unreleased_package_may_change_freely(released: Path) -> None:
    _edit(released, "packages/graph/src/opstrata/graph/__init__.py", "VALUE = 1", "VALUE = 2")
    assert run(released, "lock.py", "check").returncode == 0


def test_upward_dependency_and_the_cycle_it_forms(repo: Path) -> None:
    _edit(
        repo,
        "packages/ops/pyproject.toml",
        "dependencies = [\n",
        'dependencies = [\n    "opstrata-graph>=0.1",\n',
    )
    assert run(repo, "lock.py", "sync").returncode == 1
    err = _check(repo)
    assert "[layering] ops depends upward on graph" in err and "ops < graph < runtime" in err
    assert "[cycle] dependency cycle" in err and (
        "ops -> graph -> ops" in err or "graph -> ops -> graph" in err
    )


def test_sideways_dependency_on_itself(repo: Path) -> None:
    _edit(
        repo,
        "packages/graph/pyproject.toml",
        "dependencies = [\n",
        'dependencies = [\n    "opstrata-graph",\n',
    )
    err = _check(repo)
    assert "[layering] graph depends on itself" in err


def test_dependency_on_unknown_opstrata_package(repo: Path) -> None:
    _edit(
        repo,
        "packages/graph/pyproject.toml",
        "dependencies = [\n",
        'dependencies = [\n    "opstrata-nope>=1",\n',
    )
    assert "graph depends on opstrata-nope, which is not a package" in _check(repo)


def test_stale_lock_requires(repo: Path) -> None:
    _edit(repo, "packages/runtime/pyproject.toml", '    "opstrata-graph>=0.1,<0.2",\n', "")
    err = _check(repo)
    assert "[stale]" in err and "run `python tools/lock.py sync`" in err


def test_package_directory_missing_from_the_lock(repo: Path) -> None:
    (repo / "packages/extra").mkdir()
    (repo / "packages/extra/pyproject.toml").write_text(
        '[project]\nname = "opstrata-extra"\nversion = "0.1.0"\n'
    )
    err = _check(repo)
    assert "[not-in-lock] packages/extra" in err and "--layers ops,graph,runtime,extra" in err


def test_every_problem_is_listed_at_once(released: Path) -> None:
    _edit(released, "packages/ops/README.md", "# opstrata-ops", "# changed")
    _edit(released, "packages/runtime/pyproject.toml", 'version = "0.1.0"', 'version = "0.2.0"')
    problems = lock.check(released)
    assert sorted(p.kind for p in problems) == ["unreleased-change", "version"]
    assert {p.package for p in problems} == {"ops", "runtime"}
    err = _check(released)
    assert "2 problem(s)" in err


def test_missing_lock_says_how_to_create_it(repo: Path) -> None:
    (repo / "versions.lock").unlink()
    commit_all(repo)
    err = _check(repo)
    assert "versions.lock: not found; create it with `python tools/lock.py sync`" in err


def _release_then_edit_then_commit(released: Path) -> None:
    """The failure that stopped CI once: ops 0.1.1 released, then edited (a formatter run) before the commit."""
    changelog = released / "packages/ops/CHANGELOG.md"
    changelog.write_text(
        changelog.read_text().replace("## Unreleased\n", "## Unreleased\n\n### Fixed\n- A bug.\n")
    )
    _edit(released, "packages/ops/src/opstrata/ops/__init__.py", "VALUE = 1", "VALUE = 2")
    assert run(released, "release.py", "ops", "patch", "--date", "2026-12-04").returncode == 0
    _edit(released, "packages/ops/src/opstrata/ops/__init__.py", "VALUE = 2", "VALUE  =  2")
    commit_all(released, "ops 0.1.1 (formatted after the release)")


def test_release_tree_no_commit_holds_is_reported(released: Path) -> None:
    _release_then_edit_then_commit(released)
    proc = run(released, "lock.py", "check", "--ref", "HEAD")
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "[uncommitted-release] opstrata-ops 0.1.1's recorded tree" in proc.stderr
    assert "a fresh clone cannot rebuild it" in proc.stderr
    assert "python tools/lock.py relink ops 0.1.1" in proc.stderr
    assert "opstrata-ops 0.1.0" not in proc.stderr.split("[uncommitted-release]")[1]  # 0.1.0 is committed


def test_relink_records_the_committed_tree_of_that_version(released: Path) -> None:
    _release_then_edit_then_commit(released)
    proc = run(released, "lock.py", "relink", "ops", "0.1.1")
    assert proc.returncode == 0, proc.stderr
    assert (
        "relinked ops 0.1.1" in proc.stdout
        and "changed: packages/ops/src/opstrata/ops/__init__.py" in proc.stdout
    )
    head_tree = git(released, "rev-parse", "HEAD:packages/ops")
    assert f'tree = "{head_tree}"' in (released / "versions.lock").read_text()
    commit_all(released, "relink")
    assert run(released, "lock.py", "check", "--ref", "HEAD").returncode == 0
    again = run(released, "lock.py", "relink", "ops", "0.1.1")  # committed now: history is not rewritten
    assert again.returncode == 2 and "is committed; nothing to relink" in again.stderr


def test_relink_refuses_unknown_packages_versions_and_uncommitted_releases(released: Path) -> None:
    assert "no package 'nope'" in run(released, "lock.py", "relink", "nope", "0.1.0").stderr
    assert "expected a recorded release" in run(released, "lock.py", "relink", "ops", "9.9.9").stderr
    assert "relink needs PACKAGE VERSION" in run(released, "lock.py", "relink", "ops").stderr
    changelog = released / "packages/ops/CHANGELOG.md"
    changelog.write_text(
        changelog.read_text().replace("## Unreleased\n", "## Unreleased\n\n### Fixed\n- A bug.\n")
    )
    assert run(released, "release.py", "ops", "patch", "--date", "2026-12-04").returncode == 0
    proc = run(released, "lock.py", "relink", "ops", "0.1.1")  # released, never committed
    assert proc.returncode == 2 and "no commit of HEAD declares opstrata-ops 0.1.1" in proc.stderr
    assert "commit the release first" in proc.stderr


def test_a_release_stacked_on_an_uncommitted_one_is_refused(released: Path) -> None:
    changelog = released / "packages/ops/CHANGELOG.md"
    for n in (1, 2):
        changelog.write_text(
            changelog.read_text().replace("## Unreleased\n", f"## Unreleased\n\n### Fixed\n- Bug {n}.\n")
        )
        _edit(released, "packages/ops/src/opstrata/ops/__init__.py", f"VALUE = {n}", f"VALUE = {n + 1}")
        proc = run(released, "release.py", "ops", "patch", "--date", "2026-12-04")
    assert proc.returncode == 2, proc.stdout  # 0.1.2 would leave 0.1.1's tree in no commit
    assert "opstrata-ops 0.1.1 is released but not committed" in proc.stderr
    assert "git add packages/ops versions.lock && git commit" in proc.stderr
    commit_all(released, "ops 0.1.1, with the edit made after its release")
    assert run(released, "lock.py", "relink", "ops", "0.1.1").returncode == 0
    commit_all(released, "relink ops 0.1.1")
    assert run(released, "release.py", "ops", "patch", "--date", "2026-12-04").returncode == 0
