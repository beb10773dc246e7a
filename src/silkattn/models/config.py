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
        check.layer(layers[0], "P['layers'][0]")
        h, d_ff = layers[0]["h"], np.shape(layers[0]["ffn"][0])[-1]
        for i, p in enumerate(layers):
            _block_shapes(p, f"P['layers'][{i}]", d, d_ff, "block")
            if p["h"] != h:
                raise ValueError(f"P['layers'][{i}]['h'] is {p['h']}, layer 0's is {h}: "
                                 "one head count per model")
        return cls(vocab, d, h, len(layers), d_ff, max_len)


def _block_shapes(p, name, d, d_ff, kind):
    """Check one block's arrays against the model's sizes (ValueError naming the first misfit)."""
    check.layer(p, name, kind)
    cross = kind == "decoder"
    norms, attentions = ("ln1", "ln2") + ("ln_cross",) * cross, ("attn",) + ("cross",) * cross
    for part in norms + attentions + ("ffn",):
        n = 2 if part in norms else 4
        if len(p[part]) != n:
            raise ValueError(f"{name}[{part!r}] must hold {n} arrays, got {len(p[part])}")
    for part in norms:
        for g, a in zip("gb", p[part]):
            check.vector(a, f"{name}[{part!r}] {g}", d)
    for part in attentions:
        for w, W in zip(("Wq", "Wk", "Wv", "Wo"), p[part]):
            check.matrix(W, f"{name}[{part!r}] {w}", d, d)
    W1, b1, W2, b2 = p["ffn"]
    check.matrix(W1, f"{name}['ffn'] W1", d, d_ff)
    check.vector(b1, f"{name}['ffn'] b1", d_ff)
    check.matrix(W2, f"{name}['ffn'] W2", d_ff, d)
    check.vector(b2, f"{name}['ffn'] b2", d)


@dataclasses.dataclass(frozen=True)
class Seq2SeqConfig:
    """The paper's encoder-decoder: n_layers encoder and decoder blocks, add & norm placed after
    each sublayer ("post", the paper) or before it ("pre", the listing's block)."""

    src_vocab: int
    tgt_vocab: int
    d: int = 512
    h: int = 8
    n_layers: int = 6
    d_ff: int = 2048
    norm: str = "post"
    max_len: int = 2048

    def __post_init__(self):
        for name in ("src_vocab", "tgt_vocab", "d", "h", "n_layers", "d_ff", "max_len"):
            check.count(getattr(self, name), name, minimum=0 if name == "n_layers" else 1)
        check.heads(self.h, self.d)
        check.norm(self.norm)

    def init_params(self, seed=0, dtype=np.float32):
        """Random weights in init_seq2seq_params' layout (sinusoidal positions)."""
        return ref.init_seq2seq_params(**dataclasses.asdict(self), seed=seed, dtype=dtype)

    @classmethod
    def of(cls, P):
        """The config a params dict describes, once every array in it is shown to fit."""
        check.seq2seq(P)
        src, tgt, pos = (np.asarray(P[k]) for k in ("src_emb", "tgt_emb", "pos"))
        if not src.ndim == tgt.ndim == pos.ndim == 2 or not src.shape[1] == tgt.shape[1] == pos.shape[1]:
            raise ValueError("P['src_emb'] (src_vocab, d), P['tgt_emb'] (tgt_vocab, d) and P['pos'] "
                             f"(max_len, d) must share d, got {src.shape}, {tgt.shape} and {pos.shape}")
        enc, dec, d = P["encoder"], P["decoder"], src.shape[1]
        if len(enc) != len(dec):
            raise ValueError(f"P has {len(enc)} encoder and {len(dec)} decoder blocks: "
                             "one n_layers per model")
        if not enc:
            return cls(len(src), len(tgt), d, 1, 0, 1, "post", len(pos))
        check.layer(enc[0], "P['encoder'][0]", "encoder")
        h, norm, d_ff = enc[0]["h"], enc[0]["norm"], np.shape(enc[0]["ffn"][0])[-1]
        for kind, blocks in (("encoder", enc), ("decoder", dec)):
            for i, p in enumerate(blocks):
                name = f"P[{kind!r}][{i}]"
                _block_shapes(p, name, d, d_ff, kind)
                if (p["h"], p["norm"]) != (h, norm):
                    raise ValueError(f"{name} has h={p['h']}, norm={p['norm']!r}, the first block h={h}, "
                                     f"norm={norm!r}: one of each per model")
        return cls(len(src), len(tgt), d, h, len(enc), d_ff, norm, len(pos))
