"""Embedding a corpus on Dask workers against one process, at the same total thread count.

2000 sentences of 4 to 60 words (the bench's sentence generator), all-MiniLM-L6-v2, batches of 32:
one process with 2 kernel threads, a LocalCluster of 1 worker process x 2 threads, and one of 2
worker processes x 1 thread (each task gets its share of its worker's threads: silkattn.dask).
Every configuration runs in its own process, rounds alternate, each figure is the median of the
timed runs after a warm-up run (which loads the model and starts the workers).

    python bench/dask_scaling.py [--sentences 2000] [--partitions 16] [--rounds 3]
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

CONFIGS = {"one process, 2 threads": None, "dask 1 worker x 2 threads": (1, 2),
           "dask 2 workers x 1 thread": (2, 1)}


def run(config, n, partitions, reps):
    """Seconds per embedding of the corpus (median of reps, after a warm-up), in this process."""
    from silkattn._bench.cases import bert_sentences
    from silkattn.models import bert
    sentences = bert_sentences(dict(sentences=n, min_words=4, max_words=60, seed=0))
    path = bert.default_path()
    shape = CONFIGS[config]
    if shape is None:
        import silkattn
        silkattn.set_num_threads(2)
        model = bert.load(path)
        call = lambda: model.encode(sentences, batch_size=32)  # noqa: E731
    else:
        import dask.bag as db
        from distributed import Client, LocalCluster

        import silkattn.dask
        cluster = LocalCluster(n_workers=shape[0], threads_per_worker=shape[1], processes=True,
                               host="127.0.0.1", dashboard_address=None)
        client = Client(cluster)
        call = lambda: silkattn.dask.embed(db.from_sequence(sentences, npartitions=partitions),  # noqa: E731
                                           path, batch_size=32).compute()
    call()
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    if shape is not None:
        client.close()
        cluster.close()
    return float(np.median(times))


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sentences", type=int, default=2000)
    parser.add_argument("--partitions", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--reps", type=int, default=2)
    parser.add_argument("--config", help=argparse.SUPPRESS)  # a worker run: one configuration
    args = parser.parse_args()
    if args.config:
        print(json.dumps(run(args.config, args.sentences, args.partitions, args.reps)))
        return
    seen = {name: [] for name in CONFIGS}
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS")}
    for r in range(args.rounds):
        for name in (list(CONFIGS) if r % 2 == 0 else list(CONFIGS)[::-1]):
            command = [sys.executable, __file__, "--config", name, "--sentences", str(args.sentences),
                       "--partitions", str(args.partitions), "--reps", str(args.reps)]
            out = subprocess.run(command, env=dict(env, OMP_NUM_THREADS="2"), capture_output=True, text=True,
                                 check=True)
            seen[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{args.rounds}: {name} done", file=sys.stderr)
    from silkattn._bench import machine
    info = machine()
    base = np.median(seen["one process, 2 threads"])
    print(f"cpu: {info['cpu']} ({info.get('cpu_isa')}); {args.sentences} sentences of 4-60 words, "
          f"{args.partitions} partitions, medians of {args.rounds} rounds x {args.reps} timed runs")
    for name, t in seen.items():
        t = np.median(t)
        rounds = ", ".join(f"{x:.2f}" for x in seen[name])
        print(f"{name:28s} {t:7.2f} s  {args.sentences / t:6.0f} sentences/s  "
              f"{100 * (t / base - 1):+5.1f}% against one process  (rounds: {rounds} s)")


if __name__ == "__main__":
    main()
