"""Training against PyTorch eager, each contender in its own process, float32:

  step       one training step of the listing's decoder (loss, gradients, clipping to norm 1, AdamW),
             N = 6, d = 512, h = 8, d_ff = 2048, byte vocabulary, batch 8 x 256 tokens:
             silkattn.models.train against the same model in torch (autograd, F.layer_norm,
             F.scaled_dot_product_attention(is_causal=True), torch.optim.AdamW with the same groups:
             decay on the matrices only); the same initial weights and batch (written by this
             process to a file both read); the first step's loss printed by both
  attention  attention_backward (1, 8, 2048, 64) causal against torch's CPU flash-attention backward
             (autograd.grad through scaled_dot_product_attention); both gradients compared

Contenders: silkattn (its default backend), the NumPy reference (silkattn's numpy backend: every
backward op the reference's; 2 runs at most) and torch. silkattn's answer is checked against the
reference's before any figure is printed (the first loss; the gradients within TOL_GRAD).

Each worker times --repeats runs after a warm-up (medians, and CPU time over wall time), and reports
its RSS before the first step (the model and the optimizer made, no step run) and the peak RSS from
there on (the kernel's VmHWM, reset at that point): what a step adds is their difference. numpy's
sgemm is timed in silkattn's process, on as many threads, as the physical rate the products are
quoted against.

    python bench/train_step.py [--threads 1,2] [--repeats 5] [--python PY] [--case step,attention]

--python: the interpreter with torch (default: this one). Unset OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE
for the command alone if they are set (this prints them).
"""
import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time

import numpy as np

CONFIG = dict(vocab=256, d=512, h=8, n_layers=6, d_ff=2048, max_len=256)
BATCH, SEQ = 8, 256
ATTN = (1, 8, 2048, 64)


def _rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _reset_peak():
    """The RSS right now, the kernel's record of the process's peak RSS (VmHWM) reset to it, so that
    _peak_mb measures what follows alone (not an import's or a file load's transient before)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss_mb()


def _peak_mb():
    """The peak RSS since _reset_peak (VmHWM), or the process's (getrusage) where /proc has none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _median_times(fn, repeats, out=None):
    """(median wall seconds, the runs) of fn after a warm-up; out["cpu_per_wall"]: the median of each
    run's process CPU time over its wall time (about 1 on one busy core, about 2 on two)."""
    fn()  # warm-up (compilation, first-touch of the optimizer state)
    times, cpu = [], []
    for _ in range(repeats):
        start, start_cpu = time.perf_counter(), time.process_time()
        fn()
        times.append(time.perf_counter() - start)
        cpu.append((time.process_time() - start_cpu) / times[-1])
    if out is not None:
        out["cpu_per_wall"] = float(np.median(cpu))
    return float(np.median(times)), [round(t, 4) for t in times]


def step_flops():
    """Multiply-adds x 2 of one step's products: forward, and twice its products backward (dX and dW),
    attention's backward 5 products against its forward's 2 (the causal half of S each)."""
    c = CONFIG
    tokens, d, f = BATCH * SEQ, c["d"], c["d_ff"]
    linear = c["n_layers"] * (4 * d * d + 2 * d * f) * tokens + c["vocab"] * d * tokens
    attention = c["n_layers"] * 2 * BATCH * SEQ * SEQ / 2 * d
    return 2 * (3 * linear + (2 + 5) * attention)


