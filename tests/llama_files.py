"""Small Llama-architecture GGUF files written with the gguf package, for the tests that need no
downloaded model: random weights in any tensor type, a byte-level vocabulary, a ChatML template."""
import numpy as np

TEMPLATE = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
            "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
            "{% endif %}")


def vocabulary():
    """The 256 byte-level symbols, a few merges of them, and three control tokens."""
    from tokenizers import pre_tokenizers
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "a"), ("e", "r")]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + alphabet + [a + b for a, b in merges]
    types = [3, 3, 3] + [1] * (len(tokens) - 3)
    return tokens, [f"{a} {b}" for a, b in merges], types


def weights(d=64, h=4, h_kv=2, d_ff=96, n_layers=2, vocab=None, seed=0, tied=True):
    """{tensor name: float32 array in numpy's order (rows = outputs)}, as a converter writes them."""
    rng = np.random.default_rng(seed)
    vocab = vocab or len(vocabulary()[0])
    d_head = d // h

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    t = {"token_embd.weight": w(vocab, d), "output_norm.weight": 1 + 0.1 * w(d)}
    for i in range(n_layers):
        t.update({f"blk.{i}.attn_norm.weight": 1 + 0.1 * w(d), f"blk.{i}.ffn_norm.weight": 1 + 0.1 * w(d),
                  f"blk.{i}.attn_q.weight": w(d, d), f"blk.{i}.attn_k.weight": w(h_kv * d_head, d),
                  f"blk.{i}.attn_v.weight": w(h_kv * d_head, d), f"blk.{i}.attn_output.weight": w(d, d),
                  f"blk.{i}.ffn_gate.weight": w(d_ff, d), f"blk.{i}.ffn_up.weight": w(d_ff, d),
                  f"blk.{i}.ffn_down.weight": w(d, d_ff)})
    if not tied:
        t["output.weight"] = w(vocab, d)
    return t


def write(path, qtype="F32", *, d=64, h=4, h_kv=2, d_ff=96, n_layers=2, context=64, seed=0, tied=True,
          arch="llama", pre="smollm", tokenizer_model="gpt2", rope_base=10000.0, eps=1e-5, extra=None,
          tensors=None, permute_qk=True):
    """Write a tiny llama GGUF file; matrices in qtype (norms stay F32, as converters keep them).
    Returns the float32 tensors it quantized (before quantization)."""
    import gguf
    tokens, merges, types = vocabulary()
    t = weights(d, h, h_kv, d_ff, n_layers, len(tokens), seed, tied) if tensors is None else tensors
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(n_layers)
    writer.add_context_length(context)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(d_ff)
    writer.add_head_count(h)
    writer.add_head_count_kv(h_kv)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_dimension_count(d // h)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_chat_template(TEMPLATE)
    for key, value in (extra or {}).items():
        writer.add_string(key, value) if isinstance(value, str) else writer.add_uint32(key, value)
    kind = gguf.GGMLQuantizationType[qtype]
    for name, a in t.items():
        if permute_qk and name.endswith(("attn_q.weight", "attn_k.weight")):  # llama.cpp's rotary row order
            a = permute(a, h if "attn_q" in name else h_kv)
        if a.ndim == 1 or qtype == "F32":
            writer.add_tensor(name, a)
        elif qtype == "F16":
            writer.add_tensor(name, a.astype(np.float16))
        else:
            writer.add_tensor(name, gguf.quants.quantize(a, kind), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return t


def permute(W, n_head):  # (n_head * d_head, d): the half-split pairs to llama.cpp's interleaved ones
    return W.reshape(n_head, 2, -1, W.shape[-1]).swapaxes(1, 2).reshape(W.shape)
