"""How miles trains an SFT micro-batch, emulated from its source.

The source is miles at the recipe's commit 78527b91.

Read in miles (not copied): ``miles/ray/rollout/train_data_conversion.py``
(``convert_samples_to_train_data``: one entry per sample of ``tokens``, ``response_lengths``,
``loss_masks``, asserting ``len(loss_mask) == response_length``),
``miles/backends/training_utils/data.py`` (``get_batch``, THD: the samples' tokens concatenated
in order and padded to a multiple of 128), ``.../loss_hub/logit_processors.py``
(``get_responses`` with context parallelism 1: for each sample, ``end`` advances by its total
length, ``start = end - response_length``, its logits are ``logits[start - 1 : end - 1]`` and
its targets ``tokens[-response_length:]``), ``.../cp_utils.py`` (``get_sum_of_sample_mean``:
the per-token values are split by ``response_lengths`` and multiplied by each loss mask) and
``.../loss.py`` (``loss_function``: the per-token normalizer is the sum over samples of
``max(loss_mask.sum(), 1)``).

The emulation works on positions, not tensors: it says which packed logit position trains
which (row, token) pair, so a test can assert exactly what a real run would train.
"""

from __future__ import annotations

from dataclasses import dataclass

PAD_MULTIPLE = 128  # get_batch's pad_multiplier × tensor parallel size 1


class MilesWouldCrash(AssertionError):
    """What miles raises for this micro-batch.

    An assertion, or a shape error in the loss.
    """


@dataclass(frozen=True)
class Target:
    row: int  # the sample's row (metadata.row_index)
    position: int  # the target token's position in its row
    logit_row: int | None  # the row whose logit predicts it (None: padding)
    logit_position: int  # that logit's position in its row


def trained_targets(samples: list) -> tuple[list[Target], int]:
    """The targets one micro-batch of filled samples trains.

    It returns them with miles' per-token normalizer.
    """
    rows = [sample.metadata["row_index"] for sample in samples]
    for sample in samples:
        if len(sample.loss_mask) != sample.response_length:
            raise MilesWouldCrash(
                f"loss mask length {len(sample.loss_mask)} != response length "
                f"{sample.response_length}"
            )
    total_lengths = [len(sample.tokens) for sample in samples]
    packed = sum(total_lengths)
    packed += (PAD_MULTIPLE - packed % PAD_MULTIPLE) % PAD_MULTIPLE
    owner = [
        (row, t) for row, length in zip(rows, total_lengths, strict=True) for t in range(length)
    ]
    owner += [(None, t) for t in range(packed - len(owner))]
    positions = list(range(packed))

    targets, end = [], 0
    for row, sample, total in zip(rows, samples, total_lengths, strict=True):
        end += total
        start = end - sample.response_length
        # python slicing, as torch slices
        logits = positions[start - 1 : end - 1]
        tokens = list(range(total))[-sample.response_length :]
        if len(logits) != len(tokens):
            raise MilesWouldCrash(
                f"row {row}: {len(logits)} logits for {len(tokens)} response tokens "
                f"(split_with_sizes fails in the loss)"
            )
        for logit, position, weight in zip(logits, tokens, sample.loss_mask, strict=True):
            if weight:
                logit_row, logit_position = owner[logit]
                targets.append(Target(row, position, logit_row, logit_position))
    normalizer = sum(max(sum(sample.loss_mask), 1) for sample in samples)
    return targets, normalizer
