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

from .. import _aligned, ops
from .. import _checks as check
from .. import reference as ref
from . import decoder, seq2seq
from .config import DecoderConfig, Seq2SeqConfig
from .layers import fused_qkv


class KVCache:
    """Every layer's keys and values: (n_layers, 2, capacity, d), rows = positions, each row all
    heads side by side (as the projections produce them: a head reads its d_k columns)."""

    def __init__(self, n_layers, capacity, d, dtype):
        self.data = _aligned.empty((n_layers, 2, capacity, d), dtype)

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
        fused = _fused_blocks(P["layers"], qkv, cache, capacity)

        def step(new, start):
            if fused and len(new) == 1:
                x = P["emb"][new[0]] + P["pos"][start]
                return ops.linear(fused(x, start), P["emb"].T)
            return decoder.forward_cached(new, P, cache, start, qkv)
    else:
        config = Seq2SeqConfig.of(P)
        _, memory, memory_mask = check.target(ids, memory, memory_mask, P)
        if memory.ndim != 2:
            raise ValueError(f"memory must be one source (src, d) from encode(), got shape {memory.shape}")
        dtype = np.result_type(P["tgt_emb"], P["pos"], *(p["attn"][1] for p in P["decoder"]))
        cache, cross = KVCache(config.n_layers, capacity, config.d, dtype), seq2seq.cross_cache(memory, P)
        qkv = [fused_qkv(*p["attn"][:3]) for p in P["decoder"]]
        fused = _fused_blocks(P["decoder"], qkv, cache, capacity, cross, memory_mask)

        def step(new, start):
            if fused and len(new) == 1:
                x = ref.embed(new, P["tgt_emb"], P["pos"][start:])[0]
                return ops.linear(fused(x, start), P["tgt_emb"].T)
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


def _fused_blocks(layers, qkv, cache, capacity, cross=None, memory_mask=None):
    """A decoding step's blocks as one ops.layer_step each, their records (ops.layer_step_record)
    made here once: x (d,) -> x after every layer (updated in place, the new keys and values
    written to the cache), or None where the model is not float32 with C-contiguous arrays (the
    ops then run it)."""
    f32 = np.dtype(np.float32)
    names = ("ln1", "ln2", "attn", "ffn", "ln_cross", "cross")
    arrays = [a for p in layers for name in names for a in p.get(name, ())]
    arrays += list(qkv) + [cache.data] + [a for kv in (cross or ()) for a in kv]
    if not all(a.dtype == f32 and a.flags.c_contiguous for a in arrays):
        return None
    steps = []
    for i, p in enumerate(layers):
        W1, b1, W2, b2 = p["ffn"]
        attend = None if cross is None else {"norm": p["ln_cross"], "q": p["cross"][0], "o": p["cross"][3],
                                             "memory": cross[i], "keep": memory_mask}
        steps.append(ops.layer_step_record(
            heads=p["h"], norm1=tuple(p["ln1"]), qkv=qkv[i], o=p["attn"][3], norm2=tuple(p["ln2"]),
            up=(W1, b1), down=(W2, b2), cache=cache[i], eps=ref.LN_EPS,
            post_norm=p.get("norm", "pre") == "post", cross=attend, scratch_of=steps[0] if steps else None))

    def run(x, pos):
        x = np.array(x, f32)  # (d,): the residual stream, a copy the steps update in place
        for step in steps:
            ops.layer_step(step, x, pos)
        return x
    return run
