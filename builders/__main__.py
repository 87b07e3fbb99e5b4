"""``python -m builders ...``: the same command line as data/generate_fixed_sft.py."""

import os
import sys

os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from builders.cli import main  # noqa: E402

sys.exit(main())
