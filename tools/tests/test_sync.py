"""tools/lock.py sync: rewrites values from the pyprojects and keeps comments, key order and releases."""

from __future__ import annotations

from pathlib import Path

import lockfile as lf
from conftest import run


def test_fresh_lock_has_the_documented_format(repo: Path) -> None:
    text = (repo / "versions.lock").read_text()
    assert text.startswith(
        "# versions.lock — written by tools/lock.py and tools/release.py; never edit by hand.\n"
    )
    assert 'schema = 1\nlayers = ["ops", "graph", "runtime"]\n\n[packages.ops]\n' in text
    assert (
        '[packages.runtime]\ndistribution = "opstrata-runtime"\npath = "packages/runtime"\nversion = "0.1.0"\n'
        'requires = { graph = ">=0.1,<0.2", ops = ">=0.1,<0.2" }\n'
        'tested-with = { graph = "0.1.0", ops = "0.1.0" }\n'
    ) in text


def test_sync_keeps_comments_and_key_order_and_updates_values(released: Path) -> None:
    path = released / "versions.lock"
    text = path.read_text()
    text = text.replace("schema = 1\n", "# a maintainer's note survives\nschema = 1\n")
    text = text.replace(
        'requires = { ops = ">=0.1,<0.2" }',
        'requires = { ops = ">=0.1,<0.2" }   # why: graph uses ops.registry',
    )
    # unusual key order inside graph's table: version before distribution
    text = text.replace(
        '[packages.graph]\ndistribution = "opstrata-graph"\npath = "packages/graph"\nversion = "0.1.0"\n',
        '[packages.graph]\nversion = "0.1.0"\ndistribution = "opstrata-graph"\npath = "packages/graph"\n',
    )
    text = text.replace("[packages.runtime]", "# runtime sits on graph\n[packages.runtime]")
    path.write_text(text)
    pyproject = released / "packages/graph/pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace("opstrata-ops>=0.1,<0.2", "opstrata-ops>=0.1,<0.3"))

    proc = run(released, "lock.py", "sync")
    assert proc.returncode == 0, proc.stderr
    new = path.read_text()
    assert new == text.replace(
        'requires = { ops = ">=0.1,<0.2" }   # why',
        'requires = { ops = ">=0.1,<0.3" }   # why',  # value changed, comment kept at its column
    )
    assert '[packages.ops.releases."0.1.0"]' in new  # releases are kept


def test_sync_is_idempotent(repo: Path) -> None:
    before = (repo / "versions.lock").read_bytes()
    assert run(repo, "lock.py", "sync").returncode == 0
    assert (repo / "versions.lock").read_bytes() == before


def test_sync_repairs_fields_it_owns(repo: Path) -> None:
    path = repo / "versions.lock"
    path.write_text(path.read_text().replace('version = "0.1.0"', "version = 7", 1))
    assert run(repo, "lock.py", "sync").returncode == 0
    assert lf.read_lock(path)["packages"]["ops"]["version"] == "0.1.0"


def test_sync_creates_the_lock_from_scratch(repo: Path) -> None:
    before = (repo / "versions.lock").read_text()
    (repo / "versions.lock").unlink()
    assert run(repo, "lock.py", "sync").returncode == 0
    assert (repo / "versions.lock").read_text() == before