def worker_silkattn(case, data, threads, repeats, backend=None):
    """silkattn's default backend, or backend "numpy": the NumPy reference behind the same checks
    (every backward op then runs silkattn.reference's)."""
    import silkattn
    from silkattn.models import train
    from silkattn.models.config import DecoderConfig
    if backend:
        silkattn.set_backend(backend)
    silkattn.set_num_threads(threads)
    out = {"backend": silkattn.get_backend()}
    z = np.load(data)
    if case == "step":
        P = DecoderConfig(**CONFIG).init_params()
        for dst, i in zip(train.parameters(P), range(len(train.parameters(P)))):
            dst[...] = z[f"p{i}"]
        ids, targets = z["ids"], z["targets"]
        opt = train.AdamW(P, lr=3e-4, weight_decay=0.01)
        out["rss_before_mb"] = _reset_peak()
        losses = []

        def step():
            loss, grads = train.loss_and_grads(P, ids, targets)
            train.clip_grad_norm(grads, 1.0)
            opt.step(grads)
            losses.append(loss)
        out["median_s"], out["times"] = _median_times(step, repeats, out)
        out["first_loss"] = float(losses[0])
    else:
        Q, K, V, dO = (z[n] for n in ("q", "k", "v", "do"))
        out_, lse = silkattn.attention(Q, K, V, causal=True, return_lse=True)
        out["rss_before_mb"] = _reset_peak()
        out["forward_s"] = _median_times(lambda: silkattn.attention(Q, K, V, causal=True, return_lse=True),
                                         repeats)[0]
        out["median_s"], out["times"] = _median_times(
            lambda: silkattn.attention_backward(dO, Q, K, V, out_, lse, causal=True), repeats, out)
        grads = silkattn.attention_backward(dO, Q, K, V, out_, lse, causal=True)
        np.savez(data + f".{backend or 'silkattn'}.npz", *grads)
    out["peak_mb"] = _peak_mb()  # before the sgemm's arrays
    from silkattn import _blas
    from silkattn._bench.worker import gemm_rate
    with _blas.threads(threads):  # numpy's BLAS on the contender's threads
        out["sgemm_gflops"] = gemm_rate(np.float32)
    return out


