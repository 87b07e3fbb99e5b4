"""The readings of the row contract, and the one a build uses.

The readings are those of the choices that the recipe card leaves open. data/ROWS.md names nine
choices ("Readings the recipe card leaves open"), each with a default (the rule the contract states)
and the alternatives a careful builder might have chosen. A manifest selects alternatives with an
optional ``contract:`` mapping; absent keys take the default, so a manifest without one builds what
it always built.
"""

from __future__ import annotations

import functools
from dataclasses import asdict, dataclass, fields

import numpy as np

# key: (default, alternatives), as data/ROWS.md names them
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
    """One reading of each open choice.

    The defaults are the rules data/ROWS.md states.
    """

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
                raise ValueError(
                    f"contract.{key}: unknown reading {value!r} (valid: {', '.join(valid(key))})"
                )

    def as_dict(self) -> dict[str, str]:
        return asdict(self)

    def deviations(self) -> dict[str, str]:
        """The keys whose reading is not the default."""
        return {key: value for key, value in asdict(self).items() if value != READINGS[key][0]}

    @property
    def structure_rule(self) -> bool:
        """The mask comes from the message structure.

        Under this rule the prefill, stop and final readings apply.
        """
        return self.mask_rule == "structure"

    @functools.cache  # noqa: B019 (contracts are few and live as long as the process)
    def table(self, class_values: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        """Each code's mask value, and whether its tokens stay in the stream.

        Both under this reading. Codes ``0 .. len(class_values) - 1`` are a chat format's token
        classes (``class_values``: their mask values, from ``ChatFormat.class_mask``); the four
        after them are the tokens a reading may add around a conversation's own
        (``EOS_AFTER_ANSWER`` .. ``WRAP``). Not to be changed.
        """
        base = len(class_values)
        values, keep = np.zeros(base + EXTRA_CODES, np.uint8), np.ones(base + EXTRA_CODES, bool)
        values[:base] = class_values
        values[base + APPENDED] = 1
        keep[base + APPENDED] = self.final == "append-stop"
        values[base + EOS_AFTER_ANSWER] = self.eos_mask(True) or 0
        values[base + EOS_AFTER_OTHER] = self.eos_mask(False) or 0
        keep[base + EOS_AFTER_ANSWER] = keep[base + EOS_AFTER_OTHER] = self.eos != "none"
        keep[base + WRAP] = self.encode == "add-special"
        return values, keep

    @property
    def keeps_unsupervised_windows(self) -> bool:
        return self.skip == "keep-all"

    def eos_mask(self, ends_with_answer: bool) -> int | None:
        """The mask value of the EOS after a conversation.

        None when no EOS follows it.
        """
        if self.eos == "none":
            return None
        return int(self.eos == "supervised" or (self.eos == "after-answer" and ends_with_answer))


# the codes past a format's classes (see Contract.table): the EOS after a conversation that ends
# with an answer, the EOS after any other, the stop token final: append-stop appends, the
# encode: add-special wrap
EOS_AFTER_ANSWER, EOS_AFTER_OTHER, APPENDED, WRAP = range(4)
EXTRA_CODES = 4

DEFAULT = Contract()
KEYS = tuple(f.name for f in fields(Contract))


def valid(key: str) -> tuple[str, ...]:
    default, alternatives = READINGS[key]
    return (default, *alternatives)
