"""``python -m meshwise.tune ARGS`` is ``meshwise tune ARGS`` (what the local launcher's workers run)."""

import sys

from meshwise.errors import run_command
from meshwise.tune.command import tune_main

sys.exit(run_command(lambda: tune_main(sys.argv[1:])))
