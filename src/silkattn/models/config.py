"""Model configurations: small dataclasses beside the models, and their parameter helpers.

Parameters stay in the dict layout of silkattn.reference.init_params (what the listing's
transformer(token_ids, P) takes); a config can make such a dict or be read off one.
"""
import dataclasses

import numpy as np

from .. import _checks as check
from .. import reference as ref


@dataclasses.dataclass(frozen=True)
class DecoderConfig:
    """The listing's decoder-only transformer: N pre-norm blocks, tied embeddings, learned or
    sinusoidal positions (init_params gives the paper's sinusoids)."""

    vocab: int
    d: int = 512
    h: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    max_len: int = 2048

    def __post_init__(self):
        for name in ("vocab", "d", "h", "n_layers", "d_ff", "max_len"):
            check.count(getattr(self, name), name, minimum=0 if name == "n_layers" else 1)
        check.heads(self.h, self.d)

    def init_params(self, seed=0, dtype=np.float32):
        """Random weights in init_params' dict layout (fan-in scaled normals, sinusoidal positions)."""
        return ref.init_params(**dataclasses.asdict(self), seed=seed, dtype=dtype)

    @classmethod
    def of(cls, P):
        """The config a params dict describes, once every array in it is shown to fit (ValueError
        naming the first that does not)."""
        for key in ("emb", "pos", "layers"):
            if key not in P:
                raise ValueError(f"P lacks {key!r}: a decoder's parameters are emb, pos, layers "
                                 "(init_params' layout)")
        emb, pos, layers = np.asarray(P["emb"]), np.asarray(P["pos"]), P["layers"]
        if emb.ndim != 2 or pos.ndim != 2 or pos.shape[1] != emb.shape[1]:
            raise ValueError(f"P['emb'] must be (vocab, d) and P['pos'] (max_len, d), "
                             f"got {emb.shape} and {pos.shape}")
        (vocab, d), max_len = emb.shape, len(pos)
        if not layers:
            return cls(vocab, d, 1, 0, 1, max_len)
        for i, p in enumerate(layers):
            check.layer(p, f"P['layers'][{i}]")
        h, d_ff = layers[0]["h"], np.shape(layers[0]["ffn"][0])[-1]
        for i, p in enumerate(layers):
            if p["h"] != h:
                raise ValueError(f"P['layers'][{i}]['h'] is {p['h']}, layer 0's is {h}: "
                                 "one head count per model")
            for part, n in (("ln1", 2), ("attn", 4), ("ln2", 2), ("ffn", 4)):
                if len(p[part]) != n:
                    raise ValueError(f"P['layers'][{i}][{part!r}] must hold {n} arrays, got {len(p[part])}")
            for part in ("ln1", "ln2"):
                for name, a in zip("gb", p[part]):
                    check.vector(a, f"P['layers'][{i}][{part!r}] {name}", d)
            for name, W in zip(("Wq", "Wk", "Wv", "Wo"), p["attn"]):
                check.matrix(W, f"P['layers'][{i}]['attn'] {name}", d, d)
            W1, b1, W2, b2 = p["ffn"]
            check.matrix(W1, f"P['layers'][{i}]['ffn'] W1", d, d_ff)
            check.vector(b1, f"P['layers'][{i}]['ffn'] b1", d_ff)
            check.matrix(W2, f"P['layers'][{i}]['ffn'] W2", d_ff, d)
            check.vector(b2, f"P['layers'][{i}]['ffn'] b2", d)
        return cls(vocab, d, h, len(layers), d_ff, max_len)
