"""``python -m meshwise.train ARGS`` is ``meshwise train ARGS`` (what the local launcher's workers run)."""

import sys

from meshwise.errors import run_command
from meshwise.train.command import train_main

sys.exit(run_command(lambda: train_main(sys.argv[1:])))
