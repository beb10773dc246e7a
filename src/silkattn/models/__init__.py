"""Whole models on silkattn's ops, each with a small config dataclass beside it (config.py).

decoder   the listing's decoder-only transformer: block, transformer (DecoderConfig)
seq2seq   the paper's encoder-decoder: encoder_block, decoder_block, encode, decode (Seq2SeqConfig)
generate  one token at a time with a KV cache, for both
layers    multi_head (self, cross, cached), feed_forward, swiglu, the add & norm sublayer
llama     the decoder LLMs of GGUF files (llama, qwen2, qwen3, gemma3: SmolLM2, Llama 3, Qwen2.5,
          Qwen3, Gemma 3): load, tokenize, generate, chat; load(path) here picks the architecture
          from the file
family    what varies between those architectures, as data (FamilyConfig)
gguf      GGUF files read with the gguf package: tensors, tokenizers, chat template
chat_template, reasoning   prompts rendered as transformers renders them; <think> blocks apart
hub       a model named by its Hugging Face repository (Org/Repo-GGUF:Q4_K_M)
bert      a pretrained BERT-family sentence encoder (all-MiniLM-L6-v2)

A new model goes in a module of its own here, composed from silkattn.ops and these layers (see the
docs/contributing.md, "Adding a model").
"""
from .config import DecoderConfig, Seq2SeqConfig
from .decoder import block, transformer
from .generate import KVCache, generate
from .layers import feed_forward, multi_head, swiglu
from .seq2seq import decode, decoder_block, encode, encoder_block, init_seq2seq_params


def load(path, **options):
    """The LLM in the GGUF file at path (or named by its Hub repository, Org/Repo-GGUF[:Q4_K_M]),
    whatever its architecture of the family (general.architecture: llama, qwen2, qwen3, gemma3;
    models/family.py); options: llama.load's (activations, kv_dtype). Needs the llm
    extra (pip install "silkattn[llm]")."""
    from . import llama
    return llama.load(path, **options)


__all__ = ["load", "DecoderConfig", "Seq2SeqConfig", "block", "transformer", "feed_forward", "multi_head",
           "encoder_block", "decoder_block", "encode", "decode", "init_seq2seq_params", "generate", "KVCache",
           "swiglu"]
