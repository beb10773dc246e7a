"""The rival for the model benchmarks: the reference's decoder as PyTorch eager code (CPU, SDPA).

Same weights as silkattn.reference.init_params, same pre-norm blocks and causal rule; run under
torch.inference_mode. The torch module is passed in (imported only by workers that time torch).
"""


def tensors(torch, P):
    t = torch.from_numpy
    return {"emb": t(P["emb"]), "pos": t(P["pos"]),
            "layers": [{k: (tuple(map(t, v)) if isinstance(v, tuple) else v) for k, v in L.items()}
                       for L in P["layers"]]}


def multi_head(torch, X, Wq, Wk, Wv, Wo, h, causal):  # X: (seq, d)
    seq, d = X.shape

    def split(M):  # (seq, d) -> (1, h, seq, d_k)
        return M.reshape(seq, h, d // h).swapaxes(0, 1)[None]

    heads = torch.nn.functional.scaled_dot_product_attention(split(X @ Wq), split(X @ Wk), split(X @ Wv),
                                                             is_causal=causal)
    return heads[0].swapaxes(0, 1).reshape(seq, d) @ Wo


def block(torch, X, p, causal=True):
    F = torch.nn.functional
    d = X.shape[-1]
    X = X + multi_head(torch, F.layer_norm(X, (d,), *p["ln1"], eps=1e-5), *p["attn"], p["h"], causal)
    W1, b1, W2, b2 = p["ffn"]
    return X + torch.relu(F.layer_norm(X, (d,), *p["ln2"], eps=1e-5) @ W1 + b1) @ W2 + b2


def transformer(torch, token_ids, P):
    X = P["emb"][token_ids] + P["pos"][: len(token_ids)]
    for layer in P["layers"]:
        X = block(torch, X, layer)
    return X @ P["emb"].T


def generate(torch, prompt, T, max_new):
    """Greedy tokens after the prompt with a preallocated KV cache: the prompt in one causal call,
    then one query row per step against the cache (scaled_dot_product_attention, no mask)."""
    F = torch.nn.functional
    layers, d = T["layers"], T["emb"].shape[1]
    cache = torch.empty((len(layers), 2, len(prompt) + max_new, d), dtype=T["emb"].dtype)

    def forward(ids, start):
        n, end = len(ids), start + len(ids)
        X = T["emb"][ids] + T["pos"][start:end]
        for i, p in enumerate(layers):
            (Wq, Wk, Wv, Wo), h = p["attn"], p["h"]
            H = F.layer_norm(X, (d,), *p["ln1"], eps=1e-5)
            torch.matmul(H, Wk, out=cache[i, 0, start:end])
            torch.matmul(H, Wv, out=cache[i, 1, start:end])

            def split(M):  # (rows, d) -> (1, h, rows, d_k)
                return M.reshape(len(M), h, d // h).swapaxes(0, 1)[None]
            K, V = split(cache[i, 0, :end]), split(cache[i, 1, :end])
            A = F.scaled_dot_product_attention(split(H @ Wq), K, V, is_causal=n > 1)
            X = X + A[0].swapaxes(0, 1).reshape(n, d) @ Wo
            W1, b1, W2, b2 = p["ffn"]
            X = X + torch.relu(F.layer_norm(X, (d,), *p["ln2"], eps=1e-5) @ W1 + b1) @ W2 + b2
        return X[-1] @ T["emb"].T

    out, logits = [], forward(prompt, 0)
    for step in range(max_new):
        out.append(int(torch.argmax(logits)))
        if step + 1 < max_new:
            logits = forward(torch.tensor(out[-1:]), len(prompt) + step)
    return out
