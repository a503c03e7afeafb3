"""``python -m fp4repro.cli``: the ``fp4repro`` command without its console script (as torchrun and
the tests start it)."""

from __future__ import annotations

import sys

from fp4repro.cli import main

if __name__ == "__main__":
    sys.exit(main())
