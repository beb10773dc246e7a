"""Whole models on silkattn's ops, each with a small config dataclass beside it (config.py).

decoder   the listing's decoder-only transformer: block, transformer (DecoderConfig)
seq2seq   the paper's encoder-decoder: encoder_block, decoder_block, encode, decode (Seq2SeqConfig)
generate  one token at a time with a KV cache, for both
layers    multi_head (self, cross, cached), feed_forward, swiglu, the add & norm sublayer
llama     a Llama-architecture LLM from a GGUF file (SmolLM2): load, tokenize, generate, chat
gguf      GGUF files read with the gguf package: tensors, tokenizer, chat template
bert      a pretrained BERT-family sentence encoder (all-MiniLM-L6-v2)

A new model goes in a module of its own here, composed from silkattn.ops and these layers (see the
docs/contributing.md, "Adding a model").
"""
from .config import DecoderConfig, Seq2SeqConfig
from .decoder import block, transformer
from .generate import KVCache, generate
from .layers import feed_forward, multi_head, swiglu
from .seq2seq import decode, decoder_block, encode, encoder_block, init_seq2seq_params

__all__ = ["DecoderConfig", "Seq2SeqConfig", "block", "transformer", "feed_forward", "multi_head",
           "encoder_block", "decoder_block", "encode", "decode", "init_seq2seq_params", "generate", "KVCache",
           "swiglu"]
