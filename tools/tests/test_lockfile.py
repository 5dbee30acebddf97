"""tools/lockfile.py: lock validation errors, pyproject errors, tree hashes, compat matrix, atomic writes."""

from __future__ import annotations

import re
from pathlib import Path

import lockfile as lf
import pytest
import tomlkit
from conftest import git, run
from lockfile import LockError

LOCK_WITH_RELEASES = """\
schema = 1
layers = ["ops", "graph", "runtime"]

[packages.ops]
distribution = "opstrata-ops"
path = "packages/ops"
version = "0.3.0"
requires = {}
tested-with = {}

[packages.ops.releases."0.2.0"]
tree = "2222222222222222222222222222222222222222"
date = "2026-02-01"

[packages.ops.releases."0.1.0"]
tree = "1111111111111111111111111111111111111111"
date = "2026-01-01"

[packages.ops.releases."0.1.1"]
tree = "1111111111111111111111111111111111111112"
date = "2026-01-15"

[packages.ops.releases."0.3.0"]
tree = "3333333333333333333333333333333333333333"
date = "2026-03-01"

[packages.graph]
distribution = "opstrata-graph"
path = "packages/graph"
version = "0.1.0"
requires = { ops = ">=0.1.1,<0.3" }
tested-with = { ops = "0.3.0" }

[packages.graph.releases."0.1.0"]
tree = "4444444444444444444444444444444444444444"
date = "2026-03-02"

[packages.runtime]
distribution = "opstrata-runtime"
path = "packages/runtime"
version = "0.1.0"
requires = { graph = ">=0.1,<0.2", ops = ">=0.3" }
tested-with = { graph = "0.1.0", ops = "0.3.0" }
"""


def test_compat_matrix_picks_oldest_and_newest_admitted_release() -> None:
    lock = tomlkit.parse(LOCK_WITH_RELEASES)
    assert lf.compat_matrix(lock) == [
        ("graph", "ops", "0.1.1"),  # 0.1.0 is below the range; versions sort by PEP 440, not file order
        ("graph", "ops", "0.2.0"),  # 0.3.0 is above it
        ("runtime", "graph", "0.1.0"),  # one admitted release appears once
        ("runtime", "ops", "0.3.0"),
    ]


def test_compat_matrix_empty_when_nothing_released(repo: Path) -> None:
    assert lf.compat_matrix(lf.read_lock(repo / "versions.lock")) == []


def test_release_tree_and_missing_release_message() -> None:
    lock = tomlkit.parse(LOCK_WITH_RELEASES)
    assert lf.release_tree(lock, "ops", "0.2.0") == "2" * 40
    assert lf.released_versions(lock, "ops") == ["0.1.0", "0.1.1", "0.2.0", "0.3.0"]
    with pytest.raises(LockError, match=r'packages\.ops\.releases\."9\.9\.9".*released: 0\.1\.0, 0\.1\.1'):
        lf.release_tree(lock, "ops", "9.9.9")


def _mutate(repo: Path, old: str, new: str) -> None:
    path = repo / "versions.lock"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))


RELEASE = '\n[packages.ops.releases."0.1.0"]\ntree = "{tree}"\ndate = "{date}"\n'


@pytest.mark.parametrize(
    ("old", "new", "key", "expected"),
    [
        ("schema = 1", "schema = 2", "'schema'", "the integer 1"),
        ('layers = ["ops", "graph", "runtime"]', 'layers = "ops"', "'layers'", "non-empty array"),
        ('version = "0.1.0"\n', "", "'packages.ops.version'", "key missing"),
        ('version = "0.1.0"\n', "version = 1\n", "'packages.ops.version'", "1 (integer)"),
        ('requires = { ops = ">=0.1,<0.2" }', 'requires = "ops"', "'packages.graph.requires'", "a table"),
        (
            'requires = { ops = ">=0.1,<0.2" }',
            'requires = { ops = "~~0.1" }',
            "'packages.graph.requires.ops'",
            "specifier",
        ),
        ("[packages.runtime]", "[packages.nope]", "'packages.runtime'", "layers lists"),
        (
            "tested-with = {}\n",
            "tested-with = {}\n" + RELEASE.format(tree="abc", date="2026-12-03"),
            "tree",
            "40-hex",
        ),
        (
            "tested-with = {}\n",
            "tested-with = {}\n" + RELEASE.format(tree="a" * 40, date="2026-13-45"),
            "date",
            "YYYY-MM-DD",
        ),
    ],
)
def test_malformed_lock_names_file_key_expected_found(
    repo: Path, old: str, new: str, key: str, expected: str
) -> None:
    _mutate(repo, old, new)
    with pytest.raises(LockError) as info:
        lf.read_lock(repo / "versions.lock")
    assert "versions.lock" in str(info.value) and key in str(info.value) and expected in str(info.value)
    proc = run(repo, "lock.py", "check")
    assert proc.returncode == 1
    assert "[malformed]" in proc.stderr and key in proc.stderr and "Traceback" not in proc.stderr


