"""``python -m pooltensor ...``: the same as the ``pooltensor`` command (see pooltensor.cli)."""
import sys

from .cli import main

sys.exit(main())
