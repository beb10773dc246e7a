"""Side-by-side timing of silkattn's kernels against the NumPy reference and PyTorch.

Every contender runs in its own worker process (torch ships its own OpenMP runtime; two runtimes
in one process disturb each other), all contenders for one thread count alternate over several
rounds, and each case is timed after a warm-up as the median of repeated calls. A case's figure
is the median over rounds. Ratios are silkattn time / rival time from the same run.
"""
import os
import sys

if __name__ == "__main__" and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
    del sys.path[0]  # run as a worker script: this folder's numba/ and cython.py must not shadow the real ones

import json
import subprocess
import time

import numpy as np

GFLOP = 1e9


def attention_cases(full=True):
    """One head (S, 64) and eight heads (1, 8, S, 64), causal and not; the quick set keeps the
    float32 cases with S = 512 and 2048 (one head) and S = 512 (eight heads)."""
    cases = []
    for dtype in ("float32", "float64"):
        for S in (128, 512, 2048, 4096):
            for heads in (0, 8):  # 0: a plain (S, 64) array
                for causal in (False, True):
                    quick = dtype == "float32" and (S == 512 or (S == 2048 and not heads))
                    if full or quick:
                        cases.append(dict(op="attention", S=S, heads=heads, dk=64, causal=causal, dtype=dtype))
    return cases


def model_cases(full=True):
    """The seed-sized decoder (N = 6, d = 512, h = 8, d_ff = 2048, vocab 1000) and one multi_head."""
    Ss = (128, 512, 2048) if full else (512,)
    return ([dict(op="multi_head", S=S, d=512, h=8, dtype="float32") for S in Ss]
            + [dict(op="transformer", S=S, d=512, h=8, dtype="float32") for S in Ss])


def row_cases():
    return [dict(op="softmax", rows=4096, n=4096, dtype="float32"),
            dict(op="layer_norm", rows=8192, n=512, dtype="float32")]


def case_name(c):
    if c["op"] == "multi_head":
        return f"multi_head (1,{c['S']},{c['d']}) h={c['h']} causal {c['dtype']}"
    if c["op"] == "transformer":
        return f"transformer N=6 d={c['d']} S={c['S']} {c['dtype']}"
    if c["op"] == "attention":
        shape = f"({c['S']},{c['dk']})" if not c["heads"] else f"(1,{c['heads']},{c['S']},{c['dk']})"
        return f"attention {shape}{' causal' if c['causal'] else ''} {c['dtype']}"
    return f"{c['op']} ({c['rows']},{c['n']}) {c['dtype']}"


def case_gflop(c):
    if c["op"] != "attention":
        return None
    flop = 4.0 * c["S"] * c["S"] * c["dk"] * max(c["heads"], 1)
    return flop / 2 / GFLOP if c["causal"] else flop / GFLOP


# ---------------------------------------------------------------- worker side (one process each)

def _inputs(c):
    rng = np.random.default_rng(0)
    dt = np.dtype(c["dtype"])
    if c["op"] == "attention":
        shape = (c["S"], c["dk"]) if not c["heads"] else (1, c["heads"], c["S"], c["dk"])
        return [rng.standard_normal(shape).astype(dt) for _ in range(3)]
    x = rng.standard_normal((c["rows"], c["n"])).astype(dt)
    if c["op"] == "softmax":
        return [x]
    return [x, rng.standard_normal(c["n"]).astype(dt), rng.standard_normal(c["n"]).astype(dt)]


