"""Print the opstrata package dependency graph from the pyprojects: a text tree, or Mermaid.

python tools/deps.py             # tree from each top package down; (*) marks a subtree shown above
python tools/deps.py --mermaid   # paste into docs or a GitHub comment
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lockfile as lf
from lockfile import LockError, PyProject


def text_tree(layers: list[str], pps: dict[str, PyProject]) -> str:
    """Each top package (nothing depends on it) with its requirements below it, cargo-tree style."""
    used = {low for pp in pps.values() for low in pp.requires}
    tops = [n for n in reversed(layers) if n not in used]
    lines: list[str] = []
    shown: set[str] = set()

    def walk(name: str, prefix: str, spec: str, last: bool, top: bool) -> None:
        pp = pps.get(name)
        label = f"{name} {pp.version if pp else '(not a package)'}" + (f"  [{spec}]" if spec else "")
        repeat = name in shown and pp is not None and bool(pp.requires)
        lines.append(
            label if top else f"{prefix}{'└── ' if last else '├── '}{label}{' (*)' if repeat else ''}"
        )
        if repeat or pp is None:
            return
        shown.add(name)
        child_prefix = "" if top else prefix + ("    " if last else "│   ")
        kids = list(pp.requires.items())
        for i, (low, low_spec) in enumerate(kids):
            walk(low, child_prefix, low_spec, i == len(kids) - 1, False)

    for top in tops:
        walk(top, "", "", True, True)
    return "\n".join(lines)


def mermaid(layers: list[str], pps: dict[str, PyProject]) -> str:
    """A Mermaid flowchart: one node per package (name + version), one edge per declared range."""
    lines = ["flowchart BT"]
    lines += [
        f'    opstrata_{n}["opstrata-{n} {pps[n].version}"]' for n in layers
    ]  # ids avoid keywords like graph
    lines += [
        f'    opstrata_{n} -->|"{spec}"| opstrata_{low}'
        for n in layers
        for low, spec in pps[n].requires.items()
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Entry point."""
    ap = argparse.ArgumentParser(prog="tools/deps.py", description=__doc__.splitlines()[0])
    ap.add_argument("--mermaid", action="store_true", help="print a Mermaid flowchart instead of a tree")
    ap.add_argument("--root", type=Path, help="repository root (default: git toplevel of the cwd)")
    args = ap.parse_args(argv)
    try:
        root = lf.find_root(args.root)
        layers = lf.current_layers(root)
        pps = lf.load_pyprojects(root, layers)
    except LockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(mermaid(layers, pps) if args.mermaid else text_tree(layers, pps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
