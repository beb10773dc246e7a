"""Sentence embeddings, and LLM completions, of a corpus on Dask workers (optional extra: pip install
"silkattn[dask]").

    from distributed import Client
    import dask.bag as db
    import silkattn.dask

    client = Client("tcp://scheduler:8786")            # or Client(LocalCluster(...)) on one machine
    texts = db.read_text("corpus-*.txt").map(str.rstrip)
    emb = silkattn.dask.embed(texts, "/models/all-MiniLM-L6-v2")   # dask.array (n, 384) float32
    emb.to_zarr(...)  # or emb.compute(), emb[:1000].compute(), ...

    answers = silkattn.dask.generate(prompts, "/models/model.gguf", 64, chat=True)  # a dask.bag of str

The model is loaded once per worker process (a worker plugin) and reused by every task there; a
task's graph carries only the model's path, never its weights. Every worker needs silkattn, the
bert (embed) or llm (generate) extra and the model at the same path. generate() runs each
partition's prompts through generate_batch (models.batch: decoded together, max_batch at a time).

Threads that add up: each task gets max(1, C // T) kernel threads, where C is the number of CPUs
its worker may run on and T the task threads of all the workers on that host (as the scheduler
knew them when embed() registered the plugin). A worker that joined later divides its CPU budget
(OMP_NUM_THREADS if set, at most C) by its own thread count. silkattn's own threads and the
BLAS's and OpenMP's (threadpoolctl) are set to that count once, when the plugin loads the model:
two single-threaded workers on a 2-core host get one kernel thread a task, one worker of one
thread gets two, whatever OMP_NUM_THREADS or NUMBA_NUM_THREADS the workers inherited.
"""
import os

import numpy as np

try:
    import dask
    import dask.array as da
    import dask.bag as db
    from distributed import WorkerPlugin, get_client, get_worker
except ImportError as e:  # pragma: no cover - the extra is missing
    raise ImportError(f"silkattn.dask needs dask.distributed: pip install 'silkattn[dask]' ({e})") from e

from . import _checks as check

PLUGIN = "silkattn-sentence-encoder"