def _sibling(name):
    """A module of this package loaded from its file: the torch worker may run in another Python
    where silkattn is not installed (reference.py and _torch_rival.py need only numpy and torch)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"_silkattn_{name}", os.path.join(os.path.dirname(__file__), f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_PARAMS = {}


def _model_callable(contender, c):
    ref = _sibling("reference")
    key = (c["d"], c["h"], c["S"], c["dtype"])
    if key not in _PARAMS:  # the same weights for multi_head and the transformer
        _PARAMS[key] = ref.init_params(1000, d=c["d"], h=c["h"], n_layers=6, d_ff=4 * c["d"], max_len=c["S"],
                                       seed=0, dtype=np.dtype(c["dtype"]))
    P = _PARAMS[key]
    ids = np.random.default_rng(0).integers(0, 1000, c["S"])
    X = np.random.default_rng(1).standard_normal((c["S"], c["d"])).astype(c["dtype"])
    L = P["layers"][0]
    if contender == "torch":
        import torch
        tr = _sibling("_torch_rival")
        T = tr.tensors(P)
        tX, tL, tids = torch.from_numpy(X), T["layers"][0], torch.from_numpy(ids)

        def run(fn):
            def call():
                with torch.inference_mode():
                    return fn()
            return call
        if c["op"] == "multi_head":
            return run(lambda: tr.multi_head(tX, *tL["attn"], tL["h"], True))
        return run(lambda: tr.transformer(tids, T))
    if contender == "numpy":
        mask = ref.causal_mask(c["S"])
        if c["op"] == "multi_head":
            return lambda: ref.multi_head(X, *L["attn"], L["h"], mask)
        return lambda: ref.transformer(ids, P)
    import silkattn
    silkattn.set_backend(contender)
    if c["op"] == "multi_head":
        return lambda: silkattn.multi_head(X, *L["attn"], L["h"], causal=True)
    return lambda: silkattn.transformer(ids, P)


def _callable(contender, c):
    if c["op"] in ("multi_head", "transformer"):
        return _model_callable(contender, c)
    args = _inputs(c)
    if contender == "torch":
        import torch
        import torch.nn.functional as F
        t = [torch.from_numpy(a) for a in args]
        if c["op"] == "attention":  # a plain (S, d) input takes SDPA's slow math path: give it 4-D views
            t = [x.reshape((1,) * (4 - x.dim()) + tuple(x.shape)) for x in t]
            return lambda: F.scaled_dot_product_attention(*t, is_causal=c["causal"])
        if c["op"] == "softmax":
            return lambda: torch.softmax(t[0], -1)
        return lambda: F.layer_norm(t[0], (c["n"],), t[1], t[2], eps=1e-5)
    if contender == "numpy":
        from silkattn import reference as mod
    else:
        import importlib
        mod = importlib.import_module(f"silkattn.{contender}")
    if c["op"] == "attention":
        if contender == "numpy":
            mask = mod.causal_mask(c["S"]) if c["causal"] else None
            return lambda: mod.attention(*args, mask)
        return lambda: mod.attention(*args, causal=c["causal"])
    return lambda: getattr(mod, c["op"])(*args)


def _time(fn, min_time=0.25, min_reps=5, max_reps=200):
    """Median seconds per call after a warm-up of at least min(0.1 s, min_time) (the first calls
    spin threads up and fill caches)."""
    start = time.perf_counter()
    fn()
    while time.perf_counter() - start < min(0.1, min_time):
        fn()
    times, start = [], time.perf_counter()
    while len(times) < min_reps or (time.perf_counter() - start < min_time and len(times) < max_reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _gemm_rate(dtype):
    a = np.random.default_rng(1).standard_normal((2048, 2048)).astype(dtype)
    return 2 * 2048 ** 3 / _time(lambda: a @ a, min_time=0.2) / GFLOP


def _status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def _extra_memory(contender, c):
    """Peak resident memory the call adds (result included), in MiB, beyond its inputs: one call in
    a fresh process, after a small call has loaded whatever the library initialises lazily. Linux:
    the peak (VmHWM) is reset to the current size just before the call."""
    small = dict(c, S=256)
    _callable(contender, small)()
    fn = _callable(contender, c)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) / 1024


def worker(spec):
    """Run one contender over the given cases in this process; print JSON results on stdout."""
    contender, threads = spec["contender"], spec["threads"]
    if contender == "torch":
        import torch
        torch.set_num_threads(threads)
    elif contender != "numpy":
        import silkattn
        silkattn.set_num_threads(threads)
    if spec.get("memory"):
        print(json.dumps({"memory_mib": _extra_memory(contender, spec["cases"][0])}))
        return
    quick = spec.get("min_time", 0.25) < 0.1
    budget = dict(min_time=spec.get("min_time", 0.25), min_reps=3 if quick else 5)
    if contender == "numpy":  # the reference is 2-100x slower: fewer repeats
        budget = dict(min_time=budget["min_time"] / 2, min_reps=3)
    result = {"times": [_time(_callable(contender, c), **budget) for c in spec["cases"]]}
    if contender == "numpy":
        result["sgemm"], result["dgemm"] = _gemm_rate(np.float32), _gemm_rate(np.float64)
    print(json.dumps(result))


# ---------------------------------------------------------------- driver side

def _run_worker(python, spec):
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), OPENBLAS_NUM_THREADS=str(spec["threads"]))
    if spec.get("memory"):  # a fixed mmap threshold: freed blocks go back to the OS, so RSS shows new memory
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    proc = subprocess.run([python, os.path.abspath(__file__), json.dumps(spec)],  # needs no silkattn for torch
                          env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{spec['contender']} worker failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def torch_available(python):
    try:
        return subprocess.run([python, "-c", "import torch"], capture_output=True).returncode == 0
    except OSError:  # no such interpreter
        return False


def run(cases, contenders, threads_list, rounds=3, pythons=None, progress=None, min_time=0.25):
    """{threads: {contender: [median seconds per case]}, plus gemm rates} over alternating rounds.

    pythons maps a contender to the interpreter that runs it (default: this one)."""
    pythons = pythons or {}
    results = {}
    total, done = len(threads_list) * rounds * len(contenders), 0
    for threads in threads_list:
        per_round = {name: [] for name in contenders}
        gemm = []
        for r in range(rounds):
            order = contenders if r % 2 == 0 else contenders[::-1]
            for name in order:
                out = _run_worker(pythons.get(name, sys.executable), dict(contender=name, threads=threads, cases=cases, min_time=min_time))
                per_round[name].append(out["times"])
                if "sgemm" in out:
                    gemm.append((out["sgemm"], out["dgemm"]))
                done += 1
                if progress:
                    progress(done, total, f"{threads} thread(s), round {r + 1}/{rounds}, {name}")
        results[threads] = {name: np.median(np.array(t), axis=0).tolist() for name, t in per_round.items()}
        if gemm:
            results[threads]["sgemm"] = float(np.median([g[0] for g in gemm]))
            results[threads]["dgemm"] = float(np.median([g[1] for g in gemm]))
    return results


MEMORY_CASE = dict(op="attention", S=4096, heads=0, dk=64, causal=False, dtype="float32")


def memory(contenders, pythons=None, case=MEMORY_CASE):
    """{contender: extra MiB} for one attention call, each in its own fresh process."""
    pythons = pythons or {}
    return {name: _run_worker(pythons.get(name, sys.executable),
                              dict(contender=name, threads=1, cases=[case], memory=True))["memory_mib"]
            for name in contenders}


def table(cases, results, contenders, ours=("cython",)):
    """Rows: case, threads, each contender's ms, GFLOP/s of ours, ratio to torch, speed-up over numpy."""
    lines = []
    head = f"{'case':44s} {'thr':>3s} " + " ".join(f"{n + ' ms':>11s}" for n in contenders)
    for name in ours:
        head += f" {name[:6] + ' GF/s':>12s}"
        if "torch" in contenders:
            head += f" {name[:6] + '/torch':>12s}"
        if "numpy" in contenders:
            head += f" {'x vs numpy':>10s}"
    lines.append(head)
    for threads, res in results.items():
        lines.append(f"-- {threads} thread(s): numpy sgemm {res.get('sgemm', float('nan')):.0f} GFLOP/s, "
                     f"dgemm {res.get('dgemm', float('nan')):.0f} GFLOP/s (the ceiling)")
        for i, c in enumerate(cases):
            row = f"{case_name(c):44s} {threads:3d} " + " ".join(f"{res[n][i] * 1e3:11.3f}" for n in contenders)
            for name in ours:
                g = case_gflop(c)
                row += f" {g / res[name][i]:12.1f}" if g else f" {'':>12s}"
                if "torch" in contenders:
                    row += f" {res[name][i] / res['torch'][i]:12.2f}"
                if "numpy" in contenders:
                    row += f" {res['numpy'][i] / res[name][i]:10.1f}"
            lines.append(row)
    return "\n".join(lines)