def worker_torch(case, data, threads, repeats):
    import torch
    import torch.nn.functional as F
    torch.set_num_threads(threads)
    out = {"torch": torch.__version__}
    z = np.load(data)
    if case == "step":
        n = len([k for k in z.files if k.startswith("p")])
        params = [torch.tensor(z[f"p{i}"]) for i in range(n)]
        emb, pos, rest = params[0].requires_grad_(), params[1], params[2:]
        layers = [rest[i * 12:(i + 1) * 12] for i in range(CONFIG["n_layers"])]
        for p in rest:
            p.requires_grad_()
        trained = [emb] + rest
        opt = torch.optim.AdamW([{"params": [p for p in trained if p.ndim == 2], "weight_decay": 0.01},
                                 {"params": [p for p in trained if p.ndim < 2], "weight_decay": 0.0}],
                                lr=3e-4, betas=(0.9, 0.999), eps=1e-8)
        ids, targets = torch.tensor(z["ids"]), torch.tensor(z["targets"])
        B, T = ids.shape
        d, h = CONFIG["d"], CONFIG["h"]
        out["rss_before_mb"] = _reset_peak()
        losses = []

        def heads(A):
            return A.view(B, T, h, d // h).transpose(1, 2)

        def step():
            X = emb[ids] + pos[:T]
            for g1, b1, Wq, Wk, Wv, Wo, g2, b2, W1, c1, W2, c2 in layers:
                H = F.layer_norm(X, (d,), g1, b1, eps=1e-5)
                A = F.scaled_dot_product_attention(heads(H @ Wq), heads(H @ Wk), heads(H @ Wv),
                                                   is_causal=True)
                X = X + A.transpose(1, 2).reshape(B, T, d) @ Wo
                H = F.layer_norm(X, (d,), g2, b2, eps=1e-5)
                X = X + torch.relu(H @ W1 + c1) @ W2 + c2
            loss = F.cross_entropy((X @ emb.T).view(-1, CONFIG["vocab"]), targets.view(-1))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(trained, 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        out["median_s"], out["times"] = _median_times(step, repeats, out)
        out["first_loss"] = losses[0]
    else:
        q, k, v = (torch.tensor(z[n], requires_grad=True) for n in ("q", "k", "v"))
        do = torch.tensor(z["do"])
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out["rss_before_mb"] = _reset_peak()
        with torch.no_grad():
            out["forward_s"] = _median_times(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                                             repeats)[0]
        out["median_s"], out["times"] = _median_times(
            lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True), repeats, out)
        grads = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
        np.savez(data + ".torch.npz", *[g.numpy() for g in grads])
    out["peak_mb"] = _peak_mb()
    return out


def write_inputs(case, folder):
    """The contenders' shared inputs: the step's initial weights (silkattn's init_params) and batch
    (the interpreter's own documentation, bytes), or attention's Q, K, V, dO."""
    path = os.path.join(folder, f"{case}.npz")
    if case == "step":
        from pydoc_data import topics

        from silkattn.models import train
        from silkattn.models.config import DecoderConfig
        text = np.frombuffer("\n\n".join(topics.topics.values()).encode(), np.uint8)
        ids, targets = train.text_batch(text, BATCH, SEQ, 0, 0)
        P = DecoderConfig(**CONFIG).init_params()
        np.savez(path, ids=ids, targets=targets, **{f"p{i}": a for i, a in enumerate(train.parameters(P))})
    else:
        rng = np.random.default_rng(0)
        np.savez(path, **{n: rng.standard_normal(ATTN).astype(np.float32) for n in ("q", "k", "v", "do")})
    return path


def run(python, who, case, data, threads, repeats):
    cmd = [python, __file__, "--worker", who, "--case", case, "--data", data, "--threads", str(threads),
           "--repeats", str(repeats)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
        from silkattn._bench import ended
        raise SystemExit(f"{who} failed ({ended(done.returncode)}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--python", default=sys.executable, help="the interpreter with torch")
    ap.add_argument("--case", default="step,attention")
    ap.add_argument("--worker")
    ap.add_argument("--data")
    args = ap.parse_args()
    if args.worker:
        if args.worker == "torch":
            result = worker_torch(args.case, args.data, int(args.threads), args.repeats)
        else:
            result = worker_silkattn(args.case, args.data, int(args.threads), args.repeats,
                                     "numpy" if args.worker == "reference" else None)
        print(json.dumps(result))
        return
    from silkattn._bench import cpu_line
    print(cpu_line())
    with tempfile.TemporaryDirectory() as folder:
        for case in args.case.split(","):
            data = write_inputs(case, folder)
            for threads in (int(t) for t in args.threads.split(",")):
                ours = run(sys.executable, "silkattn", case, data, threads, args.repeats)
                reference = run(sys.executable, "reference", case, data, threads, min(args.repeats, 2))
                rival = run(args.python, "torch", case, data, threads, args.repeats)
                report(case, threads, ours, reference, rival, data)


def report(case, threads, ours, reference, rival, data):
    """The contenders' rows and ratios; silkattn's answer checked against the NumPy reference's
    (the first step's loss, or the gradients within silkattn._testing.TOL_GRAD): a fast wrong
    answer stops the run."""
    from silkattn._testing import TOL_GRAD
    ratio = ours["median_s"] / rival["median_s"]
    what = ("step: loss, grads, clip, AdamW (N=6 d=512 h=8 d_ff=2048, 8 x 256 bytes)" if case == "step"
            else f"attention_backward {ATTN} causal")
    print(f"\n{what}, {threads} thread(s)")
    for name, r in (("silkattn", ours), ("numpy reference", reference), (f"torch {rival['torch']}", rival)):
        extra = (f", first loss {r['first_loss']:.6f}" if case == "step"
                 else f", forward {r['forward_s'] * 1e3:.1f} ms")
        print(f"  {name:18s} median {r['median_s'] * 1e3:8.1f} ms  runs {r['times']}{extra}; CPU/wall "
              f"{r['cpu_per_wall']:.2f}; peak RSS {r['peak_mb']:.0f} MB, "
              f"{r['peak_mb'] - r['rss_before_mb']:.0f} MB over its RSS before the first step")
    if case == "step":
        if abs(ours["first_loss"] - reference["first_loss"]) > 1e-5 * abs(reference["first_loss"]):
            raise SystemExit(f"silkattn's first loss {ours['first_loss']} is not the reference's "
                             f"{reference['first_loss']}")
        rate = step_flops() / ours["median_s"] / 1e9
    else:
        B, H, S, dh = ATTN
        rate = 5 * 2 * B * H * S * S / 2 * dh / ours["median_s"] / 1e9
        g, r, t = (np.load(f"{data}.{who}.npz") for who in ("silkattn", "numpy", "torch"))
        for k in g.files:
            np.testing.assert_allclose(g[k], r[k], **TOL_GRAD[g[k].dtype])  # against the reference
        diff = max(float(np.abs(g[k] - t[k]).max()) for k in g.files)
        print(f"  dQ, dK, dV within TOL_GRAD of the reference's; max |silkattn - torch| {diff:.2e}")
    print(f"  silkattn / reference = {ours['median_s'] / reference['median_s']:.3f}")
    print(f"  silkattn / torch = {ratio:.3f}; silkattn's products {rate:.0f} GFLOP/s = "
          f"{rate / ours['sgemm_gflops']:.0%} of numpy's sgemm ({ours['sgemm_gflops']:.0f} GFLOP/s on as "
          "many threads, same run)")


if __name__ == "__main__":
    main()
