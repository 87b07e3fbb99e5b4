"""What a training job uses: torch datasets, exports, the live mask.

The rows as a resumable torch dataset and batches that keep conversations apart (``dataset``,
``collate``: they need torch), the rows as other trainers read them (``exports``), and the glm5
mask for a job that tokenizes on the fly (miles' patched loss-mask generator). This module stays
light: the command line reads the export names from it.
"""

# export: the file it writes beside NAME.parquet
EXPORT_SUFFIXES = {
    "trl": ".trl.parquet",
    "megatron-bridge": ".idx.parquet",
    "miles": ".miles.parquet",
}
