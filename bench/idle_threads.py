"""What silkattn's idle-thread settings cost and buy, on 2 threads, against torch in the same run.

silkattn's defaults: OpenMP threads spin briefly when idle, then sleep (GOMP_SPINCOUNT=3000, see
silkattn/_threads.py), and numpy's OpenBLAS workers sleep 2^18 cycles after a GEMM
(silkattn/_openblas.py). The alternatives: OpenMP threads that sleep at once (passive), spin long
(active) or spin ten times longer, and OpenBLAS's own spin. Every setting runs in its own worker
process of the bench harness (both runtimes read their variables once, at load), alternating over
rounds; figures are medians, and the ratio is to torch timed in the same rounds.

    python bench/idle_threads.py --cases model    # the decoder and multi_head, S = 128, 512, 2048
    python bench/idle_threads.py --cases small    # attention at S = 128 (one head and eight)
    python bench/idle_threads.py --cases decode   # generation with the KV cache, one-query attention
"""
import argparse
import os
import sys

import numpy as np

from silkattn import _bench

SETTINGS = {"defaults": {}, "OMP_WAIT_POLICY=passive": {"OMP_WAIT_POLICY": "passive"},
            "OMP_WAIT_POLICY=active": {"OMP_WAIT_POLICY": "active"},
            "GOMP_SPINCOUNT=30000": {"GOMP_SPINCOUNT": "30000"},
            "OPENBLAS_THREAD_TIMEOUT=28": {"OPENBLAS_THREAD_TIMEOUT": "28"}}
CASES = {"model": lambda c: c["op"] in ("multi_head", "transformer"),
         "small": lambda c: c["op"] == "attention" and c["S"] == 128,
         "decode": lambda c: c["op"] == "generate" or c.get("Sq") == 1}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cases", choices=tuple(CASES), default="model")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--backend", default="cython")
    parser.add_argument("--torch-python", default=sys.executable, help="a python with torch, if not this one")
    parser.add_argument("--settings", default=",".join(SETTINGS),
                        help="comma-separated names from: " + ", ".join(SETTINGS))
    args = parser.parse_args()
    cases = [c for c in _bench.all_cases(full=True) if CASES[args.cases](c)]
    runs = [(name, args.backend, SETTINGS[name])
            for name in args.settings.split(",")] + [("torch", "torch", {})]
    seen = {name: [] for name, _, _ in runs}
    base = dict(os.environ)
    try:
        for r in range(args.rounds):
            for name, contender, env in (runs if r % 2 == 0 else runs[::-1]):
                os.environ.clear()
                os.environ.update(base, **env)
                spec = dict(contender=contender, threads=2, cases=cases, min_time=0.25)
                python = args.torch_python if contender == "torch" else sys.executable
                seen[name].append(_bench._run_worker(python, spec)["times"])
                print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr)
    finally:
        os.environ.clear()
        os.environ.update(base)
    med = {name: np.median(np.array(t), axis=0) for name, t in seen.items()}
    info = _bench.machine()
    print(f"cpu: {info['cpu']} ({info.get('cpu_isa')}); 2 threads, {args.backend}; ms (ratio to torch), "
          f"medians of {args.rounds} rounds")
    print(f"{'case':42s}" + "".join(f"{name:>28s}" for name in med))
    for i, c in enumerate(cases):
        cells = [f"{med[name][i] * 1e3:.3f} ({med[name][i] / med['torch'][i]:.2f})" for name in med]
        print(f"{_bench.case_name(c):42s}" + "".join(f"{cell:>28s}" for cell in cells))


if __name__ == "__main__":
    main()