def _cpus():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def task_threads(nthreads, host_threads=None, cpus=None, env=os.environ):
    """Kernel threads per task (see above): cpus // host_threads when the task threads of every
    worker on the host are known, else min(OMP_NUM_THREADS, cpus) // nthreads."""
    cpus = cpus or _cpus()
    if host_threads:
        return max(1, cpus // host_threads)
    try:
        budget = min(cpus, int(env.get("OMP_NUM_THREADS", "").split(",")[0]))
    except ValueError:
        budget = cpus
    return max(1, budget // max(1, nthreads))


class ModelPlugin(WorkerPlugin):
    """A Dask worker plugin: loads the model once per worker process and sets its thread counts.
    kind "bert": models.bert.load(path, weights=option); "llm": models.llama.load(path,
    activations=option[0], kv_dtype=option[1])."""

    idempotent = True  # registering it again (each embed or generate call does) does not reload it

    def __init__(self, model_path, host_threads=None, option="float32", kind="bert"):
        self.model_path, self.option, self.kind = os.fspath(model_path), option, kind
        self.host_threads = dict(host_threads or {})  # host -> task threads of all its workers
        self.name = f"{PLUGIN}:{kind}:{self.model_path}:{option}"

    def setup(self, worker):
        import threadpoolctl

        from . import get_backend, set_backend, set_num_threads

        set_backend(get_backend())  # its kernels loaded (and their OpenMP runtime) before the limits are set

        _heap_for_temporaries()
        from distributed.comm.addressing import get_address_host
        host = get_address_host(worker.address)
        threads = task_threads(worker.state.nthreads, self.host_threads.get(host))
        set_num_threads(threads)
        self._limits = threadpoolctl.threadpool_limits(limits=threads)  # BLAS and OpenMP pools
        worker.silkattn_models = getattr(worker, "silkattn_models", {})
        worker.silkattn_models[self.kind, self.model_path, self.option] = _load(self.kind, self.model_path,
                                                                                 self.option)


def _load(kind, model_path, option):
    if kind == "llm":
        from .models import llama
        return llama.load(model_path, activations=option[0], kv_dtype=option[1])
    from .models import bert
    return bert.load(model_path, weights=option)


def _heap_for_temporaries(mmap_threshold=32 << 20, trim_threshold=64 << 20):
    """Dask's nanny starts workers with MALLOC_TRIM_THRESHOLD_=65536 (to hand freed memory back to
    the OS), which also freezes glibc's mmap threshold at 128 KiB: every temporary array larger than
    that becomes a fresh mmap whose pages fault in, and a forward pass makes dozens. Allocations up
    to mmap_threshold come from the heap again, and its top is trimmed once trim_threshold bytes are
    free. Linux with glibc only; elsewhere nothing changes."""
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        return False
    try:
        import ctypes
        libc = ctypes.CDLL("libc.so.6")
        M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
        return bool(libc.mallopt(M_MMAP_THRESHOLD, mmap_threshold)
                    and libc.mallopt(M_TRIM_THRESHOLD, trim_threshold))
    except (OSError, AttributeError):
        return False


def _model(model_path, option="float32", kind="bert"):
    """The worker's loaded model (the plugin loaded it), or a load here if the plugin has not."""
    try:
        models = get_worker().silkattn_models
    except (ValueError, AttributeError):  # not on a worker, or the plugin has not run here
        models = _LOCAL
    if (kind, model_path, option) not in models:
        models[kind, model_path, option] = _load(kind, model_path, option)
    return models[kind, model_path, option]


_LOCAL = {}


def _embed_partition(sentences, start, model_path, batch_size, normalize, weights="float32"):
    """float32 (len(sentences), d): one partition's embeddings; start: its first sentence's position
    in the whole corpus, so that a bad sentence is named by where the user put it."""
    sentences = list(sentences)
    for i, s in enumerate(sentences):
        if not isinstance(s, str):
            raise TypeError(f"sentence {start + i} must be a str, got {type(s).__name__}")
    model = _model(model_path, weights)
    if not sentences:
        return np.empty((0, model.config.d), np.float32)
    return model.encode(sentences, batch_size=batch_size, normalize=normalize)


def embed(texts, model_path, *, batch_size=32, normalize=True, weights="float32"):
    """dask.array (n, d) float32: the embeddings of a dask.bag of strings, or of a dask.dataframe
    Series of strings, in their order, computed on the current client's workers (weights: as
    models.bert.load's)."""
    from .models import bert

    if not isinstance(texts, db.Bag) and not _is_series(texts):
        raise TypeError(f"texts must be a dask.bag of strings or a dask.dataframe Series, "
                        f"got {type(texts).__name__}")
    batch_size = check.count(batch_size, "batch_size")
    if weights not in bert.WEIGHTS:
        raise ValueError(f"weights must be one of {', '.join(bert.WEIGHTS)}, got {weights!r}")
    model_path = os.fspath(model_path)
    d = bert.BertConfig.from_dir(model_path).d  # reads config.json here: a clear error before any task
    _register(model_path, weights, "bert")
    parts, starts, lengths = _parts(texts)
    task = dask.delayed(_embed_partition, pure=True)
    blocks = [da.from_delayed(task(p, int(s), model_path, batch_size, normalize, weights), shape=(n, d),
                              dtype=np.float32) for p, s, n in zip(parts, starts, lengths)]
    return da.concatenate(blocks, axis=0) if blocks else da.empty((0, d), dtype=np.float32)


def _register(model_path, option, kind):
    """The plugin that loads the model on every worker, with the hosts' task threads."""
    client = get_client()
    host_threads = {}
    for info in client.scheduler_info()["workers"].values():
        host_threads[info["host"]] = host_threads.get(info["host"], 0) + info["nthreads"]
    plugin = ModelPlugin(model_path, host_threads, option, kind)
    client.register_plugin(plugin, name=plugin.name)


def _parts(texts):  # -> (delayed partitions, each one's first position, their lengths)
    parts = texts.to_delayed()
    lengths = dask.compute(*[dask.delayed(len)(p) for p in parts])
    return parts, np.concatenate([[0], np.cumsum(lengths)]), lengths


def _generate_partition(prompts, start, model_path, option, max_new_tokens, chat, max_batch, seed,
                        sampling):
    """One partition's completions (list of str); prompt i's seed is seed + its position in the
    corpus, so the answers do not depend on the partitioning."""
    prompts = list(prompts)
    for i, p in enumerate(prompts):
        if not isinstance(p, str):
            raise TypeError(f"prompt {start + i} must be a str, got {type(p).__name__}")
    model = _model(model_path, option, "llm")
    texts = [model.apply_chat_template([{"role": "user", "content": p}]) if chat else p for p in prompts]
    seeds = None if seed is None else [seed + start + i for i in range(len(prompts))]
    new = model.generate_batch([model.prompt_ids(t) for t in texts], max_new_tokens, seed=seeds,
                               max_batch=max_batch, **sampling)
    # the text complete() writes: the closing EOS writes nothing
    return [model.tokenizer.decode(ids[:-1] if ids and ids[-1] == model.eos_id else ids,
                                   skip_special_tokens=False) for ids in new]


def generate(prompts, model_path, max_new_tokens=128, *, chat=False, activations="auto", max_batch=16,
             temperature=0.0, top_k=None, top_p=None, seed=None, kv_dtype="float16"):
    """dask.bag of str: what model.complete(prompt, max_new_tokens, ...) writes after each prompt of
    a dask.bag of strings (or a dask.dataframe Series), in their order, or with chat=True what
    model.chat([{"role": "user", "content": prompt}], ...) answers; each partition decoded on a
    worker as one generate_batch (max_batch sequences at a time), the GGUF file at model_path
    loaded once per worker (activations, kv_dtype: as models.llama.load's, its defaults).
    seed: prompt i samples with seed + i (i: its position in the corpus)."""
    if not isinstance(prompts, db.Bag) and not _is_series(prompts):
        raise TypeError(f"prompts must be a dask.bag of strings or a dask.dataframe Series, "
                        f"got {type(prompts).__name__}")
    check.count(max_new_tokens, "max_new_tokens", minimum=0)
    check.count(max_batch, "max_batch")
    check.sampling(temperature, top_k, top_p)
    if activations not in ("auto", "float32", "int8"):
        raise ValueError(f"activations must be auto, float32 or int8, got {activations!r}")
    from .models.llama import kv_cache_dtype
    option = (activations, kv_cache_dtype(kv_dtype).name)
    if seed is not None and (not isinstance(seed, int) or isinstance(seed, bool) or seed < 0):
        raise ValueError(f"seed must be a non-negative int or None, got {seed!r}")
    model_path = os.fspath(model_path)
    if not os.path.isfile(model_path):
        raise FileNotFoundError(f"model_path {model_path!r} is not a file (a GGUF file, at the same path "
                                "on every worker)")
    _register(model_path, option, "llm")
    parts, starts, _ = _parts(prompts)
    task = dask.delayed(_generate_partition, pure=True)
    sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p}
    return db.from_delayed([task(p, int(s), model_path, option, max_new_tokens, chat, max_batch, seed,
                                 sampling) for p, s in zip(parts, starts)])


def _is_series(texts):
    try:
        import dask.dataframe as dd
    except ImportError:
        return False
    return isinstance(texts, dd.Series)
