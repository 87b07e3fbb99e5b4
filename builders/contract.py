"""The readings of the row contract that the recipe card leaves open, and the one a build uses.

ROWS.md names nine choices ("Readings the recipe card leaves open"), each with a default (the
rule the contract states) and the alternatives a careful builder might have chosen. A manifest
selects alternatives with an optional ``contract:`` mapping; absent keys take the default, so
a manifest without one builds what it always built.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields

import numpy as np

from builders import glm5

# key: (default, alternatives), as ROWS.md names them
READINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "order": ("numpy-generator", ("numpy-legacy", "python-random", "torch", "source")),
    "encode": ("plain", ("add-special",)),
    "mask_rule": ("structure", ("slime-pr1844", "slime-pr1824")),
    "eos": ("after-answer", ("unsupervised", "supervised", "none")),
    "final": ("eos", ("append-stop",)),
    "prefill": ("after-prefill", ("after-role", "whole-piece")),
    "stop": ("supervised", ("unsupervised",)),
    "skip": ("skip-unsupervised", ("keep-all",)),
    "hash": ("u4-u1", ("i8-i8", "u4-all-u1-all", "ids-u4")),
}
SLIME_RULES = ("slime-pr1844", "slime-pr1824")


@dataclass(frozen=True)
class Contract:
    """One reading of each open choice; the defaults are the rules ROWS.md states."""

    order: str = READINGS["order"][0]
    encode: str = READINGS["encode"][0]
    mask_rule: str = READINGS["mask_rule"][0]
    eos: str = READINGS["eos"][0]
    final: str = READINGS["final"][0]
    prefill: str = READINGS["prefill"][0]
    stop: str = READINGS["stop"][0]
    skip: str = READINGS["skip"][0]
    hash: str = READINGS["hash"][0]

    def __post_init__(self):
        for key, value in asdict(self).items():
            default, alternatives = READINGS[key]
            if value not in (default, *alternatives):
                raise ValueError(f"contract.{key}: unknown reading {value!r} (valid: {', '.join(valid(key))})")

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def deviations(self) -> dict[str, str]:
        """The keys whose reading is not the default."""
        return {key: value for key, value in asdict(self).items() if value != READINGS[key][0]}

    @property
    def structure_rule(self) -> bool:
        """The mask comes from the message structure (prefill, stop and final apply)."""
        return self.mask_rule == "structure"

    @functools.cache  # noqa: B019 (contracts are few and live as long as the process)
    def class_mask(self) -> np.ndarray:
        """Mask value of each glm5 token class under this reading (structure rule); not to be changed."""
        values = np.zeros(glm5.CLASSES, dtype=np.uint8)
        values[glm5.ROLE] = self.prefill == "whole-piece"
        values[glm5.PREFILL_THINK] = self.prefill in ("after-role", "whole-piece")
        values[glm5.ANSWER] = 1
        values[glm5.STOP_AFTER] = self.stop == "supervised"
        values[glm5.APPENDED_STOP] = 1
        return values

    def eos_mask(self, ends_with_answer: bool) -> int | None:
        """The mask value of the EOS after a conversation, or None when no EOS follows it."""
        if self.eos == "none":
            return None
        return int(self.eos == "supervised" or (self.eos == "after-answer" and ends_with_answer))


DEFAULT = Contract()
KEYS = tuple(f.name for f in fields(Contract))


def valid(key: str) -> tuple[str, ...]:
    default, alternatives = READINGS[key]
    return (default, *alternatives)
