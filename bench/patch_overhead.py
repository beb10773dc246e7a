"""patch() costs nothing measurable: a seed-style NumPy model module, patched, against calling
silkattn.transformer directly (same weights, same tokens), alternating, medians.

    python bench/patch_overhead.py [--S 512] [--rounds 5]
"""
import argparse
import os
import sys
import time

import numpy as np

import silkattn
from silkattn import reference as ref

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
import seed_model  # noqa: E402  (the test suite's module written against the seed listing)


def median_time(fn, reps=5):
    fn()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--S", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    P = ref.init_params(1000, max_len=args.S)
    ids = np.random.default_rng(0).integers(0, 1000, args.S)
    direct, patched = [], []
    for _ in range(args.rounds):
        direct.append(median_time(lambda: silkattn.transformer(ids, P)))
        with silkattn.patched(seed_model):
            patched.append(median_time(lambda: seed_model.transformer(ids, P)))
    d, p = np.median(direct), np.median(patched)
    print(f"transformer S={args.S}, {silkattn.get_num_threads()} thread(s), "
          f"backend {silkattn.get_backend()}: "
          f"direct {d * 1e3:.1f} ms, patched seed-style module {p * 1e3:.1f} ms, ratio {p / d:.3f}")


if __name__ == "__main__":
    main()
