"""What a mask needs to know of a tokenizer.

It needs the token ids, token byte lengths, normalized lengths, what the post-processor adds, and
whether the offsets are the tokens' own character spans.
"""

from __future__ import annotations

import re

import numpy as np
from tokenizers import Tokenizer, pre_tokenizers

from builders.errors import PinnedInputError

OFFSET_PROBES = ("a  b   c", "  lead", "trail  ", "x\n\n  y", "é ü 東京 😀")


class Vocab:
    """A tokenizer seen from a mask.

    Its token byte lengths hold for a byte-level BPE tokenizer.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.token_bytes = token_byte_lengths(tokenizer)
        self._normalizer = tokenizer.normalizer
        added = sorted(
            (t.content for t in tokenizer.get_added_tokens_decoder().values()),
            key=len,
            reverse=True,
        )
        self._added = re.compile("|".join(map(re.escape, added))) if added else None
        self._wrap: tuple[np.ndarray, np.ndarray] | None = None

    def token_id(self, token: str, needed_by: str) -> int:
        token_id = self.tokenizer.token_to_id(token)
        if token_id is None:
            raise PinnedInputError(
                f"the tokenizer has no token {token!r}, which loss_mask {needed_by} needs"
            )
        return token_id

    def byte_level(self) -> bool:
        """Whether each token's byte length is exact.

        It is, of the text as the tokenizer sees it (``keeps``), for a byte-level BPE tokenizer (its
        pre-tokenizer and decoder ByteLevel) whose regular tokens are all spelled in the byte-level
        alphabet.
        """
        parts = self.tokenizer.pre_tokenizer, self.tokenizer.decoder
        # each part's own configuration (its state: its JSON); the whole tokenizer's JSON,
        # parsed, took 0.3 s of CPU and three full passes of the garbage collector
        if any(part is None or b"ByteLevel" not in part.__getstate__() for part in parts):
            return False
        regular = set(self.tokenizer.get_vocab(with_added_tokens=False).values())
        return bool(regular) and bool(np.all(self.token_bytes[list(regular)] > 0))

    def keeps(self, text: str) -> bool:
        """Whether the tokenizer sees ``text`` as it is.

        It does where there is no normalizer, or one that leaves the text unchanged.
        """
        return self._normalizer is None or self._normalizer.normalize_str(text) == text

    @property
    def normalizes(self) -> bool:
        return self._normalizer is not None

    def measure(self, text: str) -> int:
        """The length in bytes of ``text`` as the tokenizer sees it.

        Added tokens count as they are, the text between them through the tokenizer's normalizer
        (NFC, for example).
        """
        if self._normalizer is None or not text:
            return len(text.encode("utf-8"))
        if self._added is None:
            return len(self._normalizer.normalize_str(text).encode("utf-8"))
        total, at = 0, 0
        for match in self._added.finditer(text):
            total += len(self._normalizer.normalize_str(text[at : match.start()]).encode("utf-8"))
            total += len(match.group().encode("utf-8"))
            at = match.end()
        return total + len(self._normalizer.normalize_str(text[at:]).encode("utf-8"))

    def post_processor_wrap(self) -> tuple[np.ndarray, np.ndarray]:
        """The ids the post-processor puts before and after a text's own.

        These are what ``add_special_tokens=True`` adds. Found on probes and required to be the same
        for each: a post-processor that adds something else for another text is refused.
        """
        if self._wrap is None:
            wraps = set()
            for probe in ("a", "hello world", "[gMASK]<sop><|user|>x"):
                plain = self.tokenizer.encode(probe, add_special_tokens=False).ids
                full = self.tokenizer.encode(probe, add_special_tokens=True).ids
                at = next(
                    (
                        i
                        for i in range(len(full) - len(plain) + 1)
                        if full[i : i + len(plain)] == plain
                    ),
                    None,
                )
                if at is None:
                    raise PinnedInputError(
                        "the tokenizer's post-processor changes the text's own tokens; the "
                        "contract reading encode: add-special is undefined for it"
                    )
                wraps.add((tuple(full[:at]), tuple(full[at + len(plain) :])))
            if len(wraps) != 1:
                raise PinnedInputError(
                    "the tokenizer's post-processor adds different tokens to different texts; the "
                    "contract reading encode: add-special is undefined for it"
                )
            ((before, after),) = wraps
            self._wrap = (np.array(before, dtype=np.int32), np.array(after, dtype=np.int32))
        return self._wrap

    def offsets_are_spans(self) -> bool:
        """Whether the encoding's character offsets are the tokens' own spans.

        They are where no normalizer moves characters and no post-processor trims whitespace off
        them; checked on probes.
        """
        if self.normalizes:
            return False
        for probe in OFFSET_PROBES:
            encoding = self.tokenizer.encode(probe, add_special_tokens=False)
            if [list(o) for o in encoding.offsets] != char_spans(
                probe, self.token_bytes[encoding.ids]
            ).tolist():
                return False
        return True


def char_spans(text: str, token_bytes: np.ndarray) -> np.ndarray:
    """Each token's ``[start, end)`` character span in ``text``.

    The spans come from the tokens' byte lengths (a token that covers part of a character covers
    that character).
    """
    data = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    # continuation bytes are 10xxxxxx
    char_of_byte = np.cumsum((data & 0xC0) != 0x80) - 1
    ends = np.cumsum(token_bytes)
    starts = ends - token_bytes
    inside = (token_bytes > 0) & (ends <= len(data))
    if inside.all():
        # the common case, every token inside the text: no masked copies
        return np.stack([char_of_byte[starts], char_of_byte[ends - 1] + 1], axis=1)
    spans = np.zeros((len(token_bytes), 2), dtype=np.int64)
    spans[inside, 0] = char_of_byte[starts[inside]]
    spans[inside, 1] = char_of_byte[ends[inside] - 1] + 1
    return spans


def token_byte_lengths(tokenizer: Tokenizer) -> np.ndarray:
    """Each token id's length in bytes of the text it encodes.

    The tokenizer is a byte-level BPE tokenizer. A regular token is spelled in the byte-level
    alphabet, one character per byte; an added token matches its content literally. Ids that are
    neither get 0, which the mask's coverage check turns into a clear error if such a token is ever
    produced.
    """
    alphabet = set(pre_tokenizers.ByteLevel.alphabet())
    lengths = np.zeros(tokenizer.get_vocab_size(with_added_tokens=True), dtype=np.int64)
    for token, token_id in tokenizer.get_vocab(with_added_tokens=False).items():
        if alphabet.issuperset(token):
            lengths[token_id] = len(token)
    for token_id, added in tokenizer.get_added_tokens_decoder().items():
        lengths[token_id] = len(added.content.encode("utf-8"))
    return lengths
