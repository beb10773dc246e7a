"""Writing one token at a time with a KV cache, for both models: the decoder-only transformer and
the encoder-decoder's decoder.

The prompt is one prefill call (causal from position 0); each step then feeds the one new token
at the next position, whose attention reads the keys and values every earlier position left in
the cache. The cache is preallocated for prompt + max_new_tokens positions (growing it by
concatenation would copy it every step); the encoder-decoder's cross-attention keys and values
are computed once per source. Sampling is the reference's next_token, so a seed gives the same
tokens on every backend.
"""
import numpy as np

from .. import _checks as check
from .. import reference as ref
from . import decoder, seq2seq
from .config import DecoderConfig, Seq2SeqConfig
from .layers import fused_qkv


class KVCache:
    """Every layer's keys and values: (n_layers, 2, capacity, d), rows = positions, each row all
    heads side by side (as the projections produce them: a head reads its d_k columns)."""

    def __init__(self, n_layers, capacity, d, dtype):
        self.data = np.empty((n_layers, 2, capacity, d), dtype)

    def __getitem__(self, layer):  # (K, V) of one layer, each (capacity, d)
        return self.data[layer, 0], self.data[layer, 1]

    @property
    def bytes_per_token(self):
        """Bytes one position takes, per layer (keys and values)."""
        return 2 * self.data.shape[-1] * self.data.itemsize


def generate(prompt_ids, P, max_new_tokens, *, memory=None, memory_mask=None, temperature=0.0, top_k=None,
             seed=None, eos_id=None):  # -> the new token ids (n,)
    """Up to max_new_tokens new token ids after prompt_ids (int64, 1-D; fewer if eos_id came).

    memory=None: the decoder-only transformer (P from init_params). memory (src, d) from encode():
    the encoder-decoder's decoder (P from init_seq2seq_params), prompt_ids the target so far (e.g. a
    start token), memory_mask (src,) False at padded source tokens. temperature 0 is greedy;
    otherwise softmax(logits / temperature) over the top_k largest logits, drawn with the seed.
    """
    ids = check.prompt(prompt_ids, P, max_new_tokens, memory)
    check.sampling(temperature, top_k)
    rng = np.random.default_rng(seed)
    capacity = len(ids) + max_new_tokens
    if memory is None:
        config = DecoderConfig.of(P)
        dtype = np.result_type(P["emb"], P["pos"], *(p["attn"][1] for p in P["layers"]))
        cache = KVCache(config.n_layers, capacity, config.d, dtype)
        qkv = [fused_qkv(*p["attn"][:3]) for p in P["layers"]]

        def step(new, start):
            return decoder.forward_cached(new, P, cache, start, qkv)
    else:
        config = Seq2SeqConfig.of(P)
        _, memory, memory_mask = check.target(ids, memory, memory_mask, P)
        if memory.ndim != 2:
            raise ValueError(f"memory must be one source (src, d) from encode(), got shape {memory.shape}")
        dtype = np.result_type(P["tgt_emb"], P["pos"], *(p["attn"][1] for p in P["decoder"]))
        cache, cross = KVCache(config.n_layers, capacity, config.d, dtype), seq2seq.cross_cache(memory, P)
        qkv = [fused_qkv(*p["attn"][:3]) for p in P["decoder"]]

        def step(new, start):
            return seq2seq.decode_cached(new, P, cache, start, qkv, cross, memory_mask)
    out = []
    if max_new_tokens:
        logits, start = step(ids, 0), len(ids)  # prefill: the whole prompt in one call
        while True:
            out.append(ref.next_token(logits, temperature, top_k, rng))
            if len(out) == max_new_tokens or out[-1] == eos_id:
                break
            logits, start = step(np.array(out[-1:]), start), start + 1
    return np.array(out, dtype=np.int64)
