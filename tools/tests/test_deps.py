"""tools/deps.py: the dependency graph as a text tree and as Mermaid."""

from __future__ import annotations

from pathlib import Path

from conftest import run


def test_text_tree(repo: Path) -> None:
    proc = run(repo, "deps.py")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "runtime 0.1.0",
        "├── graph 0.1.0  [>=0.1,<0.2]",
        "│   └── ops 0.1.0  [>=0.1,<0.2]",
        "└── ops 0.1.0  [>=0.1,<0.2]",
    ]


def test_mermaid(repo: Path) -> None:
    proc = run(repo, "deps.py", "--mermaid")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == "flowchart BT"
    assert '    opstrata_graph -->|">=0.1,<0.2"| opstrata_ops' in lines
    assert '    opstrata_runtime -->|">=0.1,<0.2"| opstrata_graph' in lines
