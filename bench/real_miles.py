#!/usr/bin/env python3
"""Train-side check with the real miles code.

Built rows → miles' data path → miles' SFT loss:

    MILES_SRC=/path/to/miles python bench/real_miles.py out/fixture-tulu100-v1.parquet \\
        [more.parquet ...]

For each file it runs miles' own code, as the recipe configures it (``--loss-type sft_loss
--calculate-per-token-loss --use-dynamic-batch-size --max-tokens-per-gpu 16384``, THD, one
rank): ``RolloutDataSource`` and its ``Dataset`` (``--prompt-data FILE --input-key messages
--metadata-key metadata``) → ``load_rollout_function("pretokenized_sft_rollout.generate_rollout")``
and ``call_rollout_function`` → ``postprocess_rollout_data`` → ``convert_samples_to_train_data``
→ ``split_train_data_by_dp`` (Ray object store) → ``get_rollout_data`` → ``get_data_iterator``
(dynamic micro-batches) → ``get_batch`` → ``loss_function`` with ``sft_loss_function``. Per
micro-batch it compares miles' loss (a sum of -log p, per-token mode) and token count with a
reference next-token loss computed here, inside each row, over the supervised tokens at
positions >= 1. It prints a table and exits 1 if any micro-batch differs.

Made for miles commit 78527b91 (the recipe's). Stubbed, because they cannot run on this CPU
machine, and nothing else:

- the ``sglang`` package: miles' chat-template utilities import it at module level; nothing on
  this path calls it (empty modules);
- Megatron's ``fused_vocab_parallel_cross_entropy`` (a CUDA kernel): replaced by the same
  function in plain torch (``-log_softmax(logits).gather(target)``);
- ``torch.cuda.current_device()`` and ``Tensor.cuda()``: the CPU;
- the model: the logits come from a fixed random table indexed by the input token (a bigram
  model), so the reference loss can be computed from the rows alone.

Arguments are miles' own parser's defaults with the recipe's flags. Needs, beside this project:
torch and the packages miles imports on this path (``pip install torch ray omegaconf pybase64``
and what ``import miles...`` asks for). Without MILES_SRC it prints that it was skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import types
from pathlib import Path

RECIPE_FLAGS = [
    "--loss-type",
    "sft_loss",
    "--calculate-per-token-loss",
    "--disable-compute-advantages-and-returns",
    "--debug-train-only",
    "--rollout-function-path",
    "pretokenized_sft_rollout.generate_rollout",
    "--input-key",
    "messages",
    "--metadata-key",
    "metadata",
    "--use-dynamic-batch-size",
    "--qkv-format",
    "thd",
]
# the recipe's --max-tokens-per-gpu 16384 holds two 8,192-token rows
ROWS_PER_MICRO_BATCH = 2
VOCAB_MARGIN = 16


def stub_unavailable_modules() -> None:
    """The sglang package and Megatron's fused cross-entropy, stubbed.

    As empty or plain-torch modules.
    """
    import importlib.abc
    import importlib.machinery

    import torch

    class _AnyAttribute(type):
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return lambda *args, **kwargs: None

    class _Anything(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            return _AnyAttribute(name, (), {"__init__": lambda self, *a, **k: None})

    class _SglangStubs(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if name == "sglang" or name.startswith("sglang."):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            return _Anything(spec.name)

        def exec_module(self, module):
            module.__path__ = []

    sys.meta_path.insert(0, _SglangStubs())

    def fused_vocab_parallel_cross_entropy(logits, target, group=None):
        return (
            -torch.log_softmax(logits.float(), dim=-1).gather(-1, target.unsqueeze(-1)).squeeze(-1)
        )

    for name in (
        "megatron",
        "megatron.core",
        "megatron.core.fusions",
        "megatron.core.fusions.fused_cross_entropy",
    ):
        module = sys.modules.setdefault(name, types.ModuleType(name))
        # a package, so that other megatron imports fail as they would without it
        module.__path__ = []
    fusions = sys.modules["megatron.core.fusions.fused_cross_entropy"]
    fusions.fused_vocab_parallel_cross_entropy = fused_vocab_parallel_cross_entropy
    torch.cuda.current_device = lambda: "cpu"
    torch.Tensor.cuda = lambda self, *args, **kwargs: self


def miles_args(
    prompt_data: str, hf_checkpoint: str, rows: int, row_tokens: int
) -> argparse.Namespace:
    from miles.utils.arguments import get_miles_extra_args_provider

    flags = [
        *RECIPE_FLAGS,
        "--prompt-data",
        prompt_data,
        "--hf-checkpoint",
        hf_checkpoint,
        "--rollout-batch-size",
        str(rows),
        "--global-batch-size",
        str(rows),
        "--max-tokens-per-gpu",
        str(ROWS_PER_MICRO_BATCH * row_tokens),
    ]
    parser = argparse.ArgumentParser()
    # miles reads sys.argv while it builds its parser
    argv, sys.argv = sys.argv, ["train.py", *flags]
    try:
        get_miles_extra_args_provider()(parser)
    finally:
        sys.argv = argv
    args, _ = parser.parse_known_args(flags)
    # miles_validate_args sets these two for a dataset-backed rollout
    args.rollout_global_dataset = True
    args.n_samples_per_prompt = 1
    return args


def one_rank_parallel_state():
    import torch.distributed as dist
    from miles.backends.training_utils.parallel import ParallelState, set_parallel_state
    from miles.utils.ft_utils.process_group_utils import GroupInfo

    if not dist.is_initialized():
        dist.init_process_group(
            "gloo", init_method=f"file://{tempfile.mktemp()}", rank=0, world_size=1
        )

    def group():
        return GroupInfo(rank=0, size=1, group=dist.group.WORLD)

    set_parallel_state(
        ParallelState(
            intra_dp=group(),
            intra_dp_cp=group(),
            cp=group(),
            tp=group(),
            pp=group(),
            ep=group(),
            etp=group(),
            indep_dp=group(),
        )
    )


def tokenizer_folder(tokenizer_json: Path, folder: Path) -> str:
    """A checkpoint folder with just the tokenizer.

    For miles' load_tokenizer.
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_bytes(tokenizer_json.read_bytes())
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"})
    )
    return str(folder)


