"""Why silkattn makes idle threads sleep: the seed-sized decoder and one multi_head on 2 threads
with silkattn's defaults against the runtimes' own (OpenMP threads spinning: OMP_WAIT_POLICY=active;
OpenBLAS workers spinning 2^28 cycles after each GEMM: OPENBLAS_THREAD_TIMEOUT=28). Each setting runs
in its own process (both runtimes read their variable once), alternating over rounds; each figure is
the median of 5 calls after a warm-up.

    python bench/idle_threads.py [--S 512] [--rounds 3] [--backend cython]
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
x = np.random.default_rng(1).standard_normal((1, S, 512), dtype=np.float32)
W = P["layers"][0]["attn"]
calls = {"transformer": lambda: silkattn.transformer(ids, P),
         "multi_head": lambda: silkattn.multi_head(x, *W, 8, silkattn.causal_mask(S))}
out = {}
for name, fn in calls.items():
    fn(); fn()
    times = []
    for _ in range(5):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    out[name] = float(np.median(times))
print(json.dumps(out))
"""

SETTINGS = {"silkattn's defaults": {}, "OMP_WAIT_POLICY=active": {"OMP_WAIT_POLICY": "active"},
            "OPENBLAS_THREAD_TIMEOUT=28": {"OPENBLAS_THREAD_TIMEOUT": "28"}}


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--S", type=int, default=512)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="cython")
    args = parser.parse_args()
    seen = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        for name in (list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]):
            env = dict(os.environ, OMP_NUM_THREADS="2", OPENBLAS_NUM_THREADS="2", **SETTINGS[name])
            out = subprocess.run([sys.executable, "-c", CHILD, str(args.S), args.backend], env=env,
                                 capture_output=True, text=True, check=True).stdout
            seen[name].append(json.loads(out.strip().splitlines()[-1]))
    for name, runs in seen.items():
        for op in runs[0]:
            print(f"{name:28s} {op:11s} S={args.S}, 2 threads, {args.backend}: "
                  + ", ".join(f"{run[op] * 1e3:.1f}" for run in runs) + " ms")


if __name__ == "__main__":
    main()
