"""Does a kernel release the GIL? With silkattn.set_num_threads(1), two Python threads computing
attention at once should get close to twice the throughput of one.

    python bench/gil_throughput.py [--S 1024] [--calls 40]
"""
import argparse
import threading
import time

import numpy as np

import silkattn


def throughput(fn, calls, nthreads):
    """Calls per second when `nthreads` Python threads share `calls` calls."""
    barrier = threading.Barrier(nthreads + 1)

    def work():
        barrier.wait()
        for _ in range(calls // nthreads):
            fn()

    threads = [threading.Thread(target=work) for _ in range(nthreads)]
    for t in threads:
        t.start()
    barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join()
    return calls / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--S", type=int, default=1024)
    parser.add_argument("--calls", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    silkattn.set_num_threads(1)
    rng = np.random.default_rng(0)
    Q, K, V = (rng.standard_normal((args.S, 64)).astype(np.float32) for _ in range(3))
    for name, status in silkattn.backends().items():
        if name == "numpy" or not status.startswith("available"):
            continue
        with silkattn.use_backend(name):
            def fn():
                return silkattn.attention(Q, K, V, causal=False)

            fn(), fn()
            ratios = []
            for _ in range(args.rounds):  # alternate one and two threads, keep the median ratio
                one = throughput(fn, args.calls, 1)
                two = throughput(fn, args.calls, 2)
                ratios.append(two / one)
            rounds = ", ".join(f"{r:.2f}" for r in ratios)
            print(f"{name}: attention ({args.S}, 64) float32, 1 kernel thread each: 2 Python threads give "
                  f"{np.median(ratios):.2f}x the throughput of 1 (rounds: {rounds})")


if __name__ == "__main__":
    main()
