"""The rival for the model benchmarks: the reference's decoder as PyTorch eager code (CPU, SDPA).

Same weights as silkattn.reference.init_params, same pre-norm blocks and causal rule; run under
torch.inference_mode. Imported only by benchmark workers that time torch.
"""
import torch
import torch.nn.functional as F


def tensors(P):
    t = lambda a: torch.from_numpy(a)
    return {"emb": t(P["emb"]), "pos": t(P["pos"]),
            "layers": [{k: (tuple(map(t, v)) if isinstance(v, tuple) else v) for k, v in L.items()}
                       for L in P["layers"]]}


def multi_head(X, Wq, Wk, Wv, Wo, h, causal):  # X: (seq, d)
    seq, d = X.shape
    split = lambda M: M.view(seq, h, d // h).transpose(0, 1).unsqueeze(0)  # (1, h, seq, d_k)
    heads = F.scaled_dot_product_attention(split(X @ Wq), split(X @ Wk), split(X @ Wv), is_causal=causal)
    return heads[0].transpose(0, 1).reshape(seq, d) @ Wo


def block(X, p, causal=True):
    d = X.shape[-1]
    X = X + multi_head(F.layer_norm(X, (d,), *p["ln1"], eps=1e-5), *p["attn"], p["h"], causal)
    W1, b1, W2, b2 = p["ffn"]
    return X + torch.relu(F.layer_norm(X, (d,), *p["ln2"], eps=1e-5) @ W1 + b1) @ W2 + b2


def transformer(token_ids, P):
    X = P["emb"][token_ids] + P["pos"][: len(token_ids)]
    for layer in P["layers"]:
        X = block(X, layer)
    return X @ P["emb"].T
