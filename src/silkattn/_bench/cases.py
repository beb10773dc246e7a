"""The benchmark cases: one specification per op, read by `python -m silkattn bench` and by the
pytest-benchmark suite in bench/. A new case or op is one entry in OPS.

A case is a dict ({"op": "attention", "S": 2048, ...}). Its Op names it, counts its FLOPs, builds its
inputs, and builds a Call for each contender: "silkattn" (whichever silkattn backend is current)
and the rivals "numpy" (the reference) and "torch" (PyTorch eager, CPU). A Call's `run` is what is
timed; `result(run())` is the answer as a NumPy array of the reference's shape and dtype, which
the benchmark suite checks against the reference.

This package is also loaded on its own by worker processes (see worker.py), in Pythons where silkattn
may be another version or absent: silkattn and torch are imported only inside the builders.
"""
import numpy as np

from .base import GFLOP, Call, Op, _inference, _rng, _torch

# the two models' cases live beside this module; their helpers are read through it too (bench/, the CLI)
from .bert_case import (  # noqa: F401
    BERT,
    _bert_path,
    bert_cases,
    bert_onnxruntime_encoder,
    bert_sentences,
    onnx_export,
    onnx_export_int8,
    padding_share,
)
from .llm_case import LLM, LLM_READS, bench_threads, export_llm_onnx, llm_bytes_per_token, smollm2_gguf  # noqa: F401

# ---------------------------------------------------------------- attention

def attention_cases(full):
    """One head (S, 64) and eight heads (1, 8, S, 64), causal and not; the quick set keeps the
    float32 cases with S = 512 and 2048 (one head) and S = 512 (eight heads). The full set adds
    the rule cases (attention_rule_cases)."""
    cases = []
    for dtype in ("float32", "float64"):
        for S in (128, 512, 2048, 4096):
            for heads in (0, 8):  # 0: a plain (S, 64) array
                for causal in (False, True):
                    quick = dtype == "float32" and (S == 512 or (S == 2048 and not heads))
                    if full or quick:
                        cases.append(dict(op="attention", S=S, heads=heads, dk=64, causal=causal,
                                          dtype=dtype))
    # one new query against a KV cache of S keys (a decoding step), eight heads
    cases += [_decode(dict(op="attention", S=S, Sq=1, heads=8, dk=64, causal=False, dtype="float32"))
              for S in ((512, 4096) if full else (4096,))]
    return cases + (attention_rule_cases() if full else [])


def _decode(c):
    """A one-query case with kv_bytes: the bytes of K/V cache one call reads (what bounds a decoding
    step: GB/s = kv_bytes / time), also written to `bench --json` with the case."""
    return dict(c, kv_bytes=kv_bytes(c))


def kv_bytes(c):
    """Bytes of the K and V arrays of an attention case (its KV cache, for a decoding step)."""
    return 2 * (c.get("kv_heads") or max(c["heads"], 1)) * c["S"] * c["dk"] * np.dtype(c["dtype"]).itemsize


def alibi_slopes(heads):
    """ALiBi's standard slopes for a power-of-two head count: 2 ** (-8 (h + 1) / heads)."""
    assert heads & (heads - 1) == 0, "ALiBi's closed form is for a power-of-two head count"
    return 2.0 ** (-8.0 * np.arange(1, heads + 1) / heads)


def attention_rule_cases():
    """silkattn.attention's keywords, float32 (--full only: too big for the quick CI run):
    grouped-query attention, prefill (32 query heads on 8 K/V heads, causal) and a decoding step
    (one query after 4095 cached keys, non-causal: the same rule); a sliding window (1024, 0), causal,
    at S = 8192 and 16384 (its cost grows linearly in S); ALiBi (the standard slopes for 8 heads),
    causal; a few new queries (3, 8) after a cache, causal (q_offset = S - Sq). torch takes each
    rule the only way it can: enable_gqa=True; is_causal where its top-left rule is the same; else a
    dense mask, built outside the timed call (a bool (Sq, Sk) one for the window and the few-query
    rows; a float (1, 8, S, S) one for ALiBi: the bias, -inf above the diagonal). They are read
    against the plain cases RULE_BASELINES (the same run: `bench --full --match RULES_MATCH`)."""
    base = dict(op="attention", dk=64, dtype="float32")
    return [
        dict(base, S=2048, heads=32, kv_heads=8, causal=True),
        _decode(dict(base, S=4096, Sq=1, heads=32, kv_heads=8, causal=False)),
        dict(base, S=8192, heads=8, causal=True, window=[1024, 0]),
        dict(base, S=16384, heads=8, causal=True, window=[1024, 0]),
        dict(base, S=2048, heads=8, causal=True, alibi=True),
        dict(base, S=2048, Sq=3, heads=8, causal=True),
        dict(base, S=2048, Sq=8, heads=8, causal=True),
    ]


