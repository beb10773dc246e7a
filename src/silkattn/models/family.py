"""The Llama family as data: what varies between the GGUF architectures silkattn runs (llama, qwen2,
qwen3, gemma3) is a FamilyConfig read from the file's metadata, and one model (models/llama.py) and one
reference forward pass (reference.llama) run every config.

    architecture  rotary rows      Q/K/V bias  QK-norm  sandwich norms  gate       embedding scale
    llama         interleaved (*)  no          no       no              silu       1
    qwen2         half-split       yes         no       no              silu       1
    qwen3         half-split       no          yes      no              silu       1
    gemma3        half-split       no          yes      yes             gelu_tanh  sqrt(d)

(*) llama.cpp's converter interleaves the rotary pairs of a llama file's Q and K rows; the loader puts
them back in the half-split order reference.rope turns. Per layer: a window and a rope base (Gemma 3:
layer i is local, window sliding_window and base 10000, unless i % 6 == 5, global with the file's
base), and Llama 3's rope_freqs divisors. Metadata that would change the arithmetic in a way this
table does not know (partial rotary, rope scaling other than linear, logit softcaps, experts) is a
ValueError at load naming the key; so is a missing key or a size that does not fit.
"""
import dataclasses
import math

import numpy as np

from . import blocks


@dataclasses.dataclass(frozen=True)
class Architecture:
    """What one GGUF architecture name means: the family's switches (see the module's table), and the
    composition of blocks a layer is (models.blocks: pre_norm for every architecture of the table)."""

    interleaved_rotary: bool = False  # the file's Q/K rows hold llama.cpp's interleaved pairs
    qkv_bias: bool = False
    qk_norm: bool = False             # per-head RMSNorm of Q and K before rotary (attn_q_norm, attn_k_norm)
    sandwich: bool = False            # RMSNorm of each sublayer's output before its residual add
    activation: str = "silu"
    embed_scale: bool = False         # embeddings times sqrt(d)
    global_every: int = 0             # with a sliding window: layer i global iff i % global_every == -1
    local_rope_base: float = None     # the local layers' rope base (None: the file's)
    layer: object = blocks.pre_norm   # layer(run, L, X, H) -> (X, H'): models.blocks
    ffn_norm: bool = True             # the layer has a norm of its own before the feed-forward


ARCHITECTURES = {
    "llama": Architecture(interleaved_rotary=True),
    "qwen2": Architecture(qkv_bias=True),
    "qwen3": Architecture(qk_norm=True),  # its head width is attention.key_length, not d / h
    "gemma3": Architecture(qk_norm=True, sandwich=True, activation="gelu_tanh", embed_scale=True,
                           global_every=6,
                           local_rope_base=10000.0),
}

# metadata keys (after "<arch>.") whose meaning the family does not cover: refused, not ignored
UNSUPPORTED_KEYS = ("attn_logit_softcapping", "final_logit_softcapping", "expert_count", "expert_used_count",
                    "attention.q_lora_rank", "attention.kv_lora_rank", "rope.scaling.attn_factor",
                    "rope.scaling.yarn_log_multiplier", "attention.layer_norm_epsilon")


