"""silkattn.dask.generate on a real LocalCluster (process workers, loopback only) with a small GGUF
file it writes: each prompt's completion is what model.complete (or model.chat) writes for it in one
process, in order, for any partitioning, seeded sampling included; a bad prompt is named by its
position; bad arguments are refused before any task."""
import numpy as np
import pytest

pytest.importorskip("distributed", reason="the dask extra is not installed (pip install 'silkattn[dask]')")
pytest.importorskip("gguf", reason="the llm extra is not installed (pip install 'silkattn[llm]')")

import dask.bag as db  # noqa: E402
from distributed import Client, LocalCluster  # noqa: E402

import silkattn.dask as sd  # noqa: E402
from silkattn.models import llama  # noqa: E402

import llama_files  # noqa: E402

PROMPTS = ["the cat", "héllo", "a b c d e f", "x", "the the the", "ab", "数学", "hi there"] * 2


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    p = str(tmp_path_factory.mktemp("dask-llm") / "tiny.gguf")
    llama_files.write(p, "Q4_1", context=96)
    return p


@pytest.fixture(scope="module")
def client():
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as c:
        yield c


def test_completions_equal_one_process_for_any_partitioning(client, path):
    model = llama.load(path)
    expected = [model.complete(p, 12) for p in PROMPTS]
    for npartitions in (1, 3, 16):
        out = sd.generate(db.from_sequence(PROMPTS, npartitions=npartitions), path, 12, max_batch=4)
        assert out.compute() == expected
    chats = [model.chat([{"role": "user", "content": p}], 10) for p in PROMPTS[:5]]
    assert sd.generate(db.from_sequence(PROMPTS[:5], npartitions=2), path, 10, chat=True).compute() == chats


def test_a_float16_cache_on_the_workers(client, path):
    """kv_dtype reaches the workers' models: their completions are a float16-cache model's, in one
    process (the same file loaded again with the other dtype on the same workers)."""
    model = llama.load(path, kv_dtype="float16")
    expected = [model.complete(p, 12) for p in PROMPTS[:6]]
    out = sd.generate(db.from_sequence(PROMPTS[:6], npartitions=2), path, 12, max_batch=4, kv_dtype="float16")
    assert out.compute() == expected


def test_seeded_sampling_does_not_depend_on_the_partitioning(client, path):
    model = llama.load(path)
    expected = [model.complete(p, 10, temperature=1.2, seed=5 + i) for i, p in enumerate(PROMPTS)]
    for npartitions in (2, 5):
        out = sd.generate(db.from_sequence(PROMPTS, npartitions=npartitions), path, 10, temperature=1.2,
                          seed=5)
        assert out.compute() == expected
    assert len(set(expected[:8])) > 1 and np.mean([len(e) for e in expected]) > 0


def test_bad_prompts_and_arguments(client, path, tmp_path):
    prompts = list(PROMPTS)
    prompts[6] = 3
    with pytest.raises(TypeError, match="prompt 6 must be a str, got int"):
        sd.generate(db.from_sequence(prompts, npartitions=3), path, 4).compute()
    bag = db.from_sequence(PROMPTS)
    with pytest.raises(TypeError, match="prompts must be a dask.bag"):
        sd.generate(PROMPTS, path)
    with pytest.raises(FileNotFoundError, match="model_path"):
        sd.generate(bag, str(tmp_path / "none.gguf"))
    with pytest.raises(ValueError, match="activations"):
        sd.generate(bag, path, activations="int4")
    with pytest.raises(ValueError, match="kv_dtype"):
        sd.generate(bag, path, kv_dtype="int8")
    with pytest.raises(ValueError, match="seed"):
        sd.generate(bag, path, seed=-1)
    with pytest.raises(ValueError, match="max_new_tokens"):
        sd.generate(bag, path, -1)
    with pytest.raises(ValueError, match="temperature"):
        sd.generate(bag, path, temperature=-1.0)


def test_the_workers_load_with_llama_load_s_defaults():
    import inspect
    given = inspect.signature(sd.generate).parameters
    defaults = inspect.signature(llama.load).parameters
    for name in ("activations", "kv_dtype"):
        assert given[name].default == defaults[name].default
