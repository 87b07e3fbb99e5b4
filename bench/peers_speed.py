#!/usr/bin/env python3
"""How fast the peer formats encode, against the peers' own way.

    python bench/peers_speed.py [--conversations 2000] [--reference 200]

The peers' own way is one transformers call per message. Qwen's BPE with trl's Qwen3 template
(``hf-generation``: its ``qwen3_training`` variant), seeded synthetic conversations
(``builders.fixture.conversations.synthetic``). For each peer format it times ``encode_all`` over
the conversations in batches of 256, and ``tests/peer_reference.py`` (miles' calls transcribed /
``apply_chat_template``) over the first ``--reference`` of them, and checks that both give the same
ids and masks there. Prints one JSON line of conversations per second.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

TEMPLATES = {"miles-qwen": "qwen3", "miles-qwen3": "qwen3", "hf-generation": "qwen3_training"}
BATCH = 256


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--conversations", type=int, default=2000)
    parser.add_argument("--reference", type=int, default=200)
    args = parser.parse_args()

    from tokenizers import Tokenizer

    from builders.fixture.conversations import synthetic
    from builders.formats import FormatSpec, make_format
    from peer_inputs import hf_tokenizer, qwen_tokenizer_json, trl_templates
    from peer_reference import hf_generation, miles_loss_mask

    tokenizer_json, templates = qwen_tokenizer_json(), trl_templates()
    conversations = synthetic(11, args.conversations)
    out = {"conversations": args.conversations, "reference_conversations": args.reference}
    with tempfile.TemporaryDirectory() as folder:
        for name, template_name in TEMPLATES.items():
            template = templates[template_name]
            peer = make_format(
                FormatSpec(name, template, eos="<|endoftext|>"), Tokenizer.from_str(tokenizer_json)
            )
            started = time.perf_counter()
            encoded = [
                pair
                for first in range(0, len(conversations), BATCH)
                for pair in peer.encode_all(conversations[first : first + BATCH])
            ]
            ours = time.perf_counter() - started
            tok = hf_tokenizer(tokenizer_json, template, Path(folder) / name)
            started = time.perf_counter()
            expected = [
                hf_generation(tok, m)
                if name == "hf-generation"
                else miles_loss_mask(tok, name.removeprefix("miles-"), m)
                for m in conversations[: args.reference]
            ]
            theirs = time.perf_counter() - started
            same = all(
                ids.tolist() == e[0] and mask.tolist() == e[1]
                for (ids, mask), e in zip(encoded[: len(expected)], expected, strict=True)
            )
            out[name] = {
                "ours_per_s": round(len(conversations) / ours, 1),
                "peer_way_per_s": round(args.reference / theirs, 1),
                "same": same,
            }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
