"""The import-linter layers contract in the root pyproject.toml: kept by the real tree, broken by an upward import.

Each test copies the six src trees into a tmp dir (one merged `opstrata` namespace), optionally injects
an upward import into a copy of a lower module, and runs `lint-imports` there with a copy of the root
pyproject.toml, exactly as the `layers` nox session runs it on the checkout.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tomlkit

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("ops", "graph", "runtime", "comm", "quant", "eval")  # bottom to top


def _lint_imports() -> str:
    """The lint-imports executable next to this interpreter, else on PATH; fail with the install command."""
    local = Path(sys.executable).parent / "lint-imports"
    found = str(local) if local.exists() else shutil.which("lint-imports")
    if found is None:
        pytest.fail(
            "lint-imports not found: expected import-linter installed; fix: pip install 'import-linter>=2'"
        )
    return found


def _copy_tree(dest: Path) -> Path:
    """Copy the six src/opstrata/<name> trees and the root pyproject.toml into dest; return dest."""
    for name in LAYERS:
        shutil.copytree(
            ROOT / "packages" / name / "src" / "opstrata" / name,
            dest / "src" / "opstrata" / name,
            ignore=shutil.ignore_patterns("__pycache__"),
        )
    shutil.copy(ROOT / "pyproject.toml", dest / "pyproject.toml")
    return dest


def _inject(dest: Path, importer: str, imported: str) -> str:
    """Append `import opstrata.<imported>` to a copied module of `importer`; return that module's dotted name."""
    package = dest / "src" / "opstrata" / importer
    modules = sorted(p for p in package.glob("*.py") if p.name != "__init__.py") or [package / "__init__.py"]
    module = modules[0]
    with module.open("a", encoding="utf-8") as f:
        f.write(f"\nimport opstrata.{imported}  # injected by test_layers: an upward import\n")
    stem = "" if module.name == "__init__.py" else f".{module.stem}"
    return f"opstrata.{importer}{stem}"


# lint-imports with the checkout's packages/*/src dropped from sys.path: a venv holding editable installs
# of the packages (`pip install -e packages/ops`) would otherwise merge the real sources into the copied
# `opstrata` namespace, and the analysis would read the real modules instead of the injected copy.
_LINT = """\
import sys
sys.path[:] = [p for p in sys.path if not (p.startswith(sys.argv[1]) and p.rstrip("/").endswith("src"))]
sys.argv = ["lint-imports", "--no-cache"]
from importlinter.cli import lint_imports_command
lint_imports_command()
"""


def _lint(tree: Path) -> subprocess.CompletedProcess[str]:
    """Run lint-imports in `tree` (config: its pyproject.toml) with only its src dir on the path."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    _lint_imports()  # fails with the install command when import-linter is missing
    return subprocess.run(
        [sys.executable, "-c", _LINT, str(ROOT / "packages")],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_contract_orders_all_six_layers_top_down() -> None:
    config = tomlkit.parse((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contracts = config["tool"]["importlinter"]["contracts"]
    layers = [c for c in contracts if c["type"] == "layers"]
    assert len(layers) == 1, f"expected one layers contract in {ROOT / 'pyproject.toml'}, found {len(layers)}"
    assert list(layers[0]["layers"]) == [f"opstrata.{name}" for name in reversed(LAYERS)]


def test_clean_tree_keeps_the_contract(tmp_path: Path) -> None:
    result = _lint(_copy_tree(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


@pytest.mark.parametrize(("importer", "imported"), [("ops", "graph"), ("graph", "eval"), ("runtime", "comm")])
def test_upward_import_breaks_the_contract(tmp_path: Path, importer: str, imported: str) -> None:
    tree = _copy_tree(tmp_path)
    module = _inject(tree, importer, imported)
    result = _lint(tree)
    assert result.returncode != 0, f"an injected `import opstrata.{imported}` in {module} was not caught"
    assert "BROKEN" in result.stdout
    assert f"opstrata.{importer} is not allowed to import opstrata.{imported}" in result.stdout
    assert f"{module} -> opstrata.{imported}" in result.stdout


def test_downward_import_is_allowed(tmp_path: Path) -> None:
    tree = _copy_tree(tmp_path)
    _inject(tree, "eval", "ops")
    result = _lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