def check_file(
    path: Path, tokenizer_json: Path, work: Path, prompt: Path | None = None
) -> list[dict]:
    """miles' loss per micro-batch of one rollout of every row, against the reference.

    ``--prompt-data`` is the row file, or ``prompt`` (a miles prompt file of it).
    """
    import pyarrow.parquet as pq
    import ray
    import torch
    from miles.backends.training_utils.data import get_batch, get_data_iterator, get_rollout_data
    from miles.backends.training_utils.loss import loss_function
    from miles.ray.rollout.rollout_data_conversion import postprocess_rollout_data
    from miles.ray.rollout.train_data_conversion import (
        convert_samples_to_train_data,
        split_train_data_by_dp,
    )
    from miles.rollout.base_types import RolloutFnConstructorInput, RolloutFnTrainInput
    from miles.rollout.data_source import RolloutDataSource
    from miles.rollout.inference_rollout.compatibility import (
        call_rollout_function,
        load_rollout_function,
    )
    from miles.utils import object_store

    table = pq.read_table(path)
    ids = table.column("input_ids").to_pylist()
    masks = table.column("loss_mask").to_pylist()
    # the row each sample of the rollout holds
    row_of = (
        [m["row_index"] for m in pq.read_table(prompt).column("metadata").to_pylist()]
        if prompt
        else list(range(len(ids)))
    )
    args = miles_args(
        str(prompt or path),
        tokenizer_folder(tokenizer_json, work / "checkpoint"),
        len(ids),
        len(ids[0]),
    )
    if not ray.is_initialized():
        ray.init(num_cpus=1, include_dashboard=False, log_to_driver=False)
        object_store.init_instance(args, contribute_segment=False)

    # rollout side (RolloutManager.generate): the data source, the loaded rollout function, the
    # conversion
    data_source = RolloutDataSource(args)
    rollout = load_rollout_function(
        RolloutFnConstructorInput(args=args, data_source=data_source), args.rollout_function_path
    )
    output = call_rollout_function(rollout, RolloutFnTrainInput(rollout_id=0))
    samples, metadata = postprocess_rollout_data(
        args, output.samples, train_parallel_config={"dp_size": 1}
    )
    train_data = convert_samples_to_train_data(args, samples, metadata, None, None)
    refs = split_train_data_by_dp(args, train_data, train_parallel_config={"dp_size": 1})

    # training side: one rank's data, dynamic micro-batches, the SFT loss per micro-batch
    rollout_data, _ = get_rollout_data(args, refs)
    (iterator,), (num_microbatches,) = get_data_iterator(args, None, rollout_data)
    bigram = torch.Generator().manual_seed(0)
    vocab = max(max(row) for row in ids) + VOCAB_MARGIN
    weights = torch.randn(vocab, vocab, generator=bigram, dtype=torch.float32)
    results = []
    for micro_batch in range(num_microbatches):
        batch = get_batch(
            iterator,
            ["tokens", "loss_masks", "response_lengths", "total_lengths", "sample_indices"],
            pad_multiplier=128,
            qkv_format="thd",
        )
        # [1, T, V]: the logit at t depends on token t
        logits = weights[batch["tokens"]]
        row_indices = [row_of[int(i)] for i in batch["sample_indices"]]
        reference_sum, reference_count = reference_loss(
            weights, [ids[i] for i in row_indices], [masks[i] for i in row_indices]
        )
        result = {
            "file": path.name,
            "micro_batch": micro_batch,
            "rows": row_indices,
            "reference_loss": reference_sum,
            "reference_tokens": reference_count,
        }
        try:
            loss, normalizer, _ = loss_function(args, batch, num_microbatches, logits)
            result |= {"miles_loss": float(loss), "miles_tokens": int(normalizer)}
        # what miles raises on a malformed micro-batch
        except RuntimeError as err:
            result |= {"miles_loss": None, "miles_tokens": None, "error": str(err).splitlines()[0]}
        results.append(result)
    return results


