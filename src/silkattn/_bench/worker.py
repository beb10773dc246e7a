"""A benchmark worker: times one contender over the given cases in this process, prints JSON.

    python worker.py '{"contender": "cython", "threads": 2, "cases": [...], "min_time": 0.25}'

The driver (silkattn._bench.run) starts one per contender and round: torch ships its own OpenMP
runtime, and two runtimes in one process disturb each other. The worker loads this folder as a
package of its own, so it runs under any Python with numpy: one whose silkattn is another version
(contenders named "base-cython", "base-numba": a baseline install, to compare before and after)
or one without silkattn at all (torch in a venv of its own: the driver passes silkattn's folder).
"""
import importlib
import importlib.util
import json
import os
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
GFLOP = 1e9


def _load_cases():
    spec = importlib.util.spec_from_file_location("_silkattn_bench", os.path.join(HERE, "__init__.py"),
                                                  submodule_search_locations=[HERE])
    package = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = package
    spec.loader.exec_module(package)
    return importlib.import_module("_silkattn_bench.cases")


def _make_importable(silkattn_dir):
    """Let `import silkattn` find the package in silkattn_dir (and nothing else beside it)."""
    try:
        import silkattn  # noqa: F401
    except ImportError:
        link_dir = tempfile.mkdtemp(prefix="silkattn-bench-")
        os.symlink(silkattn_dir, os.path.join(link_dir, "silkattn"))
        sys.path.insert(0, link_dir)


def time_call(fn, min_time=0.25, min_reps=5, max_reps=200):
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


def gemm_rate(dtype):
    """GFLOP/s of numpy's 2048^3 GEMM in this dtype (the ceiling the tables compare against)."""
    a = np.random.default_rng(1).standard_normal((2048, 2048)).astype(dtype)
    return 2 * 2048 ** 3 / time_call(lambda: a @ a, min_time=0.2) / GFLOP


def copy_rate():
    """GB/s numpy reads while copying 256 MiB (the ceiling of a step that streams its weights)."""
    src = np.ones(1 << 26, np.float32)
    dst = np.empty_like(src)
    return src.nbytes / time_call(lambda: np.copyto(dst, src), min_time=0.2) / 1e9


def int8_rate(threads):
    """(G multiply-adds a second, instruction) of the int8 peak on `threads` threads: independent
    chains of the instruction silkattn's integer GEMM runs on this CPU (vpdpbusd, vpmaddwd), no
    loads (silkattn._cy.matmul_int8.int8_peak); the ceiling of the int8 cases."""
    from silkattn._cy import matmul_int8
    return matmul_int8.int8_peak(threads) / 1e9, matmul_int8.INSTRUCTION


def _status_kib(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":"))


def setup(contender, threads):
    """Set the contender's thread count; return the name its calls are built under."""
    name = contender[len("base-"):] if contender.startswith("base-") else contender
    if name in ("torch", "sentence-transformers", "transformers"):
        import torch
        torch.set_num_threads(threads)
        return name
    if name == "numpy":
        return name
    if name in ("onnxruntime", "llama.cpp"):  # they take the count as an argument: cases.bench_threads()
        os.environ["OMP_NUM_THREADS"] = str(threads)  # reads it (the driver sets it too)
        return name
    import silkattn
    silkattn.set_num_threads(threads)
    silkattn.set_backend(name)
    return "silkattn"


def extra_memory(cases, builder, c):
    """Peak resident memory one call adds (result included), in MiB, beyond its inputs: in a fresh
    process, after a small call has loaded whatever the library initialises lazily. Linux: the
    peak (VmHWM) is reset to the current size just before the call."""
    cases.build(builder, dict(c, S=256)).run()
    fn = cases.build(builder, c).run
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_kib("VmRSS")
    fn()
    return (_status_kib("VmHWM") - before) / 1024


def main(spec):
    if spec.get("silkattn_dir"):
        _make_importable(spec["silkattn_dir"])
    cases = _load_cases()
    builder = setup(spec["contender"], spec["threads"])
    if spec.get("memory"):
        print(json.dumps({"memory_mib": extra_memory(cases, builder, spec["cases"][0])}))
        return
    if spec.get("peak"):  # the whole process's peak resident memory over one call (a model's load included)
        call = cases.build(builder, spec["cases"][0])
        if call is not None:
            call.run()
        print(json.dumps({"peak_mib": None if call is None else _status_kib("VmHWM") / 1024}))
        return
    budget = dict(min_time=spec.get("min_time", 0.25), min_reps=3 if spec.get("min_time", 0.25) < 0.1 else 5)
    if builder == "numpy":  # the reference is 2-100x slower: fewer repeats
        budget = dict(min_time=budget["min_time"] / 2, min_reps=3)
    times = []
    for c in spec["cases"]:
        call = cases.build(builder, c)
        times.append(None if call is None else time_call(call.run, **budget))
    result = {"times": times}
    if builder == "numpy":
        result["sgemm"], result["dgemm"] = gemm_rate(np.float32), gemm_rate(np.float64)
        result["copy"] = copy_rate()
    if spec["contender"] == "cython":
        result["int8"], result["int8_instruction"] = int8_rate(spec["threads"])
    print(json.dumps(result))


if __name__ == "__main__":
    if os.path.abspath(sys.path[0]) == HERE:
        del sys.path[0]  # run as a script: this folder's modules are loaded as _silkattn_bench instead
    main(json.loads(sys.argv[1]))
