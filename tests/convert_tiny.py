"""Write GGUF files as the Hub's are written: a tiny random-weight transformers model of an
architecture (Qwen2ForCausalLM, Qwen3ForCausalLM) with the real Qwen2 vocabulary's size, saved with
save_pretrained, converted by llama.cpp's own convert_hf_to_gguf.py (from the llama-cpp-python
sdist) to F32, then quantized by llama.cpp itself (llama_model_quantize) to Q8_0 and Q4_K_M.

    python tests/convert_tiny.py ARCH OUT_DIR LLAMA_CPP_DIR

The converter wants a Hugging Face tokenizer whose hash it knows; as its own _set_vocab_builtin does,
the tokenizer.* keys are copied instead from the suite's vocabulary file (models/ggml-vocab-qwen2.gguf),
with the real model's chat template (Qwen3's from models/templates/) and end-of-turn token. Runs in a
process of its own: the converter imports the gguf-py it vendors. Needs torch, transformers,
safetensors and llama-cpp-python."""
import os
import sys

ARCHS = {  # hidden 256: rows of 256, so llama.cpp's quantizer gives Q4_K / Q6_K, not its fallbacks
    "qwen2": dict(cls="Qwen2ForCausalLM", config="Qwen2Config", kw={}),
    "qwen3": dict(cls="Qwen3ForCausalLM", config="Qwen3Config", kw={"head_dim": 128}),
}
SIZES = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=512, rope_theta=1000000.0, rms_norm_eps=1e-6,
             vocab_size=151936, tie_word_embeddings=True, bos_token_id=151643, eos_token_id=151645)
IM_END = 151645  # <|im_end|>: the real Qwen2.5 / Qwen3 instruct files' end of generation


def make_model(arch, folder, seed=0):
    """A random transformers model saved in folder. Default initialisation gives nearly flat logits:
    weights ~ N(0, 0.25^2) and norm weights near 1, so a wrong rotary, norm or bias shows."""
    import torch
    import transformers

    spec = ARCHS[arch]
    config = getattr(transformers, spec["config"])(**SIZES, **spec["kw"])
    torch.manual_seed(seed)
    model = getattr(transformers, spec["cls"])(config).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1 + 0.1 * torch.randn_like(p))
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn_like(p))
            else:
                p.copy_(0.25 * torch.randn_like(p) / (p.shape[-1] / 64) ** 0.5)
    model.save_pretrained(folder, safe_serialization=True)
    return model


def convert(arch, folder, out, llama_cpp):
    """llama.cpp's convert_hf_to_gguf.py on folder, --outtype f32, the vocabulary copied from the suite."""
    sys.path[:0] = [llama_cpp, os.path.join(llama_cpp, "gguf-py")]
    import gguf  # llama.cpp's own gguf-py, first on the path
    from conversion import base

    vocab = os.path.join(llama_cpp, "models", "ggml-vocab-qwen2.gguf")
    template = None
    if arch == "qwen3":
        real = os.path.join(llama_cpp, "models", "templates", "Qwen-Qwen3-0.6B.jinja")
        with open(real, encoding="utf-8") as f:
            template = f.read()

    def set_vocab_from_suite(self):
        reader = gguf.GGUFReader(vocab, "r")

        def field(key):
            return reader.get_field(key)

        def text(f):
            return bytes(f.parts[-1]).decode("utf-8")
        w, K = self.gguf_writer, gguf.Keys.Tokenizer
        w.add_tokenizer_model(text(field(K.MODEL)))
        w.add_tokenizer_pre(text(field(K.PRE)))
        f = field(K.LIST)
        w.add_token_list([bytes(f.parts[i]) for i in f.data])
        f = field(K.TOKEN_TYPE)
        w.add_token_types([f.parts[i].tolist()[0] for i in f.data])
        f = field(K.MERGES)
        w.add_token_merges([bytes(f.parts[i]) for i in f.data])
        w.add_bos_token_id(field(K.BOS_ID).parts[-1].tolist()[0])
        w.add_pad_token_id(field(K.PAD_ID).parts[-1].tolist()[0])
        w.add_eos_token_id(IM_END)
        w.add_add_bos_token(False)
        w.add_chat_template(template if template is not None else text(field(K.CHAT_TEMPLATE)))

    # Qwen2Model.set_vocab tries SentencePiece first, then byte-level BPE: both become the copy
    base.TextModel._set_vocab_gpt2 = base.TextModel._set_vocab_sentencepiece = set_vocab_from_suite
    import convert_hf_to_gguf
    sys.argv = ["convert_hf_to_gguf.py", folder, "--outtype", "f32", "--outfile", out]
    convert_hf_to_gguf.main()


def quantize(source, out, kind):
    import llama_cpp

    ftype = {"Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M}[kind]
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype, params.nthread = ftype, 2
    code = llama_cpp.llama_model_quantize(source.encode(), out.encode(), params)
    if code != 0:
        raise SystemExit(f"llama_model_quantize {kind} failed: {code}")


def main(arch, out_dir, llama_cpp):
    folder = os.path.join(out_dir, f"{arch}-hf")
    make_model(arch, folder)
    f32 = os.path.join(out_dir, f"{arch}-F32.gguf")
    convert(arch, folder, f32, llama_cpp)
    for kind in ("Q8_0", "Q4_K_M"):
        quantize(f32, os.path.join(out_dir, f"{arch}-{kind}.gguf"), kind)


if __name__ == "__main__":
    main(*sys.argv[1:4])
