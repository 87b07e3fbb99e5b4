"""``python -m builders ...``: the command line.

The same command line as data/generate_fixed_sft.py and fixed-sft.
"""

import sys

from builders.cli import main

sys.exit(main())
