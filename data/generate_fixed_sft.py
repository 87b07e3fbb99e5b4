#!/usr/bin/env python3
"""Build or verify fixed-length SFT rows named by a manifest; see --help and README.md."""

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # no "PyTorch was not found": not needed here

from builders.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