# the full set's plain cases the rule cases are read against: ALiBi and GQA prefill against the
# plain causal call of their K/V shape; the per-head cost of the 8-head call against the one-head
# one; the GQA decoding step against the 8-head one reading the same 16 MiB of K/V cache
RULE_BASELINES = [dict(op="attention", S=2048, heads=heads, dk=64, causal=causal, dtype="float32")
                  for heads in (0, 8) for causal in (False, True)] + [
    _decode(dict(op="attention", S=4096, Sq=1, heads=8, dk=64, causal=False, dtype="float32"))]
# the --match pattern that selects the rule cases and their baselines (and nothing else) in the full set
RULES_MATCH = (r"kv_heads|window|alibi|vs 2048 keys|attention \((1,8,)?2048,64\)( causal)? float32"
               r"|attention \(1,8,1,64\) vs 4096 keys")


def _q_offset(c):
    """Where the first query sits: a block of Sq new queries comes after S - Sq cached keys, for
    the rules that place queries (causal, window, ALiBi); a non-causal one-query case needs none."""
    positioned = c["causal"] or c.get("window") or c.get("alibi")
    return c["S"] - c["Sq"] if "Sq" in c and positioned else 0


def _rules(c):
    """silkattn.attention's (and the reference's) keywords for case c."""
    kw = dict(causal=c["causal"])
    if c.get("window"):
        kw["window"] = tuple(c["window"])
    if c.get("alibi"):
        kw["alibi_slopes"] = alibi_slopes(c["heads"])
    if _q_offset(c):
        kw["q_offset"] = _q_offset(c)
    return kw


def _attention_shape(c, rows, heads=None):
    heads = heads or c["heads"]
    return (rows, c["dk"]) if not heads else (1, heads, rows, c["dk"])


def _attention_inputs(c):
    rng = _rng()
    kv = c.get("kv_heads") or c["heads"]
    shapes = (_attention_shape(c, c.get("Sq", c["S"])), _attention_shape(c, c["S"], kv),
              _attention_shape(c, c["S"], kv))  # queries, keys, values
    return [rng.standard_normal(shape).astype(c["dtype"]) for shape in shapes]


def _attention_torch_mask(c, dtype):
    """The dense mask that gives torch's SDPA case c's rule, or None where is_causal does: bool
    (Sq, Sk), True where a key is seen; with ALiBi a float (1, H, Sq, Sk) one: the bias, -inf where
    a key is hidden (a 3-D float mask sends SDPA down its math path, a 4-D one does not)."""
    from silkattn import reference as ref
    Sq, Sk, q_offset = c.get("Sq", c["S"]), c["S"], _q_offset(c)
    if not (c.get("window") or c.get("alibi") or q_offset):
        return None
    window = tuple(c["window"]) if c.get("window") else None
    shown = ref.visible(Sq, Sk, q_offset, c["causal"], window)
    if not c.get("alibi"):
        return shown
    bias = ref.alibi(alibi_slopes(c["heads"]), Sq, Sk, q_offset, np.dtype(dtype))
    return np.where(shown, bias, -np.inf).astype(dtype)[None]


