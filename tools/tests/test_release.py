"""tools/release.py: first release with `current`, bumps touch only their package, refusals, dry run, tag."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import lockfile as lf
import pytest
from conftest import commit_all, git, run
from lockfile import LockError
from release import bump


def _snapshot(root: Path) -> dict[str, bytes]:
    """Every non-git file's bytes, keyed by repo-relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts and "__pycache__" not in p.parts
    }


def _lock_sections(text: str) -> dict[str, str]:
    """versions.lock split into chunks keyed by table header ('' = the preamble)."""
    parts = re.split(r"^(\[.*\])$", text, flags=re.MULTILINE)
    return {"": parts[0], **{parts[i]: parts[i + 1] for i in range(1, len(parts), 2)}}


@pytest.mark.parametrize(
    ("version", "part", "expected"),
    [
        ("0.1.0", "patch", "0.1.1"),
        ("0.1.9", "minor", "0.2.0"),
        ("0.4.2", "major", "1.0.0"),
        ("1.2", "patch", "1.2.1"),
        ("0.3.0", "current", "0.3.0"),
    ],
)
def test_bump(version: str, part: str, expected: str) -> None:
    assert bump(version, part) == expected


def test_bump_refuses_prereleases() -> None:
    with pytest.raises(LockError, match=r"plain X\.Y\.Z"):
        bump("0.2.0rc1", "patch")


def test_first_release_with_current(repo: Path) -> None:
    proc = run(repo, "release.py", "ops", "current", "--date", "2026-12-03")
    assert proc.returncode == 0, proc.stderr
    assert "released ops 0.1.0 -> 0.1.0" in proc.stdout and "git commit" in proc.stdout
    lock = lf.read_lock(repo / "versions.lock")
    entry = lock["packages"]["ops"]["releases"]["0.1.0"]
    assert entry["date"] == "2026-12-03"
    assert entry["tree"] == lf.tree_of(repo, "packages/ops")  # the working tree after the edits
    changelog = (repo / "packages/ops/CHANGELOG.md").read_text()
    assert changelog.endswith(
        "Intro text.\n\n## Unreleased\n\n## 0.1.0 — 2026-12-03\n\n### Added\n- First cut of ops.\n"
    )
    assert run(repo, "lock.py", "check").returncode == 0
    commit_all(repo)
    assert (
        lf.tree_of(repo, "packages/ops", ref="HEAD") == entry["tree"]
    )  # what gets committed is what was recorded


def test_current_refuses_an_already_released_version(released: Path) -> None:
    proc = run(released, "release.py", "ops", "current")
    assert proc.returncode == 2 and "opstrata-ops 0.1.0 is already released" in proc.stderr


def test_patch_release_touches_only_its_package(released: Path) -> None:
    changelog = released / "packages/ops/CHANGELOG.md"
    changelog.write_text(
        changelog.read_text().replace("## Unreleased\n", "## Unreleased\n\n### Fixed\n- A bug.\n")
    )
    commit_all(released)
    before, lock_before = _snapshot(released), _lock_sections((released / "versions.lock").read_text())

    proc = run(released, "release.py", "ops", "patch", "--date", "2026-12-04")
    assert proc.returncode == 0, proc.stderr
    after, lock_after = _snapshot(released), _lock_sections((released / "versions.lock").read_text())
    changed = {k for k in before.keys() | after.keys() if before.get(k) != after.get(k)}
    assert changed == {"packages/ops/pyproject.toml", "packages/ops/CHANGELOG.md", "versions.lock"}
    old_py, new_py = (
        before["packages/ops/pyproject.toml"].decode(),
        after["packages/ops/pyproject.toml"].decode(),
    )
    assert new_py == old_py.replace(
        'version = "0.1.0"  #', 'version = "0.1.1"  #'
    )  # formatting and comment kept
    for header in ("", "[packages.graph]", "[packages.runtime]", '[packages.ops.releases."0.1.0"]'):
        assert lock_after[header] == lock_before[header], header  # other entries byte-identical
    assert '[packages.ops.releases."0.1.1"]' in lock_after
    assert (
        "## Unreleased\n\n## 0.1.1 — 2026-12-04\n\n### Fixed\n- A bug.\n\n## 0.1.0 — 2026-12-03"
        in after["packages/ops/CHANGELOG.md"].decode()
    )
    assert run(released, "lock.py", "check").returncode == 0


def test_empty_unreleased_section_is_refused_and_nothing_is_written(released: Path) -> None:
    before = _snapshot(released)
    proc = run(released, "release.py", "ops", "patch")
    assert proc.returncode == 2
    assert "packages/ops/CHANGELOG.md: the '## Unreleased' section is empty" in proc.stderr
    assert _snapshot(released) == before


