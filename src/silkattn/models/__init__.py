"""Whole models on silkattn's ops, each with a small config dataclass beside it.

decoder: the listing's decoder-only transformer (DecoderConfig, block, transformer), built from the
layers in layers.py (multi_head, feed_forward). A new model goes in a module of its own here,
composed from silkattn.ops and these layers (see the README, "Adding an op or a model").
"""
from .config import DecoderConfig
from .decoder import block, transformer
from .layers import feed_forward, multi_head

__all__ = ["DecoderConfig", "block", "transformer", "feed_forward", "multi_head"]
