#!/usr/bin/env python3
"""Add the glm5 loss-mask type to a miles checkout.

The type is backed by fixed-SFT's own mask code:

    python patches/patch_glm5_mask.py /path/to/miles          # apply (idempotent)
    python patches/patch_glm5_mask.py --check /path/to/miles  # exit 0 if applied, 1 if not

It edits two files: ``miles/utils/mask_utils.py`` gains a ``glm5`` branch in
``MultiTurnLossMaskGenerator.get_loss_mask`` that calls
``builders.training.live_mask.glm5_loss_mask`` (so fixed-SFT must be installed where miles runs),
and ``miles/utils/arguments.py`` adds ``glm5`` to ``--loss-mask-type``'s choices. Made for miles
commit 78527b91 (the recipe's); a checkout whose code does not have the expected lines is left
untouched, with an error.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MARKER = "# fixed-SFT: glm5 loss mask"
EDITS = {
    "miles/utils/mask_utils.py": (
        "        else:\n"
        '            raise ValueError(f"Unsupported tokenizer type: {self.tokenizer_type}")\n',
        f'        elif self.tokenizer_type == "glm5":  {MARKER}\n'
        "            from builders.training.live_mask import glm5_loss_mask\n\n"
        "            return glm5_loss_mask(self.tokenizer, messages, tools)\n"
        "        else:\n"
        '            raise ValueError(f"Unsupported tokenizer type: {self.tokenizer_type}")\n',
    ),
    "miles/utils/arguments.py": (
        '                choices=["qwen", "qwen3", "distill_qwen"],\n',
        f'                choices=["qwen", "qwen3", "distill_qwen", "glm5"],  {MARKER}\n',
    ),
}


def patch(miles: Path, check_only: bool = False) -> list[str]:
    """Apply (or only check) the edits; return the files not yet patched."""
    pending, texts = [], {}
    for relative, (anchor, replacement) in EDITS.items():
        path = miles / relative
        if not path.is_file():
            raise SystemExit(f"error: {path}: no such file; is {miles} a miles checkout?")
        text = path.read_text(encoding="utf-8")
        if MARKER in text:
            continue
        if text.count(anchor) != 1:
            raise SystemExit(
                f"error: {path}: the lines to patch are not there once ({anchor.strip()!r}); "
                f"this patch is made for miles commit 78527b91"
            )
        pending.append(relative)
        texts[path] = text.replace(anchor, replacement)
    if not check_only:
        # written only once every file is known to be patchable
        for path, text in texts.items():
            path.write_text(text, encoding="utf-8")
    return pending


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "miles", type=Path, help="the miles checkout (the folder that holds miles/)"
    )
    parser.add_argument(
        "--check", action="store_true", help="only report whether the patch is applied"
    )
    args = parser.parse_args(argv)
    pending = patch(args.miles, check_only=args.check)
    if args.check:
        print("applied" if not pending else f"not applied: {', '.join(pending)}")
        return 0 if not pending else 1
    print(f"patched: {', '.join(pending)}" if pending else "already applied")
    return 0


if __name__ == "__main__":
    sys.exit(main())
