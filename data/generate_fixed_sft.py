#!/usr/bin/env python3
"""Build or verify fixed-length SFT rows named by a manifest.

See --help and README.md.
"""

import sys

# Ctrl-C while the command line loads ends as it does later: a one-line message, exit 130
try:
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from builders.cli import main
except KeyboardInterrupt:
    print("error: interrupted", file=sys.stderr)
    sys.exit(130)

if __name__ == "__main__":
    sys.exit(main())
