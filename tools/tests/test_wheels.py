"""tools/wheels.py and tools/build.py: build packages, rebuild a release from its tree, install one layer."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import lockfile as lf
import pytest
import wheels
from conftest import REAL_ROOT, run
from lockfile import LockError


def test_build_release_rebuilds_the_recorded_tree_not_the_working_tree(
    released: Path, tmp_path: Path
) -> None:
    init = released / "packages/ops/src/opstrata/ops/__init__.py"
    init.write_text(init.read_text().replace("VALUE = 1", "VALUE = 2"))  # later, unreleased edit
    wheel = wheels.build_release(released, "ops", "0.1.0", tmp_path / "out")
    assert wheel.name == "opstrata_ops-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        assert "VALUE = 1" in zf.read("opstrata/ops/__init__.py").decode()


def test_build_release_of_an_unreleased_version_says_what_is_released(released: Path, tmp_path: Path) -> None:
    with pytest.raises(LockError, match=r"released: 0\.1\.0"):
        wheels.build_release(released, "ops", "0.2.0", tmp_path)


def test_build_tree_of_the_real_ops_package(tmp_path: Path) -> None:
    tree = lf.tree_of(REAL_ROOT, "packages/ops")
    (built,) = wheels.build_tree(REAL_ROOT, tree, tmp_path)
    assert built.name.startswith("opstrata_ops-") and built.suffix == ".whl"


def test_build_cli_and_installing_one_layer_pulls_only_lower_layers(repo: Path, tmp_path: Path) -> None:
    proc = run(repo, "build.py")
    assert proc.returncode == 0, proc.stderr
    dist = sorted(p.name for p in (repo / "dist").iterdir())
    assert dist == sorted(
        f"opstrata_{n}-0.1.0{s}"
        for n in ("ops", "graph", "runtime")
        for s in ("-py3-none-any.whl", ".tar.gz")
    )
    venv = tmp_path / "venv"
    subprocess.run(["uv", "venv", "-q", "--python", sys.executable, str(venv)], check=True)
    py = str(venv / "bin" / "python")
    subprocess.run(
        [
            "uv",
            "pip",
            "install",
            "-q",
            "--python",
            py,
            "--no-index",
            "--find-links",
            str(repo / "dist"),
            "opstrata-graph",
        ],
        check=True,
    )
    listed = subprocess.run(
        ["uv", "pip", "list", "--python", py], capture_output=True, text=True, check=True
    ).stdout
    assert "opstrata-graph" in listed and "opstrata-ops" in listed and "opstrata-runtime" not in listed


def test_build_cli_release_option_and_errors(released: Path) -> None:
    proc = run(released, "build.py", "--release", "ops==0.1.0", "--out", "rel")
    assert proc.returncode == 0, proc.stderr
    assert (released / "rel" / "opstrata_ops-0.1.0-py3-none-any.whl").exists()
    assert "expected NAME==VERSION" in run(released, "build.py", "--release", "ops").stderr
    assert "unknown package(s) nope" in run(released, "build.py", "nope").stderr
