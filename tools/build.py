"""Build sdists and wheels of all or named packages, or of recorded git trees, into dist/.

    python tools/build.py                      # all packages, sdist + wheel, into dist/
    python tools/build.py ops graph --out d    # just these
    python tools/build.py --tree <hash>        # the package stored in a git tree (a recorded release)
    python tools/build.py --release ops==0.1.0 # a recorded release, by version, from versions.lock

A thin CLI over tools/wheels.py (this file's name would shadow PyPI's `build` if imported).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import lockfile as lf
import wheels
from lockfile import LockError


def main(argv: list[str] | None = None) -> int:
    """Entry point: build what was asked and list the files made."""
    ap = argparse.ArgumentParser(prog="tools/build.py", description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="package short names (default: all, unless --tree/--release)")
    ap.add_argument(
        "--out", default="dist", help="output directory, relative to the repo root (default: dist)"
    )
    ap.add_argument(
        "--tree", action="append", default=[], help="build the package stored in this git tree hash"
    )
    ap.add_argument("--release", action="append", default=[], help="build a recorded release, NAME==VERSION")
    ap.add_argument("--root", type=Path, help="repository root (default: git toplevel of the cwd)")
    args = ap.parse_args(argv)
    try:
        root = lf.find_root(args.root)
        out = root / args.out
        made: list[Path] = []
        if args.names or not (args.tree or args.release):
            made += wheels.build_packages(root, args.names or None, out)
        for tree in args.tree:
            made += wheels.build_tree(root, tree, out)
        for spec in args.release:
            name, sep, version = spec.partition("==")
            if not sep:
                raise LockError(f"--release: expected NAME==VERSION like ops==0.1.0, found {spec!r}")
            made.append(wheels.build_release(root, name, version, out))
    except LockError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for f in made:
        print(lf.show(f))
    return 0


if __name__ == "__main__":
    sys.exit(main())