@dataclasses.dataclass(frozen=True)
class FamilyConfig:
    """One model of the family: its sizes and switches, and per layer its window and rope."""

    vocab: int
    d: int
    n_layers: int
    h: int                   # query heads
    h_kv: int                # key/value heads (grouped-query attention: h % h_kv == 0)
    d_ff: int                # the gated feed-forward's hidden width
    eps: float = 1e-5        # RMSNorm's epsilon
    rope_base: float = 10000.0
    context_length: int = 2048
    rope_freqs: tuple = None  # Llama 3's per-frequency divisors of rope (d_head / 2): rope_freqs.weight
    arch: str = "llama"
    head_dim: int = None     # a head's width (None: d / h; Gemma 3's is not)
    windows: tuple = None    # per layer: the window (keys less than it back) or None; None: all global
    rope_bases: tuple = None  # per layer; None: rope_base everywhere
    layer_rope_freqs: tuple = None  # per layer: rope's divisors (rope_freqs or a linear scale) or None
    scale: float = None      # the attention's scale (None: 1 / sqrt(d_head))

    @property
    def d_head(self):
        return self.head_dim or self.d // self.h

    @property
    def family(self):  # -> Architecture
        return ARCHITECTURES[self.arch]

    @property
    def embed_scale(self):
        return math.sqrt(self.d) if self.family.embed_scale else None

    def window(self, i):
        return None if self.windows is None else self.windows[i]

    def layer_rope(self, i):  # -> (base, freq_factors) of layer i
        base = self.rope_base if self.rope_bases is None else self.rope_bases[i]
        return base, (self.rope_freqs if self.layer_rope_freqs is None else self.layer_rope_freqs[i])

    @classmethod
    def from_gguf(cls, file):
        """The config of a GGUF file; ValueError for a file silkattn cannot run, naming what it found."""
        arch = file.get("general.architecture")
        if arch not in ARCHITECTURES:
            raise ValueError(f"{file.path}: architecture {arch!r}: silkattn runs "
                             f"{', '.join(map(repr, ARCHITECTURES))} GGUF files")
        family = ARCHITECTURES[arch]

        def key(name, default=KeyError):
            return file.get(f"{arch}.{name}", default)

        for name in UNSUPPORTED_KEYS:
            if f"{arch}.{name}" in file.meta:
                raise ValueError(f"{file.path}: metadata {arch}.{name} = {key(name)!r}: silkattn's {arch} "
                                 "has "
                                 "no such option")
        h, d = int(key("attention.head_count")), int(key("embedding_length"))
        h_kv = int(key("attention.head_count_kv", h))
        d_head = int(key("attention.key_length", d // h if h else 0))
        if int(key("attention.value_length", d_head)) != d_head:
            raise ValueError(f"{file.path}: key width {d_head} and value width "
                             f"{key('attention.value_length')} differ: silkattn needs them equal")
        n_layers = int(key("block_count"))
        c = cls(vocab=len(file.get("tokenizer.ggml.tokens")), d=d, n_layers=n_layers, h=h, h_kv=h_kv,
                d_ff=int(key("feed_forward_length")), eps=float(key("attention.layer_norm_rms_epsilon")),
                rope_base=float(key("rope.freq_base", 10000.0)), context_length=int(key("context_length")),
                arch=arch, head_dim=d_head)
        if not h or not h_kv or h % h_kv or d_head % 2 or d_head < 2:
            raise ValueError(f"{file.path}: {h} query heads of {d_head} and {h_kv} K/V heads do not make "
                             "even heads in whole groups")
        rotary = int(key("rope.dimension_count", d_head))
        if rotary != d_head:
            raise ValueError(f"{file.path}: rotary embeddings over {rotary} of {d_head} head dimensions "
                             "(partial rotary) are not supported")
        c = dataclasses.replace(c, **_windows(file, arch, family, c))
        c = dataclasses.replace(c, **_rope_scaling(file, arch, family, c))
        if arch == "gemma3" and n_layers == 62:  # as llama.cpp: Gemma 3 27B scales by d / h, not the head
            c = dataclasses.replace(c, scale=1 / math.sqrt(d / h))
        return c


def _windows(file, arch, family, c):
    """{windows, rope_bases} from <arch>.attention.sliding_window and the architecture's pattern."""
    window = file.get(f"{arch}.attention.sliding_window", None)
    if window is None:
        return {}
    if int(window) < 1:
        raise ValueError(f"{file.path}: {arch}.attention.sliding_window = {window}: a window holds at least "
                         "one position")
    pattern = file.get(f"{arch}.attention.sliding_window_pattern", family.global_every)
    if isinstance(pattern, (list, tuple)):  # per layer: true where the layer is local
        if len(pattern) != c.n_layers:
            raise ValueError(f"{file.path}: {arch}.attention.sliding_window_pattern has {len(pattern)} "
                             f"entries for {c.n_layers} layers")
        local = [bool(p) for p in pattern]
    else:  # every pattern-th layer global (0: none)
        every = int(pattern)
        local = [not every or i % every != every - 1 for i in range(c.n_layers)]
    bases = tuple(family.local_rope_base if is_local and family.local_rope_base else c.rope_base
                  for is_local in local)
    return {"windows": tuple(int(window) if is_local else None for is_local in local), "rope_bases": bases}


def _rope_scaling(file, arch, family, c):
    """{rope_freqs, layer_rope_freqs}: Llama 3's rope_freqs tensor (every layer), and linear rope
    scaling (positions / factor: every frequency divided by factor) on the layers the file's base
    serves (Gemma 3: the global ones)."""
    out, scaling = {}, file.get(f"{arch}.rope.scaling.type", "none")
    if "rope_freqs.weight" in file.tensors:  # Llama 3.1+'s "llama3" rope scaling, as divisors
        shape = file.shape("rope_freqs.weight")
        if shape != (c.d_head // 2,):
            raise ValueError(f"{file.path}: tensor rope_freqs.weight has shape {shape}, rope needs "
                             f"({c.d_head // 2},) (d_head / 2)")
        factors = file.dequantize("rope_freqs.weight")
        if not (np.isfinite(factors).all() and (factors > 0).all()):
            raise ValueError(f"{file.path}: tensor rope_freqs.weight holds values that are not positive "
                             "and finite")
        out["rope_freqs"] = tuple(float(f) for f in factors)
    if scaling in ("none", None):
        return out
    factor = file.get(f"{arch}.rope.scaling.factor", None)
    if scaling != "linear" or "rope_freqs" in out or factor is None or not float(factor) >= 1:
        raise ValueError(f"{file.path}: rope scaling {scaling!r} (factor {factor}) is not supported: "
                         "silkattn "
                         "runs linear scaling by a factor >= 1, without rope_freqs")
    scaled = (float(factor),) * (c.d_head // 2)
    bases = c.rope_bases or (c.rope_base,) * c.n_layers
    local = family.local_rope_base if c.windows else None
    out["layer_rope_freqs"] = tuple(None if local is not None and b == local and w is not None else scaled
                                    for b, w in zip(bases, c.windows or (None,) * c.n_layers))
    return out
