"""``python -m opstrata.comm.launch``: the opstrata-launch command (see ``_launch``)."""

from __future__ import annotations

import sys

from ._launch import main

if __name__ == "__main__":
    sys.exit(main())
