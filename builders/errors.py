"""Errors the builder reports to users, each with the exit code the CLI returns for it.

Every failure that a user can cause (a bad manifest, a tampered input, a conversation the
template cannot render, figures that differ from the manifest) is one of these, raised with a
message that names what is wrong and where. Anything else is a bug and exits 1.
"""

from __future__ import annotations


class BuildError(Exception):
    """Base class: a failure with a message meant for the user."""

    exit_code = 1


class UsageError(BuildError):
    """The command line or a manifest is malformed."""

    exit_code = 2


class ManifestError(UsageError):
    """A manifest field is missing or has the wrong type or form."""


class PinnedInputError(BuildError):
    """A pinned input cannot be resolved, is incomplete, or does not match its sha256."""

    exit_code = 3


class SourceDataError(BuildError):
    """The source dataset holds something the row contract cannot turn into rows."""

    exit_code = 4


class OutputError(BuildError):
    """The output cannot be written (a full disk, no permission)."""

    exit_code = 6


class VerificationError(BuildError):
    """The built or given file's figures differ from what the manifest pins."""

    exit_code = 5


class WorkerError(BuildError):
    """A worker process died (killed, out of memory) before it returned its batch."""

    exit_code = 7


class ConversationError(ValueError):
    """A conversation that the row contract does not define; the message says why.

    Raised where a conversation is checked, without knowing where it came from; the builder
    turns it into a SourceDataError naming the source row, the on-the-fly mask into a ValueError.
    """

    conversation: int | None = (
        None  # where a batch was checked at once: the conversation's place in it
    )

    @classmethod
    def at(cls, conversation: int, message: str) -> ConversationError:
        """The error of the conversation at ``conversation`` in a batch."""
        err = cls(message)
        err.conversation = conversation
        return err


class EngineDisagreement(BuildError):
    """The fast tokenizer engine encoded a text otherwise than the reference engine, tokenizers."""

    exit_code = 9
