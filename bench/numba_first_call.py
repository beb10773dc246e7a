"""Numba's first call in a new process: with a cold on-disk cache (compiles) and a warm one (loads).

Each run is a fresh process; the cold run gets an empty NUMBA_CACHE_DIR, the warm runs reuse it.
Prints the import time of silkattn.numba and the first float32 causal attention call.

    python bench/numba_first_call.py [--warm 2]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, time
t0 = time.perf_counter()
import numpy as np
import silkattn.numba as nb
t1 = time.perf_counter()
q = np.random.default_rng(0).standard_normal((128, 64)).astype(np.float32)
nb.attention(q, q, q, causal=True)
print(json.dumps([t1 - t0, time.perf_counter() - t1]))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--warm", type=int, default=2, help="warm runs after the cold one")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, NUMBA_CACHE_DIR=cache)
        for i in range(1 + args.warm):
            out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True,
                                 check=True)
            imp, call = json.loads(out.stdout.strip().splitlines()[-1])
            print(f"{'cold' if i == 0 else 'warm'} cache: import {imp:.2f} s, "
                  f"first attention call {call:.2f} s, total {imp + call:.2f} s")


if __name__ == "__main__":
    main()
