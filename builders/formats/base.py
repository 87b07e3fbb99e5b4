"""What every chat format gives the build.

It gives a conversation's tokens, each with a class. A chat format is the mask rule of a model
family (``loss_mask`` in the manifest). The build, ``explain``, ``inspect``/``diff``, the data card
and the live mask see a model only through this interface, so a new format plugs in by subclassing
``ChatFormat`` and registering it in ``builders.formats.FORMATS``; nothing else changes:

- ``annotate(rows, engine)`` renders and tokenizes source rows (dicts with ``index``, ``id``,
  ``messages``) into ``Annotated`` records: the conversation's token ids
  (``add_special_tokens=False``, the EOS not included), a token class per id
  (``0 <= class < classes``), which tokens are a message's own text (``inspect`` marks
  special-token text typed there), and whether the conversation ends with an answer (the EOS
  joined after it is then that answer's stop token). A conversation the rule does not define is a
  ``SourceDataError`` naming the source row. ``engine`` (``builders.encode.engines``) turns texts
  into ids; a format that tokenizes by other means (a peer tool's own per-message tokenization)
  may ignore it.
- ``class_mask(contract)``: each class's mask value under a reading of the contract. A format
  whose mask is fixed uses the classes ``UNSUPERVISED`` and ``SUPERVISED``.
- its readings: for each contract key, the values that mean something for this format (a key
  absent applies with all its values), declared in ``builders.formats.FORMAT_READINGS`` so that a
  manifest is checked without the format's module; ``Contract.table`` interprets ``eos``,
  ``encode`` and ``final`` the same way for every format, ``builders.rows.packing`` and
  ``explain`` ``skip``, ``builders.rows.figures`` ``hash``, ``builders.rows.order`` ``order``.
- ``eos`` (the token joined after each conversation), ``appended_stop`` (the token
  ``final: append-stop`` appends, or None), ``describe()`` (the format and its inputs, for the
  card, ``inspect`` and ``--json``).

A format is made from a ``FormatSpec`` (what the manifest and the pinned files say) and the
pinned ``tokenizers.Tokenizer``; a spec is plain data, so worker processes rebuild the same format.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
from tokenizers import Tokenizer

from builders.contract import Contract
from builders.errors import ConversationError, RefusedConversation
from builders.formats import FormatSpec, refusal
from builders.formats.vocab import Vocab

# the classes of a format whose mask is fixed
UNSUPERVISED, SUPERVISED = 0, 1


@dataclass(frozen=True)
class Annotated:
    """One conversation, rendered and tokenized once.

    It holds what each reading needs to mask it.
    """

    # int32: the rendered text's tokens (add_special_tokens=False), no EOS
    ids: np.ndarray
    # uint8: each token's class (the format's)
    classes: np.ndarray
    # bool: the token is part of a message's own text (None where not kept)
    message_text: np.ndarray | None
    # the EOS after the conversation is its last answer's stop token
    ends_with_answer: bool
    # the reference engine encoded it too, and agreed
    cross_checked: bool = False
    # readings of mask_rule that are their own rules (glm5's slime rules): rule -> (appended stop
    # id or None, mask over ids and that token), or None where the rule leaves the conversation out
    rules: dict = field(default_factory=dict)
    # bool: the token is an answer's calls (None where the format does not say)
    in_calls: np.ndarray | None = None


class ChatFormat(ABC):
    """The mask rule of a model family.

    The module docstring states what a subclass gives.
    """

    name: str
    classes: int

    def __init__(self, spec: FormatSpec, tokenizer: Tokenizer, vocab: Vocab):
        # every format refuses inputs it cannot use when it is made
        self.check_inputs(spec, tokenizer)
        self.spec, self.tokenizer, self.vocab = spec, tokenizer, vocab

    @property
    def eos(self) -> str:
        return self.spec.eos

    @abstractmethod
    def annotate(self, rows: list[dict], engine, rules: tuple[str, ...] = ()) -> list[Annotated]:
        """Render and tokenize ``rows``.

        The masks of the own-rule readings in ``rules`` are computed too.
        """

    @abstractmethod
    def class_mask(self, contract: Contract) -> np.ndarray:
        """The mask value of each class under ``contract``."""

    @property
    def stop_tokens(self) -> tuple[str, ...]:
        """The tokens that end an answer (none where the format names none)."""
        return ()

    def appended_stop(self) -> str | None:
        """The stop token ``final: append-stop`` appends.

        It goes after a final answer (None: the reading does not apply).
        """
        return None

    def describe(self) -> dict:
        """The format and its inputs, for the card, ``inspect`` and ``--json``."""
        return {"loss_mask": self.name, "chat_template": self.spec.template_source, "eos": self.eos}

    @classmethod
    def check_inputs(cls, spec: FormatSpec, tokenizer: Tokenizer) -> None:
        """Refuse, before any work, inputs this format cannot use.

        A refusal is a ManifestError, PinnedInputError or UsageError; by default a chat template
        that does not compile is refused, and, where the dataset names tools, one that never
        prints a tool schema. The format runs it when it is made; an override runs both checks.
        """
        # transformers' import (the renderer's) waits for the first format that renders
        from builders.formats.render import check_prints_tools, check_template

        check_prints_tools(spec, check_template(spec))

    @classmethod
    def refusal(cls, contract: Contract) -> tuple[str, str] | None:
        """The field of ``contract`` whose reading does not apply, and why.

        None: all of them apply to this format.
        """
        return refusal(cls.name, contract)

    @classmethod
    def redundant(cls, contract: Contract) -> bool:
        """Whether ``contract`` makes the rows of another reading.

        The other reading has fewer deviations and makes the same rows, whatever the source
        (``explain`` tries only the other).
        """
        return False


@contextmanager
def located(row: dict):
    """Turn a ConversationError into a RefusedConversation (a SourceDataError).

    It names the source row.
    """
    try:
        yield
    except ConversationError as err:
        raise RefusedConversation(row["index"], row["id"], str(err)) from err
