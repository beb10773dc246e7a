"""Small Llama-architecture GGUF files written with the gguf package, for the tests that need no
downloaded model: random weights in any tensor type, a byte-level vocabulary, a ChatML template."""
import numpy as np

from silkattn.models.family import ARCHITECTURES, Architecture

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


def weights(d=64, h=4, h_kv=2, d_ff=96, n_layers=2, vocab=None, seed=0, tied=True, arch="llama", d_head=None):
    """{tensor name: float32 array in numpy's order (rows = outputs)}, as a converter writes them;
    the architecture's own tensors too (qwen2: Q/K/V biases; qwen3 and gemma3: QK-norms; gemma3:
    sandwich norms)."""
    rng = np.random.default_rng(seed)
    vocab = vocab or len(vocabulary()[0])
    d_head = d_head or d // h

    def w(*shape):
        return (rng.standard_normal(shape) / np.sqrt(shape[-1])).astype(np.float32)

    t = {"token_embd.weight": w(vocab, d), "output_norm.weight": 1 + 0.1 * w(d)}
    for i in range(n_layers):
        t.update({f"blk.{i}.attn_norm.weight": 1 + 0.1 * w(d), f"blk.{i}.ffn_norm.weight": 1 + 0.1 * w(d),
                  f"blk.{i}.attn_q.weight": w(h * d_head, d), f"blk.{i}.attn_k.weight": w(h_kv * d_head, d),
                  f"blk.{i}.attn_v.weight": w(h_kv * d_head, d),
                  f"blk.{i}.attn_output.weight": w(d, h * d_head),
                  f"blk.{i}.ffn_gate.weight": w(d_ff, d), f"blk.{i}.ffn_up.weight": w(d_ff, d),
                  f"blk.{i}.ffn_down.weight": w(d, d_ff)})
        if arch == "qwen2":
            t.update({f"blk.{i}.attn_q.bias": 0.5 * w(h * d_head),
                      f"blk.{i}.attn_k.bias": 0.5 * w(h_kv * d_head),
                      f"blk.{i}.attn_v.bias": 0.5 * w(h_kv * d_head)})
        family = ARCHITECTURES.get(arch, Architecture())
        if family.qk_norm:
            t.update({f"blk.{i}.attn_q_norm.weight": 1 + 0.1 * w(d_head),
                      f"blk.{i}.attn_k_norm.weight": 1 + 0.1 * w(d_head)})
        if family.sandwich:
            t.update({f"blk.{i}.post_attention_norm.weight": 1 + 0.1 * w(d),
                      f"blk.{i}.post_ffw_norm.weight": 1 + 0.1 * w(d)})
    if not tied:
        t["output.weight"] = w(vocab, d)
    return t


K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")  # gguf's Python has no quantizer for these: random valid blocks


