"""Inputs: pinned snapshots, the source's files, recipe cards.

Pinned snapshots checked by sha256, the source's files read a block at a time, recipe cards.
"""
