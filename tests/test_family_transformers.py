"""Small llama3, qwen2 and qwen3 files, in F32 and each K-quant, against transformers' forward of the same
file (transformers dequantizes it to float32): logits within 1e-5 of the largest. llama3 here is a
llama file with Llama 3.1's rope_freqs tensor, its factors from transformers' own "llama3" rope
parameters, which the transformers model is then given (its GGUF loader does not read the tensor).
Skips without transformers and torch (pip install torch==2.13.0 transformers accelerate)."""
import os

import numpy as np
import pytest

pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")
torch = pytest.importorskip("torch", reason="pip install torch==2.13.0 (the CPU wheel)")
transformers = pytest.importorskip("transformers", reason="pip install transformers accelerate")
pytest.importorskip("accelerate", reason="pip install accelerate (transformers' GGUF loading needs it)")

from silkattn._testing import EXACT  # noqa: E402
from silkattn.models import llama  # noqa: E402

import llama_files  # noqa: E402

SIZES = dict(d=256, h=4, h_kv=2, d_ff=256, n_layers=2, context=64)
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 256, "rope_theta": 10000.0}
IDS = [5, 9, 200, 3, 3, 64, 250, 7, 1, 2, 9, 30, 31, 40, 41, 42, 43, 44, 45, 46]


def _llama3_factors():
    """rope_freqs.weight: the base inverse frequencies over transformers' llama3 ones (ggml's divisors)."""
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    config = LlamaConfig(hidden_size=SIZES["d"], num_attention_heads=SIZES["h"], rope_parameters=LLAMA3)
    scaled, _ = ROPE_INIT_FUNCTIONS["llama3"](config, "cpu")
    d_head = SIZES["d"] // SIZES["h"]
    base = 1.0 / 10000.0 ** (np.arange(0, d_head, 2) / d_head)
    return (base / scaled.double().numpy()).astype(np.float32), config


def _transformers_logits(path, ids, rope=None):
    from transformers import AutoModelForCausalLM
    folder, name = os.path.split(path)
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
    if rope is not None:  # Llama 3.1's scaled frequencies, as its config.json would give them
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding
        model.config.rope_parameters = dict(rope)
        model.model.rotary_emb = LlamaRotaryEmbedding(model.config)
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].double().numpy()


@pytest.mark.parametrize("kind", ["F32", "Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("arch", ["llama3", "qwen2", "qwen3"])
def test_small_files_match_transformers(tmp_path, arch, kind, on_backend):
    path = str(tmp_path / f"{arch}-{kind}.gguf")
    if arch == "llama3":
        factors, _ = _llama3_factors()
        assert np.isclose(factors.min(), 1) and np.isclose(factors.max(), 8)  # some scaled, some not
        tensors = dict(llama_files.weights(**{k: SIZES[k] for k in ("d", "h", "h_kv", "d_ff", "n_layers")}),
                       **{"rope_freqs.weight": factors})
        llama_files.write(path, kind, pre="llama-bpe", tensors=tensors, **SIZES)
    else:  # qwen3: heads of 128 (attention.key_length), not d / h
        llama_files.write(path, kind, arch=arch, **SIZES, **({"d_head": 128} if arch == "qwen3" else {}))
    theirs = _transformers_logits(path, IDS, LLAMA3 if arch == "llama3" else None)
    ours = llama.load(path, **EXACT).forward(IDS)  # the float32 path: load's defaults round to 8 and 16 bits
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()
    assert (ours.argmax(-1) == theirs.argmax(-1)).all()