if __name__ == "__main__":
    worker(json.loads(sys.argv[1]))


def scaling(cases, results, ours):
    """Speed-up from 1 to 2 threads for each of our backends (attention cases only)."""
    if 1 not in results or 2 not in results:
        return ""
    lines = [f"{'2-thread speed-up':44s} " + " ".join(f"{n:>10s}" for n in ours)]
    for i, c in enumerate(cases):
        if c["op"] == "attention":
            lines.append(f"{case_name(c):44s} " + " ".join(f"{results[1][n][i] / results[2][n][i]:10.2f}" for n in ours))
    return "\n".join(lines)


def machine():
    """CPU, cores and library versions, for the table's header and the JSON."""
    import platform
    info = {"python": platform.python_version(), "numpy": np.__version__, "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        info["cpu"] = platform.processor() or platform.machine()
    for name in ("silkattn", "numba", "torch"):
        try:
            module = __import__(name)
            info[name] = module.__version__
        except ImportError:
            pass
    try:
        from silkattn import cython as cy
        info["silkattn_isa"] = cy.ISA
    except ImportError:
        pass
    return info


def plot(cases, results, contenders, path):
    """GFLOP/s of one-head float32 attention against S, a line per contender, causal and not."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    threads = max(results)
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
    for ax, causal in zip(axes, (False, True)):
        idx = [i for i, c in enumerate(cases) if c["op"] == "attention" and not c["heads"]
               and c["causal"] == causal and c["dtype"] == "float32"]
        S = [cases[i]["S"] for i in idx]
        for name in contenders:
            ax.plot(S, [case_gflop(cases[i]) / results[threads][name][i] for i in idx], marker="o", label=name)
        if "sgemm" in results[threads]:
            ax.axhline(results[threads]["sgemm"], color="grey", linestyle="--", label="numpy sgemm (ceiling)")
        ax.set_xscale("log", base=2)
        ax.set_xticks(S, [str(s) for s in S])
        ax.set_xlabel("sequence length S (queries = keys)")
        ax.set_title(f"attention (S, 64) float32, {'causal' if causal else 'no mask'}, {threads} thread(s)")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("GFLOP/s (4 S^2 d_k per head, half if causal)")
    axes[0].legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
