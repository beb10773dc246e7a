"""A decoding step's product for each GGUF block type, with float32 and with int8 activations: one
row times a read-only (as a file's) 2048 -> 8192 matrix of the type's blocks, a different one each
call, round a set of copies of --mib MiB together (more than the last-level cache), so each call
streams its blocks from memory. Prints the milliseconds a call (medians of --repeats rounds of the
set after a warm-up, the two activations alternating in one process), the blocks' read rate, and
that as a fraction of numpy's read rate of a 1 GiB array on the same threads (the fastest of its
sum, max and dot): what models.llama.load's activations="auto" chooses per type rests on these
figures (docs/models.md).

    python bench/activations_by_kind.py [--threads 1] [--repeats 5] [--mib 1024] [--backend cython]
                                        [--kinds Q4_K,Q6_K]

Unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE for the command alone if they are set.
"""
import argparse
import time

import numpy as np
from gguf_decode import _rates  # bench/ is the script's directory

K, N = 2048, 8192
# the offsets of each kind's float16 scales in its block (set finite: random bytes would make NaNs)
SCALES = {"Q8_0": (0,), "Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q4_K": (0, 2),
          "Q5_K": (0, 2), "Q6_K": (208,)}


def blocks(kind, rng):
    from silkattn import quant
    from silkattn import reference as ref
    weights, nbytes = ref.QUANT_BLOCKS[kind]
    b = rng.integers(0, 256, (N, K // weights, nbytes), dtype=np.uint8)
    for at in SCALES[kind]:
        b[:, :, at:at + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    b = np.ascontiguousarray(b.reshape(N, -1))
    b.flags.writeable = False  # a file's blocks: the int8 products may keep a 16-row layout of them
    return quant.QuantizedMatrix(kind, b, "float32")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5, help="rounds of the set of copies")
    p.add_argument("--mib", type=int, default=1024, help="the copies' MiB together, a type at a time")
    p.add_argument("--backend", default="cython", choices=["cython", "numba"])
    p.add_argument("--kinds", help="a comma-separated subset of the types (default: all)")
    args = p.parse_args()
    import dataclasses

    import silkattn
    from silkattn import quant
    from silkattn._bench import cpu_line
    print(cpu_line())
    silkattn.set_num_threads(args.threads)
    linear = getattr(silkattn, args.backend).linear
    rates = _rates(args.threads)  # gguf_decode's: numpy's read (fastest of sum, max, dot) and copy
    rate = rates["read"]
    print(f"{args.backend}, {args.threads} thread(s); numpy reads a 1 GiB array at {rate:.1f} GB/s"
          + f"; one row x {K} -> {N}, read-only blocks, copies of {args.mib} MiB together; ms a call, "
          f"medians of {args.repeats} rounds")
    print("| type | bytes | float32 ms | GB/s | of read | int8 ms | GB/s | of read | int8 / float32 |")
    print("|---|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, K)).astype(np.float32)
    for kind in args.kinds.split(",") if args.kinds else quant.KINDS:
        one = blocks(kind, rng)
        size = one.blocks.nbytes
        copies = []
        for _ in range(max(1, (args.mib << 20) // size)):
            b = one.blocks.copy()
            b.flags.writeable = False
            copies.append(quant.QuantizedMatrix(kind, b, "float32"))
        W = {"float32": copies, "int8": [dataclasses.replace(c, activations="int8") for c in copies]}
        times = {a: [] for a in W}
        for a in W:
            for c in W[a]:  # warm-up: the int8 products make their 16-row layouts here
                linear(x, c)
        for _ in range(args.repeats):
            for a in W:
                for c in W[a]:
                    t = time.perf_counter()
                    linear(x, c)
                    times[a].append(time.perf_counter() - t)
        ms = {a: float(np.median(t)) * 1e3 for a, t in times.items()}
        gbs = {a: size / ms[a] / 1e6 for a in W}
        print(f"| {kind} | {size / 2**20:.1f} MiB | {ms['float32']:.2f} | {gbs['float32']:.1f} | "
              f"{gbs['float32'] / rate:.0%} | {ms['int8']:.2f} | {gbs['int8']:.1f} | "
              f"{gbs['int8'] / rate:.0%} | {ms['int8'] / ms['float32']:.2f}x |", flush=True)
        del W, copies, one


if __name__ == "__main__":
    main()
