"""Errors the builder reports to users, each with its exit code.

The exit code is the one the CLI returns for it. Every failure that a user can cause (a bad
manifest, a tampered input, a conversation the template cannot render, figures that differ from the
manifest) is one of these, raised with a message that names what is wrong and where. Anything else
is a bug and exits 1.
"""

from __future__ import annotations

from builders.text import shown


class BuildError(Exception):
    """Base class: a failure with a message meant for the user."""

    exit_code = 1


class UsageError(BuildError):
    """The command line or a manifest is malformed."""

    exit_code = 2


class ManifestError(UsageError):
    """A manifest field is missing or has the wrong type or form."""


class PinnedInputError(BuildError):
    """A pinned input cannot be resolved, is incomplete, or differs.

    It differs where it does not match its sha256.
    """

    exit_code = 3


class SourceDataError(BuildError):
    """The source holds something the row contract cannot turn into rows."""

    exit_code = 4


class RefusedConversation(SourceDataError):
    """A source conversation the row contract cannot encode, and where it is."""

    def __init__(self, index: int, id_: str, reason: str):
        super().__init__(f"source row {index} (id {id_!r}): {reason}")
        self.index, self.id, self.reason = index, id_, reason

    def as_dict(self) -> dict:
        return {"source_index": self.index, "id": self.id, "reason": self.reason}


class OutputError(BuildError):
    """The output cannot be written (a full disk, no permission)."""

    exit_code = 6


class VerificationError(BuildError):
    """The built or given file's figures differ from what the manifest pins."""

    exit_code = 5


class WorkerError(BuildError):
    """A worker process died before it answered its task.

    It was killed, or ran out of memory.
    """

    exit_code = 7


class ConversationError(ValueError):
    """A conversation that the row contract does not define.

    The message says why. Raised where a conversation is checked, without knowing where it came
    from; the builder turns it into a SourceDataError naming the source row, the on-the-fly mask
    into a ValueError.
    """

    # where a batch was checked at once: the conversation's place in it
    conversation: int | None = None

    def __init__(self, message: str):
        # it quotes the conversation, or the template's raise_exception: one line, escaped
        super().__init__(shown(message))

    @classmethod
    def at(cls, conversation: int, message: str) -> ConversationError:
        """The error of the conversation at ``conversation`` in a batch."""
        err = cls(message)
        err.conversation = conversation
        return err


class EngineDisagreement(BuildError):
    """The fast engine encoded a text otherwise than the reference.

    The reference engine is tokenizers.
    """

    exit_code = 9
