#!/usr/bin/env python3
"""Build or verify fixed-length SFT rows named by a manifest.

See --help and README.md.
"""

import os
import sys

# the checkout's builders/, imported before anything heavy: the stop handler is installed first
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from builders.runtime.stopping import run_command_line

if __name__ == "__main__":
    sys.exit(run_command_line())
