"""Inputs: pinned snapshots checked by sha256, the source's files read a block at a time, recipe cards."""
