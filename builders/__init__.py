"""fixed-SFT: deterministic supervised fine-tuning rows.

The rows are built from pinned inputs and verified by hashes.

The package reads as the pipeline (docs/architecture.md):

- ``manifest``, ``contract``, ``messages``: what a build is (its pinned inputs and figures), the
  readings of the row contract, and the conversation's messages;
- ``inputs/``: pinned snapshots checked by sha256, the source's files read a block at a time;
- ``formats/``: the chat formats (a model family's render and loss mask);
- ``encode/``: conversations rendered, tokenized and masked, in this process or in workers;
- ``rows/``: the seeded order, packing into rows, the parquet, its figures and data card;
- ``build``: one build, stage by stage; ``cli``: the command line;
- ``views/``: inspect, diff, explain; ``training/``: what a training job reads;
- ``runtime/``: signals, progress, timings, outputs written whole or not at all.
"""

# moves whenever the rows some manifest gives could change; recorded in every report and card
__version__ = "0.3.0"
