"""Turn conversations into token ids and loss masks.

A chat format annotates, a contract reading masks. Each conversation is rendered and tokenized once
by the manifest's chat format (``builders.formats``) into an ``Annotated`` record that holds what
every contract reading needs (its tokens and their classes, the own-rule masks when asked for);
``materialize`` turns it into the ids and mask of one reading. A build does both for its own
contract; ``explain`` keeps the records and materializes many readings from the same codes
(``stream_codes``).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np
from tokenizers import Tokenizer

from builders.contract import APPENDED, DEFAULT, EOS_AFTER_ANSWER, EOS_AFTER_OTHER, WRAP, Contract
from builders.encode.engines import TokenizersEngine
from builders.errors import ConversationError
from builders.formats import FormatSpec, make_format
from builders.formats.base import Annotated, located
from builders.formats.vocab import Vocab
from builders.inputs.layout import tool_counts
from builders.limits import conversation_chars


@dataclass(frozen=True)
class EncodedConversation:
    index: int  # source index
    id: str
    # the source dataset's ``source`` column (which Tulu subset)
    source: str | None
    # int32: the conversation's tokens (the EOS that follows it is the stream's)
    ids: np.ndarray
    mask: np.ndarray  # uint8, same length
    # whether the last piece is an answer, so the EOS after it is its stop token
    ends_with_answer: bool
    # a mask rule that finds no answer header in it leaves it out of the stream (slime readings)
    left_out: bool = False
    # encoded by the reference engine too (a fast engine's sample), and agreed
    cross_checked: bool = False
    # tools given (1 or 0), calls with string arguments, calls with object arguments, tool
    # messages (``builders.inputs.layout.tool_counts``), supervised tokens inside calls
    tool_counts: tuple[int, int, int, int, int] = (0, 0, 0, 0, 0)


class ConversationEncoder:
    """Renders and encodes with a chat format (``spec``).

    It masks as ``contract`` reads its rule. The encoder owns ``tokenizer``: it turns off any
    truncation or padding that ``tokenizer.json`` configures, as transformers does when it encodes a
    rendered chat.
    """

    def __init__(
        self, tokenizer: Tokenizer, spec: FormatSpec, contract: Contract = DEFAULT, engine=None
    ):
        self.tokenizer = tokenizer
        self.tokenizer.no_truncation()
        self.tokenizer.no_padding()
        self.vocab = Vocab(tokenizer)
        self.format = make_format(spec, tokenizer, self.vocab)
        self.contract = contract
        self.engine = engine or TokenizersEngine(tokenizer)
        self.eos_id = self.vocab.token_id(self.format.eos, self.format.name)
        if contract.encode == "add-special":
            # refuses a post-processor that adds different tokens, before any work
            self.vocab.post_processor_wrap()
        # each code's mask value under the encoder's own contract (``Contract.table``)
        self._mask_values = contract.table(self.class_values(contract))[0]

    @property
    def spec(self) -> FormatSpec:
        return self.format.spec

    def with_engine(self, engine) -> ConversationEncoder:
        """This encoder, encoding with ``engine``.

        The copy shares its tokenizer and format.
        """
        other = copy.copy(self)
        other.engine = engine
        return other

    def encode(self, rows: list[dict]) -> list[EncodedConversation]:
        """Encode source rows, in order.

        The rows are dicts with ``index``, ``id``, ``messages``, optional ``source`` and
        ``layout_error`` (``builders.inputs.source``). A conversation the contract does not define
        is a SourceDataError naming its source row.
        """
        rules = () if self.contract.structure_rule else (self.contract.mask_rule,)
        out = []
        for row, annotated in zip(rows, self.annotate(rows, rules), strict=True):
            materialized = self.materialize(annotated, self.contract)
            ids, mask, ends = materialized if materialized else (_EMPTY_IDS, _EMPTY_MASK, False)
            out.append(
                EncodedConversation(
                    row["index"],
                    row["id"],
                    row.get("source"),
                    ids,
                    mask,
                    ends,
                    left_out=materialized is None,
                    cross_checked=annotated.cross_checked,
                    tool_counts=(*tool_counts(row), self._supervised_in_calls(annotated, mask)),
                )
            )
        return out

    def _supervised_in_calls(self, annotated: Annotated, mask: np.ndarray) -> int:
        """How many of a conversation's supervised tokens are its answers' calls.

        0 where the format does not say which tokens are calls (the peer formats).
        """
        calls = annotated.in_calls
        if calls is None or not len(mask) or not calls.any():
            return 0
        start = (
            len(self.vocab.post_processor_wrap()[0]) if self.contract.encode == "add-special" else 0
        )
        return int(np.count_nonzero(mask[start : start + len(calls)][calls]))

    def annotate(self, rows: list[dict], rules=()) -> list[Annotated]:
        """Render, check and tokenize source rows once.

        The chat format does it (``ChatFormat.annotate``). A row the source could not read as its
        layout says (``layout_error``: ``builders.inputs.source``) is a SourceDataError naming it.
        """
        limit = self.spec.limits.conversation_chars
        for row in rows:
            if row.get("layout_error"):
                with located(row):
                    raise ConversationError(row["layout_error"])
            # the reader refuses a longer row before it parses it; this holds for any caller
            if (size := conversation_chars(row["messages"])) > limit:
                with located(row):
                    raise ConversationError(
                        f"the conversation holds {size:,} characters, more than "
                        f"limits.conversation_chars ({limit:,})"
                    )
        return self.format.annotate(rows, self.engine, tuple(rules))

    def materialize(
        self, annotated: Annotated, contract: Contract
    ) -> tuple[np.ndarray, np.ndarray, bool] | None:
        """The ids and mask of a conversation under ``contract``.

        The EOS is not included; None where its rule leaves it out.
        """
        wrap = self.vocab.post_processor_wrap() if contract.encode == "add-special" else None
        coded = self.stream_codes(
            annotated, contract.mask_rule, wrap, final=contract.final == "append-stop"
        )
        if coded is None:
            return None
        ids, codes = coded
        values = (
            self._mask_values
            if contract is self.contract
            else contract.table(self.class_values(contract))[0]
        )
        return ids, values[codes], annotated.ends_with_answer

    def class_values(self, contract: Contract) -> tuple[int, ...]:
        """The mask value of each code of a conversation's own tokens.

        The values are under ``contract`` (``Contract.table``): the format's classes under its rule,
        the mask itself under an own-rule reading (slime's).
        """
        if not contract.structure_rule:
            return (0, 1)
        return tuple(int(v) for v in self.format.class_mask(contract))

    def stream_codes(
        self,
        annotated: Annotated,
        rule: str,
        wrap: tuple[np.ndarray, np.ndarray] | None,
        final: bool = True,
        eos: bool = False,
    ) -> tuple[np.ndarray, np.ndarray] | None:
        """A conversation's ids and codes under mask rule ``rule``.

        The codes are ``Contract.table``'s. The ids are its own tokens, and around them what a
        reading may add: the ``add-special`` ``wrap`` (None: not there), with ``final`` the stop
        token ``final: append-stop`` appends, with ``eos`` the EOS. Own-rule readings code their
        tokens by mask value (0, 1); None where such a rule leaves the conversation out.
        """
        if rule == DEFAULT.mask_rule:
            base, pieces = self.format.classes, [(annotated.ids, annotated.classes)]
            appended = self.format.appended_stop()
            if final and appended is not None and annotated.ends_with_answer:
                pieces.append(
                    (
                        np.array([self.vocab.token_id(appended, self.format.name)], np.int32),
                        np.array([base + APPENDED], np.uint8),
                    )
                )
        else:
            entry = annotated.rules[rule]
            if entry is None:
                return None
            base, (appended, mask) = 2, entry
            ids = annotated.ids
            if appended is not None:
                ids = np.append(ids, np.int32(appended))
            pieces = [(ids, mask)]
        if wrap is not None:
            before, after = wrap
            pieces = [
                (before, np.full(len(before), base + WRAP, np.uint8)),
                *pieces,
                (after, np.full(len(after), base + WRAP, np.uint8)),
            ]
        if eos:
            code = base + (EOS_AFTER_ANSWER if annotated.ends_with_answer else EOS_AFTER_OTHER)
            pieces.append((np.array([self.eos_id], np.int32), np.array([code], np.uint8)))
        if len(pieces) == 1:
            return pieces[0]
        return (
            np.concatenate([p[0] for p in pieces]).astype(np.int32, copy=False),
            np.concatenate([p[1] for p in pieces]).astype(np.uint8, copy=False),
        )


_EMPTY_IDS = np.zeros(0, dtype=np.int32)
_EMPTY_MASK = np.zeros(0, dtype=np.uint8)
