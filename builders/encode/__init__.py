"""Encoding: each conversation rendered, tokenized and masked, in this process or in worker processes."""
