"""Why silkattn's OpenMP threads wait passively: the seed-sized decoder on 2 threads with
OMP_WAIT_POLICY=active against passive, each run in its own process (libgomp reads the variable
once, at load), alternating, medians of 5 calls after a warm-up.

    python bench/wait_policy.py [--S 512] [--rounds 3] [--backend cython]
"""
import argparse
import json
import os
import subprocess
import sys

CHILD = """
import json, sys, time
import numpy as np
import silkattn
from silkattn import reference as ref
S, backend = int(sys.argv[1]), sys.argv[2]
silkattn.set_num_threads(2)
silkattn.set_backend(backend)
P = ref.init_params(1000, max_len=S)
ids = np.random.default_rng(0).integers(0, 1000, S)
silkattn.transformer(ids, P); silkattn.transformer(ids, P)
times = []
for _ in range(5):
    t = time.perf_counter(); silkattn.transformer(ids, P); times.append(time.perf_counter() - t)
print(json.dumps(float(np.median(times))))
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--S", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="cython")
    args = parser.parse_args()
    seen = {"active": [], "passive": []}
    for _ in range(args.rounds):
        for policy in seen:
            env = dict(os.environ, OMP_WAIT_POLICY=policy, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2")
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.S), args.backend], env=env,
                                 capture_output=True, text=True, check=True).stdout
            seen[policy].append(json.loads(out.strip().splitlines()[-1]) * 1e3)
    for policy, ms in seen.items():
        print(f"OMP_WAIT_POLICY={policy:8s} transformer S={args.S}, 2 threads, {args.backend}: "
              + ", ".join(f"{t:.0f}" for t in ms) + " ms")


if __name__ == "__main__":
    main()
