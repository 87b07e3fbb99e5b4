"""Encoding: each conversation rendered, tokenized and masked.

It runs in this process or in worker processes.
"""
