"""``python -m builders ...``: the command line.

The same command line as data/generate_fixed_sft.py and fixed-sft.
"""

import sys

from builders.runtime.stopping import run_command_line

sys.exit(run_command_line())