def k_blocks(rng, kind, rows, cols):
    """(rows, cols / 256 * block bytes) random bytes as valid `kind` blocks: float16 super-scales
    sized so that the weights are about 1 / sqrt(cols) (a converter's magnitudes), of both signs."""
    from silkattn import reference as ref
    weights, size = ref.QUANT_BLOCKS[kind]
    b = rng.integers(0, 256, (rows, cols // weights, size), dtype=np.uint8)
    top = {"Q4_K": 63 * 15, "Q5_K": 63 * 31, "Q6_K": 127 * 32}[kind]  # the largest |scale x q| of the layout
    for at in ((0, 2) if kind != "Q6_K" else (208,)):
        d = rng.uniform(0.5, 2.0, b.shape[:2]) * 2 / (np.sqrt(cols) * top) * rng.choice([-1, 1], b.shape[:2])
        b[..., at:at + 2] = d.astype(np.float16).view(np.uint8).reshape(*b.shape[:2], 2)
    return b.reshape(rows, -1)


def write(path, qtype="F32", *, d=64, h=4, h_kv=2, d_ff=96, n_layers=2, context=64, seed=0, tied=True,
          arch="llama", pre="smollm", tokenizer_model="gpt2", rope_base=10000.0, eps=1e-5, extra=None,
          tensors=None, permute_qk=None, types=None, d_head=None, window=None, extra_float=None,
          extra_array=None, template=TEMPLATE):
    """Write a tiny GGUF file of architecture arch (llama, qwen2, gemma3: the rotary rows of llama's
    Q and K interleaved as llama.cpp's converter leaves them, unless permute_qk=False); matrices in
    qtype, or types[name] where given (norms stay F32, as converters keep them); a K-quant's
    tensors are random valid blocks (k_blocks). d_head: the head width where it is not d / h;
    window: the sliding window; template: the chat template (None: none).
    Returns the float32 tensors it quantized (before quantization; a
    K-quant's, its blocks' weights, in the file's row order)."""
    import gguf

    from silkattn import reference as ref
    tokens, merges, types_of_tokens = vocabulary()
    t = (weights(d, h, h_kv, d_ff, n_layers, len(tokens), seed, tied, arch, d_head) if tensors is None
         else dict(tensors))
    permute_qk = arch == "llama" if permute_qk is None else permute_qk
    rng = np.random.default_rng(seed + 1000)
    writer = gguf.GGUFWriter(path, arch)
    writer.add_block_count(n_layers)
    writer.add_context_length(context)
    writer.add_embedding_length(d)
    writer.add_feed_forward_length(d_ff)
    writer.add_head_count(h)
    writer.add_head_count_kv(h_kv)
    writer.add_rope_freq_base(rope_base)
    writer.add_layer_norm_rms_eps(eps)
    writer.add_rope_dimension_count(d_head or d // h)
    if d_head:
        writer.add_key_length(d_head)
        writer.add_value_length(d_head)
    if window:
        writer.add_sliding_window(window)
    writer.add_tokenizer_model(tokenizer_model)
    writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    writer.add_token_merges(merges)
    writer.add_token_types(types_of_tokens)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    if template is not None:
        writer.add_chat_template(template)
    for key, value in (extra or {}).items():
        writer.add_string(key, value) if isinstance(value, str) else writer.add_uint32(key, value)
    for key, value in (extra_float or {}).items():
        writer.add_float32(key, value)
    for key, value in (extra_array or {}).items():
        writer.add_array(key, value)
    for name, a in list(t.items()):
        qt = (types or {}).get(name, qtype)
        kind = gguf.GGMLQuantizationType[qt]
        if permute_qk and name.endswith(("attn_q.weight", "attn_k.weight")):  # llama.cpp's rotary row order
            a = permute(a, h if "attn_q" in name else h_kv)
        if a.ndim == 1 or qt == "F32" or name.endswith(".bias"):
            writer.add_tensor(name, a)
        elif qt == "F16":
            writer.add_tensor(name, a.astype(np.float16))
        elif qt in K_QUANTS:
            blocks = k_blocks(rng, qt, *a.shape)
            writer.add_tensor(name, blocks, raw_dtype=kind)
            w = ref.dequantize(blocks, qt)
            t[name] = unpermute(w, h if "attn_q" in name else h_kv) if permute_qk and name.endswith(
                ("attn_q.weight", "attn_k.weight")) else w
        elif qt in ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1"):
            writer.add_tensor(name, gguf.quants.quantize(a, kind), raw_dtype=kind)
        else:  # a type silkattn does not run (Q2_K, Q3_K, the IQ types): zero bytes of its size
            per_block, size = gguf.GGML_QUANT_SIZES[kind]
            raw = np.zeros((a.shape[0], a.shape[1] // per_block * size), np.uint8)
            writer.add_tensor(name, raw, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return t


def permute(W, n_head):  # (n_head * d_head, d): the half-split pairs to llama.cpp's interleaved ones
    return W.reshape(n_head, 2, -1, W.shape[-1]).swapaxes(1, 2).reshape(W.shape)


def unpermute(W, n_head):  # permute's inverse
    return W.reshape(n_head, -1, 2, W.shape[-1]).swapaxes(1, 2).reshape(W.shape)
