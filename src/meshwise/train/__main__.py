"""``python -m meshwise.train ARGS`` is ``meshwise train ARGS`` (what the local launcher's workers run)."""

import sys

from meshwise.cli import main

sys.exit(main(["train", *sys.argv[1:]]))