def _attention_torch(c, args):
    torch = _torch()
    import torch.nn.functional as F
    # a plain (S, d) input sends SDPA down a slow math path: give it 4-D views, and the answer
    # back in the reference's shape
    t = [torch.from_numpy(a).reshape((1,) * (4 - a.ndim) + a.shape) for a in args]
    mask = _attention_torch_mask(c, args[0].dtype)
    kw = dict(is_causal=c["causal"]) if mask is None else dict(attn_mask=torch.from_numpy(mask))
    if c.get("kv_heads"):
        kw["enable_gqa"] = True
    return Call(_inference(torch, lambda: F.scaled_dot_product_attention(*t, **kw)),
                lambda out: out.numpy().reshape(args[0].shape))


# the reference's scores (and its softmax's temporaries) are query heads x query rows x keys: past
# this many elements, a rule case's reference runs in blocks of query rows (see _blocked_reference)
REFERENCE_BUDGET = 1 << 25


def _attention_reference(c, args):
    from silkattn import reference as ref
    kw = _rules(c)
    if set(kw) == {"causal"} and not c.get("kv_heads"):  # the plain cases, as they always ran
        mask = ref.causal_mask(c["S"]) if c["causal"] else None
        return Call(lambda: ref.attention(*args, mask))
    return Call(lambda: _blocked_reference(ref, *args, **kw))


