"""Training the listing's decoder: its loss and gradients on silkattn's ops, AdamW, clipping by global
norm, and checkpoints.

loss_and_grads runs the forward of models.decoder.transformer over a batch (B, T) of token ids,
keeping what the backward needs (each block's input, its normed inputs, the heads' Q, K, V, the
attention's output and lse, the feed-forward's hidden ReLU output), then the backward, a block at a time
in reverse, with the ops' backward passes (silkattn.ops: attention_backward, layer_norm_backward,
linear_backward, cross_entropy_and_grads through the tied output projection, embedding_backward).
The gradients come back in P's own layout (init_params'), the sinusoidal positions held fixed
(grads["pos"] is None).
"""
import json
import math
import os
import pathlib
import tempfile

import numpy as np

from .. import ops
from .config import DecoderConfig


def _split_heads(A, h, n):  # (B, T, n d) -> (n, B, h, T, d_k), contiguous for the attention kernels
    B, T, nd = A.shape
    return np.ascontiguousarray(A.reshape(B, T, n, h, nd // (n * h)).transpose(2, 0, 3, 1, 4))


def _merge_heads(A):  # (n, B, h, T, d_k) -> (B, T, n d)
    n, B, h, T, dk = A.shape
    return np.ascontiguousarray(A.transpose(1, 3, 0, 2, 4)).reshape(B, T, n * h * dk)


def _check_batch(P, ids, targets):
    config = DecoderConfig.of(P)
    ids, targets = np.asarray(ids), np.asarray(targets)
    for name, a in (("ids", ids), ("targets", targets)):
        if a.dtype.kind not in "iu":
            raise TypeError(f"{name} must be integer token ids, got dtype {a.dtype}")
        if a.ndim != 2:
            raise ValueError(f"{name} must be a (batch, seq) array, got shape {a.shape}")
        if a.size and (a.min() < 0 or a.max() >= config.vocab):
            raise ValueError(f"{name} must lie in [0, vocab = {config.vocab}), got [{a.min()}, {a.max()}]")
    if ids.shape != targets.shape:
        raise ValueError(f"targets must have ids' shape {ids.shape}, got {targets.shape}")
    if not ids.size:
        raise ValueError("ids is empty: the mean loss of no tokens is undefined")
    if ids.shape[1] > config.max_len:
        raise ValueError(f"ids has {ids.shape[1]} positions, more than the model's {config.max_len}")
    return config, ids.astype(np.int64), targets.astype(np.int64)


def _block_forward(X, p):
    """One pre-norm block on X (B, T, d): its output and what its backward reads."""
    h = p["h"]
    Wq, Wk, Wv, Wo = p["attn"]
    W1, b1, W2, b2 = p["ffn"]
    H1 = ops.layer_norm(X, *p["ln1"])
    # Q | K | V in one product (one pass over H1, a 3x wider GEMM), each split into its heads; the
    # joined weight kept for the backward's products
    Wqkv = np.concatenate([Wq, Wk, Wv], axis=1)
    Q, K, V = _split_heads(ops.linear(H1, Wqkv), h, 3)
    A, lse = ops.attention(Q, K, V, causal=True, return_lse=True)
    Oc = _merge_heads(A[None])
    X2 = X + ops.linear(Oc, Wo)
    H2 = ops.layer_norm(X2, *p["ln2"])
    R = ops.linear(H2, W1)
    ops.bias_relu(R, b1, out=R)  # max(H2 W1 + b1, 0), kept: R > 0 is where ReLU passed its gradient
    out = X2 + ops.linear(R, W2, b2)
    return out, (X, H1, Wqkv, Q, K, V, A, lse, Oc, X2, H2, R)


def _block_backward(dX, p, saved):
    """dX through one block (the gradient of its output): the gradient of its input, and its
    parameters' gradients in p's layout."""
    X, H1, Wqkv, Q, K, V, A, lse, Oc, X2, H2, R = saved
    Wo = p["attn"][3]
    W1, b1, W2, b2 = p["ffn"]
    dR, dW2, db2 = ops.linear_backward(dX, R, W2)
    np.multiply(dR, R > 0, out=dR)
    dH2, dW1, db1 = ops.linear_backward(dR, H2, W1)
    del dR
    dX2n, dg2, dbeta2 = ops.layer_norm_backward(dH2, X2, p["ln2"][0])
    dX2 = dX + dX2n
    dOc, dWo, _ = ops.linear_backward(dX2, Oc, Wo)
    dQ, dK, dV = ops.attention_backward(_split_heads(dOc, p["h"], 1)[0], Q, K, V, A, lse, causal=True)
    dH1, dWqkv, _ = ops.linear_backward(_merge_heads(np.stack([dQ, dK, dV])), H1, Wqkv)
    d = X.shape[-1]
    dW = [np.ascontiguousarray(dWqkv[:, i * d:(i + 1) * d]) for i in range(3)]
    dXn, dg1, dbeta1 = ops.layer_norm_backward(dH1, X, p["ln1"][0])
    grads = {"ln1": (dg1, dbeta1), "attn": (*dW, dWo), "h": p["h"], "ln2": (dg2, dbeta2),
             "ffn": (dW1, db1, dW2, db2)}
    return dX2 + dXn, grads


def loss_and_grads(P, ids, targets):
    """(loss, grads): the mean next-token cross-entropy of transformer(ids[b], P) against targets
    (ids and targets (B, T) integers), and its gradient with respect to every parameter, in P's
    layout (grads["pos"] is None: the sinusoidal positions are held fixed)."""
    config, ids, targets = _check_batch(P, ids, targets)
    B, T = ids.shape
    X = P["emb"][ids] + P["pos"][:T]
    saved = []
    for p in P["layers"]:
        X, keep = _block_forward(X, p)
        saved.append(keep)
    loss, dX, dE = ops.cross_entropy_and_grads(X, P["emb"], targets)
    layers = [None] * len(P["layers"])
    for i in reversed(range(len(P["layers"]))):
        dX, layers[i] = _block_backward(dX, P["layers"][i], saved[i])
        saved[i] = None  # free each block's activations as soon as they are used
    dE += ops.embedding_backward(dX, ids, config.vocab)
    return loss, {"emb": dE, "pos": None, "layers": layers}


def parameters(tree):
    """The float arrays of a params (or grads) dict in a fixed order (the head counts skipped)."""
    out = [tree["emb"], tree["pos"]]
    for p in tree["layers"]:
        for key in ("ln1", "attn", "ln2", "ffn"):
            out.extend(p[key])
    return out


def clip_grad_norm(grads, max_norm):
    """Scale grads in place so their global L2 norm is at most max_norm; returns the norm before."""
    if not (isinstance(max_norm, (int, float)) and max_norm > 0):
        raise ValueError(f"max_norm must be a positive number, got {max_norm!r}")
    arrays = [g for g in parameters(grads) if g is not None]
    norm = math.sqrt(sum(float(np.dot(g.ravel(), g.ravel())) for g in arrays))
    if norm > max_norm:
        scale = max_norm / (norm + 1e-6)
        for g in arrays:
            g *= g.dtype.type(scale)
    return norm


class AdamW:
    """AdamW (decoupled weight decay, Loshchilov and Hutter), updating P's arrays in place:
    m = b1 m + (1 - b1) g, v = b2 v + (1 - b2) g^2, p -= lr (m / (1 - b1^t) / (sqrt(v / (1 - b2^t)) + eps)
    + weight_decay p). Decay applies to the matrices (2-D arrays) only, not to gains, biases or the
    fixed positions (which are not updated at all: their gradient is None)."""

    def __init__(self, P, lr=3e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        if not (isinstance(lr, (int, float)) and lr > 0):
            raise ValueError(f"lr must be a positive number, got {lr!r}")
        if len(betas) != 2 or not all(0 <= b < 1 for b in betas):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        if not (eps > 0 and weight_decay >= 0):
            raise ValueError(f"eps must be > 0 and weight_decay >= 0, got {eps!r} and {weight_decay!r}")
        self.params = parameters(P)
        self.lr, self.betas = float(lr), tuple(map(float, betas))
        self.eps, self.weight_decay = eps, weight_decay
        self.t = 0
        self.m = [np.zeros_like(p) for p in self.params]
        self.v = [np.zeros_like(p) for p in self.params]

    def step(self, grads):
        """One update of P's arrays from grads (loss_and_grads' layout); None entries are skipped."""
        self.t += 1
        b1, b2 = self.betas
        c1, c2 = 1 - b1 ** self.t, 1 - b2 ** self.t
        for p, g, m, v in zip(self.params, parameters(grads), self.m, self.v):
            if g is None:
                continue
            if g.shape != p.shape:
                raise ValueError(f"a gradient of shape {g.shape} for a parameter of shape {p.shape}")
            t = p.dtype.type
            tmp = self._scratch(p)  # in place, no temporaries: a few passes over each array
            m *= t(b1)
            np.multiply(g, t(1 - b1), out=tmp)
            m += tmp
            v *= t(b2)
            np.multiply(g, g, out=tmp)
            tmp *= t(1 - b2)
            v += tmp
            if self.weight_decay and p.ndim == 2:
                p *= t(1 - self.lr * self.weight_decay)
            np.sqrt(v, out=tmp)
            tmp *= t(1 / math.sqrt(c2))
            tmp += t(self.eps)
            np.divide(m, tmp, out=tmp)
            tmp *= t(self.lr / c1)
            p -= tmp

    def _scratch(self, p):
        """A buffer of p's size and dtype, kept across parameters and steps."""
        if getattr(self, "_tmp", None) is None or self._tmp.size < p.size or self._tmp.dtype != p.dtype:
            self._tmp = np.empty(max(p.size for p in self.params), p.dtype)
        return self._tmp[:p.size].reshape(p.shape)

    def state(self):
        """The optimizer's state as arrays and numbers (for a checkpoint)."""
        return {"t": self.t, "m": self.m, "v": self.v}

    def load_state(self, state):
        self.t = int(state["t"])
        for dst, src in zip(self.m + self.v, list(state["m"]) + list(state["v"])):
            if dst.shape != src.shape:
                raise ValueError(f"the checkpoint's optimizer state has shape {src.shape}, not {dst.shape}")
            dst[...] = src


# ---------------------------------------------------------------- checkpoints

def save_checkpoint(directory, P, optimizer, meta):
    """P, the optimizer's state and meta (a JSON-able dict) into directory/checkpoint.npz, written to
    a temporary file in the same directory and renamed over the old one: a run killed while writing
    leaves the previous checkpoint whole."""
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    arrays = {f"p{i}": a for i, a in enumerate(parameters(P))}
    state = optimizer.state()
    arrays.update({f"m{i}": a for i, a in enumerate(state["m"])})
    arrays.update({f"v{i}": a for i, a in enumerate(state["v"])})
    config = DecoderConfig.of(P)
    header = dict(meta, t=state["t"], config=dict(vocab=config.vocab, d=config.d, h=config.h,
                                                   n_layers=config.n_layers, d_ff=config.d_ff,
                                                   max_len=config.max_len))
    arrays["meta"] = np.frombuffer(json.dumps(header).encode(), np.uint8)
    fd, tmp = tempfile.mkstemp(prefix=".checkpoint-", suffix=".npz", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # a plain file's mode (mkstemp makes it 0600)
        os.replace(tmp, directory / "checkpoint.npz")
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_checkpoint(directory):
    """(P, optimizer state, meta) from directory/checkpoint.npz (save_checkpoint's)."""
    path = pathlib.Path(directory) / "checkpoint.npz"
    if not path.is_file():
        raise FileNotFoundError(f"no checkpoint in {directory} (expected {path})")
    with np.load(path) as z:
        meta = json.loads(bytes(z["meta"]).decode())
        config = DecoderConfig(**meta["config"])
        P = config.init_params()
        for i, dst in enumerate(parameters(P)):
            src = z[f"p{i}"]
            if src.shape != dst.shape:
                raise ValueError(f"{path}: parameter {i} has shape {src.shape}, its config says {dst.shape}")
            dst[...] = src
        n = len(parameters(P))
        state = {"t": meta["t"], "m": [z[f"m{i}"] for i in range(n)], "v": [z[f"v{i}"] for i in range(n)]}
    return P, state, meta


# ---------------------------------------------------------------- a byte-level model trained on a text

def text_batch(data, batch, seq, seed, step):
    """(ids, targets) (batch, seq) of step `step`: windows of seq + 1 bytes of data at offsets drawn
    from a generator seeded by (seed, step) alone, so a resumed run sees the batches an uninterrupted
    one would have."""
    if len(data) < seq + 1:
        raise ValueError(f"the text has {len(data)} bytes, fewer than seq + 1 = {seq + 1}")
    starts = np.random.default_rng([seed, step]).integers(0, len(data) - seq, batch)
    windows = np.stack([data[s:s + seq + 1] for s in starts]).astype(np.int64)
    return windows[:, :-1], windows[:, 1:]


def train_text(text, out, *, steps, batch=8, seq=256, config=None, lr=3e-4, warmup=20, weight_decay=0.01,
               max_norm=1.0, seed=0, resume=False, every=50, progress=None):
    """Train a byte-level decoder (config: a DecoderConfig with vocab 256; the seed's shape by default)
    on text (bytes) for `steps` steps of batch x seq bytes, AdamW with a linear warmup and gradient
    clipping, a checkpoint in `out` every `every` steps and at the end (save_checkpoint: atomic);
    resume=True continues from out's checkpoint with the same losses as an uninterrupted run.
    progress(step, loss, tokens): called after each step. Returns every step's loss so far."""
    data = np.frombuffer(bytes(text), np.uint8)
    config = config or DecoderConfig(vocab=256, max_len=max(seq, 2048))
    if config.vocab != 256:
        raise ValueError(f"a byte-level model has vocab 256, got {config.vocab}")
    digest = _digest(data)
    meta = dict(step=0, losses=[], seed=seed, lr=lr, warmup=warmup, weight_decay=weight_decay, batch=batch,
                seq=seq, max_norm=max_norm, text_sha256=digest)
    if resume and (pathlib.Path(out) / "checkpoint.npz").is_file():
        P, state, meta = load_checkpoint(out)
        if meta["text_sha256"] != digest or (meta["batch"], meta["seq"], meta["seed"]) != (batch, seq, seed):
            raise ValueError(f"the checkpoint in {out} was trained on another text or with another batch, "
                             "seq or seed: resume with the same ones")
        optimizer = AdamW(P, lr=lr, weight_decay=weight_decay)
        optimizer.load_state(state)
    else:
        P = config.init_params(seed=seed)
        optimizer = AdamW(P, lr=lr, weight_decay=weight_decay)
    losses = list(meta["losses"])
    for step in range(meta["step"], steps):
        ids, targets = text_batch(data, batch, seq, seed, step)
        loss, grads = loss_and_grads(P, ids, targets)
        clip_grad_norm(grads, max_norm)
        optimizer.lr = lr * min(1.0, (step + 1) / max(warmup, 1))
        optimizer.step(grads)
        losses.append(float(loss))
        if progress is not None:
            progress(step, float(loss), ids.size)
        if (step + 1) % every == 0 or step + 1 == steps:
            save_checkpoint(out, P, optimizer, dict(meta, step=step + 1, losses=losses))
    return losses


def _digest(data):
    import hashlib
    return hashlib.sha256(data.tobytes()).hexdigest()


def plot_losses(losses, path):
    """The loss curve as a PNG (matplotlib, the train extra)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(np.arange(1, len(losses) + 1), losses, lw=1)
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats / byte)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