def test_dry_run_prints_the_diff_and_writes_nothing(repo: Path) -> None:
    before = _snapshot(repo)
    proc = run(repo, "release.py", "graph", "minor", "--dry-run", "--date", "2026-12-03")
    assert proc.returncode == 0, proc.stderr
    assert "dry run, nothing written: release graph 0.1.0 -> 0.2.0" in proc.stdout
    assert '+version = "0.2.0"  # bumped by tools/release.py' in proc.stdout
    assert '+[packages.graph.releases."0.2.0"]' in proc.stdout and "+## 0.2.0 — 2026-12-03" in proc.stdout
    assert _snapshot(repo) == before


def test_release_refuses_while_check_has_other_problems(repo: Path) -> None:
    path = repo / "packages/runtime/pyproject.toml"
    path.write_text(path.read_text().replace('version = "0.1.0"', 'version = "0.3.0"'))
    before = _snapshot(repo)
    proc = run(repo, "release.py", "ops", "current")
    assert proc.returncode == 2 and "fix these `lock.py check` problems before releasing" in proc.stderr
    assert "version 0.3.0" in proc.stderr
    assert _snapshot(repo) == before


def test_minor_release_warns_about_dependents_whose_range_excludes_it(released: Path) -> None:
    changelog = released / "packages/ops/CHANGELOG.md"
    changelog.write_text(
        changelog.read_text().replace("## Unreleased\n", "## Unreleased\n\n### Changed\n- API.\n")
    )
    proc = run(released, "release.py", "ops", "minor")
    assert proc.returncode == 0, proc.stderr
    assert "warning: graph requires opstrata-ops>=0.1,<0.2, which excludes 0.2.0" in proc.stderr
    assert "[range]" in run(released, "lock.py", "check").stderr


def test_tag_only_after_the_release_is_committed(repo: Path) -> None:
    proc = run(repo, "release.py", "ops", "current", "--tag")
    assert proc.returncode == 0 and "python tools/release.py ops tag" in proc.stdout
    assert git(repo, "tag", "--list") == ""  # --tag never tags uncommitted content
    proc = run(repo, "release.py", "ops", "tag")
    assert proc.returncode == 2 and "commit packages/ops and versions.lock first" in proc.stderr
    commit_all(repo)
    proc = run(repo, "release.py", "ops", "tag")
    assert proc.returncode == 0, proc.stderr
    assert git(repo, "tag", "--list") == "ops-v0.1.0"
    assert git(repo, "rev-parse", "ops-v0.1.0^{commit}") == git(repo, "rev-parse", "HEAD")
    assert "already exists" in run(repo, "release.py", "ops", "tag").stderr


def test_unknown_package_and_bad_date(repo: Path) -> None:
    assert "unknown package 'nope'" in run(repo, "release.py", "nope", "patch").stderr
    assert (
        "--date: expected YYYY-MM-DD"
        in run(repo, "release.py", "ops", "current", "--date", "3.12.2026").stderr
    )


@pytest.mark.skipif(
    shutil.which("ruff") is None, reason="ruff is not on PATH (nox's tools session installs it)"
)
def test_an_unformatted_package_is_refused_where_the_repo_configures_ruff(repo: Path) -> None:
    """The recorded tree must be the one the commit holds: a formatter run after the release would change
    the files, so release.py (one package or a batch) refuses until `ruff format` has nothing to do."""
    (repo / "pyproject.toml").write_text("[tool.ruff]\nline-length = 100\n")
    module = repo / "packages/ops/src/opstrata/ops/__init__.py"
    module.write_text('"""fake opstrata.ops."""\n\nVALUE=1\n')
    commit_all(repo, "configure ruff; an unformatted module")
    before = _snapshot(repo)
    for args in (("ops", "current"), ("batch", "ops:current")):
        proc = run(repo, "release.py", *args, "--date", "2026-12-03")
        assert proc.returncode == 2, proc.stdout
        assert "packages/ops is not as `ruff format` leaves it" in proc.stderr
        assert (
            "src/opstrata/ops/__init__.py" in proc.stderr and "run `ruff format packages/ops`" in proc.stderr
        )
        assert _snapshot(repo) == before  # nothing written
    subprocess.run(["ruff", "format", "-q", "--no-cache", "packages/ops"], cwd=repo, check=True)
    proc = run(repo, "release.py", "ops", "current", "--date", "2026-12-03")
    assert proc.returncode == 0, proc.stderr
