"""Sentence embeddings of a corpus on Dask workers (optional extra: pip install "silkattn[dask]").

    from distributed import Client
    import dask.bag as db
    import silkattn.dask

    client = Client("tcp://scheduler:8786")            # or Client(LocalCluster(...)) on one machine
    texts = db.read_text("corpus-*.txt").map(str.rstrip)
    emb = silkattn.dask.embed(texts, "/models/all-MiniLM-L6-v2")   # dask.array (n, 384) float32
    emb.to_zarr(...)  # or emb.compute(), emb[:1000].compute(), ...

The model is loaded once per worker process (a worker plugin) and reused by every task there; a
task's graph carries only the model's path, never its weights. Every worker needs silkattn, the
bert extra and the model directory at the same path.

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


class SentenceEncoderPlugin(WorkerPlugin):
    """A Dask worker plugin: loads the model once per worker process and sets its thread counts."""

    idempotent = True  # registering it again (each embed call does) does not reload the model

    def __init__(self, model_path, host_threads=None, weights="float32"):
        self.model_path, self.weights = os.fspath(model_path), weights
        self.host_threads = dict(host_threads or {})  # host -> task threads of all its workers
        self.name = f"{PLUGIN}:{self.model_path}:{weights}"

    def setup(self, worker):
        import threadpoolctl

        from . import _backends, set_num_threads
        from .models import bert

        _backends.kernels()  # load the kernels (and their OpenMP runtime) before the limits are set

        _heap_for_temporaries()
        from distributed.comm.addressing import get_address_host
        host = get_address_host(worker.address)
        threads = task_threads(worker.state.nthreads, self.host_threads.get(host))
        set_num_threads(threads)
        self._limits = threadpoolctl.threadpool_limits(limits=threads)  # BLAS and OpenMP pools
        worker.silkattn_models = getattr(worker, "silkattn_models", {})
        models = worker.silkattn_models
        models[self.model_path, self.weights] = bert.load(self.model_path, weights=self.weights)


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


def _model(model_path, weights="float32"):
    """The worker's loaded model (the plugin loaded it), or a load here if the plugin has not."""
    from .models import bert
    try:
        models = get_worker().silkattn_models
    except (ValueError, AttributeError):  # not on a worker, or the plugin has not run here
        models = _LOCAL
    if (model_path, weights) not in models:
        models[model_path, weights] = bert.load(model_path, weights=weights)
    return models[model_path, weights]


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
    client = get_client()
    host_threads = {}
    for info in client.scheduler_info()["workers"].values():
        host_threads[info["host"]] = host_threads.get(info["host"], 0) + info["nthreads"]
    plugin = SentenceEncoderPlugin(model_path, host_threads, weights)
    client.register_plugin(plugin, name=plugin.name)
    parts = texts.to_delayed()
    lengths = dask.compute(*[dask.delayed(len)(p) for p in parts])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    task = dask.delayed(_embed_partition, pure=True)
    blocks = [da.from_delayed(task(p, int(s), model_path, batch_size, normalize, weights), shape=(n, d),
                              dtype=np.float32) for p, s, n in zip(parts, starts, lengths)]
    return da.concatenate(blocks, axis=0) if blocks else da.empty((0, d), dtype=np.float32)


def _is_series(texts):
    try:
        import dask.dataframe as dd
    except ImportError:
        return False
    return isinstance(texts, dd.Series)