def reference_loss(weights, rows: list[list[int]], masks: list[list[int]]) -> tuple[float, int]:
    """The reference loss over the rows, and its token count.

    The sum of -log p(token t | logit at t - 1) over each row's supervised tokens at t >= 1, and
    their count.
    """
    import torch

    total, count = 0.0, 0
    for row, mask in zip(rows, masks, strict=True):
        tokens = torch.tensor(row)
        log_probs = (
            torch.log_softmax(weights[tokens[:-1]], dim=-1).gather(-1, tokens[1:, None]).squeeze(-1)
        )
        trained = torch.tensor(mask[1:], dtype=torch.bool)
        total += float(-log_probs[trained].double().sum())
        count += int(trained.sum())
    return total, count


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("files", type=Path, nargs="+", help="built row files")
    parser.add_argument(
        "--tokenizer",
        type=Path,
        help="the tokenizer.json the rows were built with (default: the "
        "fixture tokenizer, laid out here)",
    )
    parser.add_argument("--json", type=Path, help="also write the table as JSON")
    parser.add_argument(
        "--prompt-seed",
        type=int,
        metavar="SEED",
        help="pass a miles prompt file (`fixed-sft export --to miles --seed SEED`) as "
        "--prompt-data instead of the row file",
    )
    parser.add_argument(
        "--response-from-token-0",
        action="store_true",
        help="a negative control: fill samples as the rollout did before the fix "
        "(response from the first supervised token, even token 0), to see this check fail",
    )
    args = parser.parse_args()
    miles = os.environ.get("MILES_SRC")
    if not miles:
        print("skipped: set MILES_SRC to a miles checkout (commit 78527b91) to run this check")
        return 0
    sys.path.insert(0, miles)
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "patches"))
    stub_unavailable_modules()
    one_rank_parallel_state()
    if args.response_from_token_0:
        import numpy as np

        import pretokenized_sft_rollout

        pretokenized_sft_rollout.response_start = lambda mask: int(np.argmax(np.asarray(mask) != 0))
    with tempfile.TemporaryDirectory() as folder:
        tokenizer = args.tokenizer
        if tokenizer is None:
            from builders.fixture.make import tokenizer_json

            tokenizer = Path(folder) / "tokenizer.json"
            tokenizer.write_bytes(tokenizer_json())
        results = []
        for path in args.files:
            work = Path(folder) / path.stem
            prompt = None
            if args.prompt_seed is not None:
                from builders.training.exports import export

                prompt = export(path.resolve(), "miles", work / "prompt", seed=args.prompt_seed)
            results += check_file(path.resolve(), tokenizer, work, prompt)
    print(
        f"{'file':<28} {'mb':>3} {'rows':<10} {'miles loss':>12} {'reference':>12} "
        f"{'miles n':>8} {'ref n':>6}  same"
    )
    differ = 0
    for r in results:
        same = (
            r["miles_loss"] is not None
            and r["miles_tokens"] == r["reference_tokens"]
            and abs(r["miles_loss"] - r["reference_loss"])
            <= 1e-5 * max(1.0, abs(r["reference_loss"]))
        )
        differ += not same
        loss = "crashed" if r["miles_loss"] is None else f"{r['miles_loss']:.4f}"
        print(
            f"{r['file']:<28} {r['micro_batch']:>3} {','.join(map(str, r['rows'])):<10} {loss:>12} "
            f"{r['reference_loss']:>12.4f} {r['miles_tokens']!s:>8} {r['reference_tokens']:>6}  "
            f"{'yes' if same else 'NO'}{'  ' + r['error'] if 'error' in r else ''}"
        )
    print(f"{len(results) - differ} of {len(results)} micro-batches equal the reference")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