def _blocked_reference(ref, Q, K, V, causal=False, window=None, alibi_slopes=None, q_offset=0):
    """reference.attention, by blocks of query rows when its scores would pass REFERENCE_BUDGET
    elements, each block against the keys its rule can show: the same answer (a hidden key's
    weight is exactly 0, and every row here sees at least its own position), in bounded memory
    and, with a window, in time linear in S."""
    Sq, Sk = Q.shape[-2], K.shape[-2]
    heads = Q.size // (Sq * Q.shape[-1]) if Sq else 1
    if heads * Sq * Sk <= REFERENCE_BUDGET:
        return ref.attention(Q, K, V, causal=causal, window=window, alibi_slopes=alibi_slopes,
                             q_offset=q_offset)
    left, right = (-1, -1) if window is None else window
    if left < 0:  # every block reads all keys (up to its last query, if causal)
        rows = max(1, REFERENCE_BUDGET // (heads * Sk))
    else:  # blocks of at most left + 1 queries, which reach at most 2 left + 1 keys (causal)
        rows = max(1, min(left + 1, REFERENCE_BUDGET // (heads * min(Sk, 2 * left + 1))))
    out = []
    for r0 in range(0, Sq, rows):
        r1 = min(Sq, r0 + rows)
        first, last = q_offset + r0, q_offset + r1 - 1  # the block's query positions
        lo = max(0, first - left) if left >= 0 else 0
        hi = Sk if not causal and right < 0 else min(Sk, last + 1 if causal else last + right + 1)
        out.append(ref.attention(Q[..., r0:r1, :], K[..., lo:hi, :], V[..., lo:hi, :], causal=causal,
                                 window=window, alibi_slopes=alibi_slopes, q_offset=first - lo))
    return np.concatenate(out, axis=-2)


def _attention_label(c):
    rules = f" kv_heads={c['kv_heads']}" if c.get("kv_heads") else ""
    if c.get("window"):
        rules += f" window=({c['window'][0]},{c['window'][1]})"
    rules += (" alibi" if c.get("alibi") else "") + (" causal" if c["causal"] else "")
    if "Sq" in c:  # a query block against S cached keys
        return f"attention (1,{c['heads']},{c['Sq']},{c['dk']}) vs {c['S']} keys{rules} {c['dtype']}"
    shape = f"({c['S']},{c['dk']})" if not c["heads"] else f"(1,{c['heads']},{c['S']},{c['dk']})"
    return f"attention {shape}{rules} {c['dtype']}"


def _visible_pairs(c):
    """(query, key) pairs case c's rule shows, per head."""
    Sq, Sk = c.get("Sq", c["S"]), c["S"]
    p = _q_offset(c) + np.arange(Sq)
    left, right = c.get("window") or (-1, -1)
    lo = np.maximum(p - left, 0) if left >= 0 else np.zeros_like(p)
    hi = np.full_like(p, Sk - 1)
    if c["causal"]:
        hi = np.minimum(hi, p)
    if right >= 0:
        hi = np.minimum(hi, p + right)
    return int(np.maximum(hi - lo + 1, 0).sum())


def _attention_gflop(c):
    """4 d_k flops per (query, key) pair a head computes: S^2 (half if causal) for the plain cases,
    the pairs the rule shows for a window or a causal block of queries after a cache."""
    Sq, Sk = c.get("Sq", c["S"]), c["S"]
    exact = c.get("window") or (c["causal"] and Sq != Sk)
    pairs = _visible_pairs(c) if exact else Sq * Sk / (1 + c["causal"])
    return 4.0 * pairs * c["dk"] * max(c["heads"], 1) / GFLOP


ATTENTION = Op(
    "attention", attention_cases, label=_attention_label,
    inputs=_attention_inputs,
    silkattn=lambda c, args, sa: Call(lambda: sa.attention(*args, **_rules(c))),
    rivals={"numpy": _attention_reference, "torch": _attention_torch},
    gflop=_attention_gflop,
)


# ---------------------------------------------------------------- attention_backward

def attention_backward_cases(full):
    """Training's attention: (1, 8, S, 64) causal float32, dQ, dK, dV from the forward's out and
    lse (made once, outside the timed call); in the full set only (the quick bench has none)."""
    if not full:
        return []
    return [dict(op="attention_backward", heads=8, S=S, d=64, dtype="float32") for S in (512, 1024)]


def _attention_backward_inputs(c):
    rng = _rng()
    return [rng.standard_normal((1, c["heads"], c["S"], c["d"])).astype(c["dtype"]) for _ in range(4)]


def _flat_grads(grads):
    return np.concatenate([np.asarray(g).ravel() for g in grads])


def _attention_backward_silkattn(c, args, sa):
    Q, K, V, dO = args
    out, lse = sa.attention(Q, K, V, causal=True, return_lse=True)
    return Call(lambda: sa.attention_backward(dO, Q, K, V, out, lse, causal=True), _flat_grads)


def _attention_backward_reference(c, args):
    from silkattn import reference as ref
    Q, K, V, dO = args
    out, lse = ref.attention(Q, K, V, causal=True, return_lse=True)
    return Call(lambda: _flat_grads(ref.attention_backward(dO, Q, K, V, out, lse, causal=True)))


def _attention_backward_torch(c, args):
    torch = _torch()
    import torch.nn.functional as F
    q, k, v = (torch.from_numpy(a).requires_grad_() for a in args[:3])
    do = torch.from_numpy(args[3])
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # torch's CPU flash attention
    return Call(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True),
                lambda grads: _flat_grads(g.numpy() for g in grads))


ATTENTION_BACKWARD = Op(
    "attention_backward", attention_backward_cases,
    label=lambda c: f"attention_backward (1,{c['heads']},{c['S']},{c['d']}) causal {c['dtype']}",
    inputs=_attention_backward_inputs, silkattn=_attention_backward_silkattn,
    rivals={"numpy": _attention_backward_reference, "torch": _attention_backward_torch},
    gflop=lambda c: 5 * 2 * c["heads"] * c["S"] * c["S"] / 2 * c["d"] / GFLOP,
)


# ---------------------------------------------------------------- softmax, layer_norm

def _rows_label(c):
    return f"{c['op']} ({c['rows']},{c['n']}) {c['dtype']}"


def _rows_inputs(c):
    rng = _rng()
    x = rng.standard_normal((c["rows"], c["n"])).astype(c["dtype"])
    if c["op"] == "softmax":
        return [x]
    return [x] + [rng.standard_normal(c["n"]).astype(c["dtype"]) for _ in range(2)]  # g, b


def _softmax_torch(c, args):
    torch = _torch()
    t = torch.from_numpy(args[0])
    return Call(_inference(torch, lambda: torch.softmax(t, -1)), lambda out: out.numpy())


def _layer_norm_torch(c, args):
    torch = _torch()
    import torch.nn.functional as F
    t = [torch.from_numpy(a) for a in args]
    return Call(_inference(torch, lambda: F.layer_norm(t[0], (c["n"],), t[1], t[2], eps=1e-5)),
                lambda out: out.numpy())


def _reference_op(name):
    def build(c, args):
        from silkattn import reference as ref
        return Call(lambda: getattr(ref, name)(*args))
    return build


SOFTMAX = Op(
    "softmax", lambda full: [dict(op="softmax", rows=4096, n=4096, dtype="float32")],
    label=_rows_label, inputs=_rows_inputs,
    silkattn=lambda c, args, sa: Call(lambda: sa.softmax(*args)),
    rivals={"numpy": _reference_op("softmax"), "torch": _softmax_torch},
)

LAYER_NORM = Op(
    "layer_norm", lambda full: [dict(op="layer_norm", rows=8192, n=512, dtype="float32")],
    label=_rows_label, inputs=_rows_inputs,
    silkattn=lambda c, args, sa: Call(lambda: sa.layer_norm(*args)),
    rivals={"numpy": _reference_op("layer_norm"), "torch": _layer_norm_torch},
)


# ---------------------------------------------------------------- the decoder: multi_head, transformer

_PARAMS = {}


def _decoder_inputs(c):
    """The seed-sized decoder's weights (N = 6, d_ff = 4 d, vocab 1000), token ids and activations,
    shared by multi_head and transformer cases of the same size."""
    from silkattn import reference as ref
    key = (c["d"], c["h"], c["S"], c["dtype"])
    if key not in _PARAMS:
        _PARAMS[key] = ref.init_params(1000, d=c["d"], h=c["h"], n_layers=6, d_ff=4 * c["d"], max_len=c["S"],
                                       seed=0, dtype=np.dtype(c["dtype"]))
    return dict(P=_PARAMS[key], ids=_rng().integers(0, 1000, c["S"]),
                X=_rng(1).standard_normal((c["S"], c["d"])).astype(c["dtype"]))


def _decoder_torch(c, a):
    torch = _torch()
    from . import rivals
    T = rivals.tensors(torch, a["P"])
    if c["op"] == "multi_head":
        X, L = torch.from_numpy(a["X"]), T["layers"][0]
        return Call(_inference(torch, lambda: rivals.multi_head(torch, X, *L["attn"], L["h"], True)),
                    lambda out: out.numpy())
    ids = torch.from_numpy(a["ids"])
    return Call(_inference(torch, lambda: rivals.transformer(torch, ids, T)), lambda out: out.numpy())


def _decoder_reference(c, a):
    from silkattn import reference as ref
    if c["op"] == "multi_head":
        L = a["P"]["layers"][0]
        mask = ref.causal_mask(c["S"])
        return Call(lambda: ref.multi_head(a["X"], *L["attn"], L["h"], mask))
    return Call(lambda: ref.transformer(a["ids"], a["P"]))


def _decoder_silkattn(c, a, sa):
    if c["op"] == "multi_head":
        L = a["P"]["layers"][0]
        return Call(lambda: sa.multi_head(a["X"], *L["attn"], L["h"], causal=True))
    return Call(lambda: sa.transformer(a["ids"], a["P"]))


def _decoder_cases(op):
    sizes = {True: (128, 512, 2048), False: (512,)}
    return lambda full: [dict(op=op, S=S, d=512, h=8, dtype="float32") for S in sizes[full]]


MULTI_HEAD = Op(
    "multi_head", _decoder_cases("multi_head"),
    label=lambda c: f"multi_head (1,{c['S']},{c['d']}) h={c['h']} causal {c['dtype']}",
    inputs=_decoder_inputs, silkattn=_decoder_silkattn,
    rivals={"numpy": _decoder_reference, "torch": _decoder_torch},
)

TRANSFORMER = Op(
    "transformer", _decoder_cases("transformer"),
    label=lambda c: f"transformer N=6 d={c['d']} S={c['S']} {c['dtype']}",
    inputs=_decoder_inputs, silkattn=_decoder_silkattn,
    rivals={"numpy": _decoder_reference, "torch": _decoder_torch},
)


# ---------------------------------------------------------------- generation with a KV cache

def generation_cases(full):
    """The seed-sized decoder (vocab 1000) writing 64 tokens after a 256-token prompt, and 1 token
    (the prefill alone, nearly): their difference over 63 is the time of one cached decoding step."""
    if not full:
        return []
    return [dict(op="generate", prompt=256, new=new, d=512, h=8, n_layers=6, vocab=1000, dtype="float32")
            for new in (1, 64)]


def _generation_inputs(c):
    from silkattn import reference as ref
    P = ref.init_params(c["vocab"], d=c["d"], h=c["h"], n_layers=c["n_layers"], d_ff=4 * c["d"],
                        max_len=c["prompt"] + c["new"], seed=0, dtype=np.dtype(c["dtype"]))
    return dict(P=P, prompt=_rng().integers(0, c["vocab"], c["prompt"]))


def bytes_per_token(c):
    """Bytes one cached decoding step reads at the least: every weight once (the tied embedding for
    the logits) and the layers' cached keys and values, at the mean cache length."""
    d, d_ff, L = c["d"], 4 * c["d"], c["n_layers"]
    weights = L * (4 * d * d + 2 * d * d_ff + d_ff + 5 * d) + c["vocab"] * d
    cache = L * 2 * d * (c["prompt"] + c["new"] / 2)
    return (weights + cache) * np.dtype(c["dtype"]).itemsize


def _generation_reference(c, a):  # recomputes the whole forward pass for every new token
    from silkattn import reference as ref
    return Call(lambda: ref.generate(a["prompt"], a["P"], c["new"]))


def _generation_torch(c, a):
    torch = _torch()
    from . import rivals
    T, prompt = rivals.tensors(torch, a["P"]), torch.from_numpy(a["prompt"])
    return Call(_inference(torch, lambda: rivals.generate(torch, prompt, T, c["new"])), np.asarray)


GENERATE = Op(
    "generate", generation_cases,
    label=lambda c: f"generate N={c['n_layers']} d={c['d']} prompt={c['prompt']} new={c['new']} {c['dtype']}",
    inputs=_generation_inputs,
    silkattn=lambda c, a, sa: Call(lambda: sa.generate(a["prompt"], a["P"], c["new"])),
    rivals={"numpy": _generation_reference, "torch": _generation_torch},
)


OPS = {op.name: op for op in (ATTENTION, ATTENTION_BACKWARD, SOFTMAX, LAYER_NORM, MULTI_HEAD, TRANSFORMER,
                              GENERATE, BERT, LLM)}
RIVALS = ("numpy", "torch", "sentence-transformers", "onnxruntime", "transformers", "llama.cpp")
# run in the Python that has torch (and the other libraries: onnxruntime, llama-cpp-python)
TORCH_RIVALS = ("torch", "sentence-transformers", "onnxruntime", "transformers", "llama.cpp")


def all_cases(full=False):
    return [c for op in OPS.values() for c in op.cases(full)]


def case_name(c):
    return OPS[c["op"]].label(c)


def case_gflop(c):
    gflop = OPS[c["op"]].gflop
    return gflop(c) if gflop else None


def build(contender, c, inputs=None):
    """The Call of `contender` ("silkattn" or a rival's name) for case c, or None if it has none."""
    op = OPS[c["op"]]
    inputs = op.inputs(c) if inputs is None else inputs
    if contender == "silkattn":
        import silkattn
        return op.silkattn(c, inputs, silkattn)
    builder = op.rivals.get(contender)
    return builder(c, inputs) if builder else None


# The least cosine of an int8-weight case's embeddings to the float32 weights' reference ones (unit
# rows): silkattn's is tests/test_bert.py's bound; onnxruntime's int8 export reaches 0.986 on the
# bench's batch (docs/benchmarks.md)
INT8_COSINE = {"silkattn": 0.998, "onnxruntime": 0.98}


def int8_embeddings_close(out, c, who="silkattn"):
    """True when `out`, the embeddings of an int8-weight case (which has no reference call), are
    within INT8_COSINE[who] of the reference's with the float32 weights, on every row."""
    expected = build("numpy", dict(c, dtype="float64", weights="float32")).run()
    return out.shape == expected.shape and float((out * expected).sum(-1).min()) >= INT8_COSINE[who]
