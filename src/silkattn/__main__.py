"""python -m silkattn: run the seed-sized decoder on the reference and list the backends."""
import argparse
import time

import numpy as np

import silkattn
from silkattn import reference as ref


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m silkattn", description=__doc__)
    parser.add_argument("--tokens", type=int, default=32, help="prompt length (default 32)")
    parser.add_argument("--vocab", type=int, default=1000, help="vocabulary size (default 1000)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    P = ref.init_params(args.vocab, seed=args.seed)  # the paper's N = 6, d = 512, h = 8, d_ff = 2048
    prompt = np.random.default_rng(args.seed).integers(0, args.vocab, args.tokens)
    start = time.perf_counter()
    logits = ref.transformer(prompt, P)
    elapsed = time.perf_counter() - start
    probs = ref.softmax(logits[-1])
    top = np.argsort(probs)[::-1][:5]
    print(f"silkattn {silkattn.__version__}: decoder N=6, d=512, h=8, d_ff=2048, vocab={args.vocab}, "
          f"{logits.dtype}, random weights (seed {args.seed})")
    print(f"prompt ({args.tokens} tokens): {' '.join(map(str, prompt[:12]))}{' ...' if args.tokens > 12 else ''}")
    print(f"next-token prediction: {top[0]} (p = {probs[top[0]]:.4f}); top 5: "
          + ", ".join(f"{t}:{probs[t]:.4f}" for t in top))
    print(f"reference forward pass: {elapsed * 1e3:.1f} ms")
    print(f"threads: {silkattn.get_num_threads()}")
    print("backends:")
    for name, status in silkattn.backends().items():
        print(f"  {name:8s} {status}")


if __name__ == "__main__":
    main()