def test_lock_syntax_error_reports_line_and_column_not_a_traceback(repo: Path) -> None:
    _mutate(repo, "schema = 1", "schema = = 1")
    with pytest.raises(
        LockError, match=r"versions\.lock: not valid TOML at line 5, column 10: Unexpected character"
    ):
        lf.read_lock(repo / "versions.lock")
    proc = run(repo, "lock.py", "check")
    assert proc.returncode == 1 and "line 5" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        (
            'version = "0.1.0"',
            'version = "0.1.0',
            r"packages/graph/pyproject\.toml: not valid TOML at line 7",
        ),
        (
            'version = "0.1.0"  # bumped by tools/release.py\n',
            "",
            r"'project\.version': expected a PEP 440 version",
        ),
        ('version = "0.1.0"', 'version = "banana"', r"'project\.version'.*found 'banana'"),
        (
            '"opstrata-ops>=0.1,<0.2",',
            '"opstrata-ops>=>0.1",',
            r"'project\.dependencies\[0\]': expected a PEP 508",
        ),
        ("dependencies = [", "dependencies = 3\nx = [", r"'project\.dependencies': expected an array"),
        ("[project]", "[projekt]", r"key 'project': expected a \[project\] table, found nothing"),
    ],
)
def test_malformed_pyproject_names_file_and_key(repo: Path, old: str, new: str, message: str) -> None:
    path = repo / "packages" / "graph" / "pyproject.toml"
    path.write_text(path.read_text().replace(old, new, 1))
    with pytest.raises(LockError, match=message):
        lf.read_pyproject(path)
    proc = run(repo, "lock.py", "check")
    assert proc.returncode == 1 and re.search(message, proc.stderr) and "Traceback" not in proc.stderr


def test_read_pyproject_keeps_the_authors_specifier_spelling(repo: Path) -> None:
    pp = lf.read_pyproject(repo / "packages" / "runtime" / "pyproject.toml")
    assert (pp.name, pp.version) == ("opstrata-runtime", "0.1.0")
    assert pp.requires == {"graph": ">=0.1,<0.2", "ops": ">=0.1,<0.2"}  # not packaging's sorted "<0.2,>=0.1"


def test_tree_of_working_tree_counts_edits_and_untracked_files_but_not_ignored(repo: Path) -> None:
    head = lf.tree_of(repo, "packages/ops", ref="HEAD")
    assert lf.tree_of(repo, "packages/ops") == head  # clean checkout: working tree == HEAD
    index_before = git(repo, "ls-files", "--stage")
    (repo / "packages/ops/debug.log").write_text("ignored\n")
    assert lf.tree_of(repo, "packages/ops") == head
    (repo / "packages/ops/new_file.txt").write_text("untracked counts\n")
    with_new = lf.tree_of(repo, "packages/ops")
    assert with_new != head
    assert "new_file.txt" in git(repo, "ls-tree", "--name-only", with_new)  # objects were written
    assert git(repo, "ls-files", "--stage") == index_before  # the real index is untouched


def test_tree_of_overrides_predicts_the_tree_after_an_edit(repo: Path) -> None:
    rel = "packages/ops/README.md"
    predicted = lf.tree_of(repo, "packages/ops", overrides={rel: b"new readme\n"})
    (repo / rel).write_text("new readme\n")
    assert lf.tree_of(repo, "packages/ops") == predicted


def test_tree_of_errors_name_the_path(repo: Path) -> None:
    with pytest.raises(LockError, match="packages/nope"):
        lf.tree_of(repo, "packages/nope")
    with pytest.raises(LockError, match=r"packages/nope.*HEAD"):
        lf.tree_of(repo, "packages/nope", ref="HEAD")


def test_write_lock_is_atomic_and_refuses_invalid_documents(repo: Path) -> None:
    path = repo / "versions.lock"
    before = path.read_text()
    doc = lf.read_lock(path)
    doc["packages"]["ops"]["version"] = "0.1.1"
    lf.write_lock(doc, path)
    assert 'version = "0.1.1"' in path.read_text()
    doc["packages"]["ops"]["version"] = "not a version"
    with pytest.raises(LockError, match="refusing to write"):
        lf.write_lock(doc, path)
    assert 'version = "0.1.1"' in path.read_text()  # previous content intact
    assert (
        sorted(p.name for p in repo.iterdir() if p.name.startswith(".versions.lock")) == []
    )  # no temp files
    assert before != path.read_text()
