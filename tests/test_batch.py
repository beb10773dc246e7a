"""generate_batch and its scheduler (silkattn.models.batch): many sequences decoded together over a
paged KV cache give, token for token, what generate gives each alone, on every backend and
architecture of the family; sequences join and leave between steps; one that would not fit waits;
pages come back; bad arguments are named. The tests marked `blas` hold under every OpenBLAS setting
(tests/blas_settings.py): where silkattn's own kernels do the sums, a batch gives generate's logits
bit for bit; where the BLAS's GEMM does (float32 activations, prompts past the few-row kernels),
within the tolerance table, with the same greedy tokens."""
import numpy as np
import pytest

from silkattn import _api
from silkattn._testing import EXACT, TOL_MODEL
from silkattn.models import batch, llama, memory
from silkattn.models import runner as model_runner

import llama_files

PROMPTS = [[5], [1, 70, 80, 90], list(range(3, 30)), [200, 3, 3, 3, 3, 64, 250, 7, 1, 2], [9, 9], [40] * 12]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    root = tmp_path_factory.mktemp("batch")
    paths = {"llama-Q4_1": ("Q4_1", {}), "mqa-F16": ("F16", {"h": 8, "h_kv": 1, "n_layers": 3}),
             "qwen2-Q8_0": ("Q8_0", {"arch": "qwen2"}),
             "gemma3-window-Q8_0": ("Q8_0", {"arch": "gemma3", "n_layers": 3, "window": 8, "d_head": 24}),
             "gemma3-window-48-Q8_0": ("Q8_0", {"arch": "gemma3", "n_layers": 3, "window": 48, "d_head": 24}),
             # a Q4_K_M-like mix (d 256: K-quant rows), its down projections and output head Q6_K
             "llama-Q4_K_M": ("Q4_K", {"d": 256, "d_ff": 512, "tied": False, "types": {
                 "token_embd.weight": "Q8_0", "output.weight": "Q6_K", "blk.0.ffn_down.weight": "Q6_K",
                 "blk.1.ffn_down.weight": "Q6_K"}})}
    for name, (kind, kw) in paths.items():
        paths[name] = str(root / f"{name}.gguf")
        llama_files.write(paths[name], kind, context=96, **kw)
    return paths


@pytest.mark.blas
@pytest.mark.parametrize("name", ["llama-Q4_1", "mqa-F16", "qwen2-Q8_0", "gemma3-window-Q8_0"])
def test_batch_greedy_is_generate_one_at_a_time(files, name, on_backend, threads):
    """Fewer slots than prompts, small pages, lengths of their own: sequences join as others leave."""
    model = llama.load(files[name], **EXACT)
    new = [20, 7, 33, 1, 12, 25]
    alone = [model.generate(p, n, ignore_eos=True) for p, n in zip(PROMPTS, new)]
    together = model.generate_batch(PROMPTS, new, ignore_eos=True, max_batch=4, page_keys=4)
    assert together == alone
    assert model.stats["new_tokens"] == sum(new) and model.stats["sequences"] == len(PROMPTS)
    assert model.stats["prompt_tokens"] == sum(map(len, PROMPTS))


@pytest.mark.parametrize("name, activations", [("llama-Q4_1", "float32"), ("llama-Q4_1", "int8"),
                                              ("gemma3-window-Q8_0", "float32"), ("mqa-F16", "float32")])
def test_a_lone_sequence_takes_the_fused_step(files, name, activations, on_backend, monkeypatch):
    """One sequence at a time whose positions fit in a page: its steps are the model's fused step
    over the page (what generate runs; int8 too, so its tokens are generate's), where the model has
    one (its matrices blocks: not the F16 file), and its pages come back for the next."""
    model = llama.load(files[name], activations=activations, kv_dtype="float32")
    new = [20, 7, 33, 1, 12, 25]
    alone = [model.generate(p, n, ignore_eos=True) for p, n in zip(PROMPTS, new)]
    fused, step = [], model_runner.decode_one
    monkeypatch.setattr(model_runner, "decode_one", lambda *a: (fused.append(1), step(*a))[1])
    assert model.generate_batch(PROMPTS, new, ignore_eos=True, max_batch=1, page_keys=64) == alone
    steps = sum(new) - len(new) + sum(len(p) == 1 for p in PROMPTS)  # a one-token prompt's first too
    assert len(fused) == (steps if model.fused else 0) and (name == "mqa-F16") != model.fused
    monkeypatch.setattr(model_runner, "decode_one", step)
    if activations == "float32":  # together, then the last one alone: int8's tokens may differ (below)
        together = model.generate_batch(PROMPTS[:3], new[:3], ignore_eos=True, max_batch=3, page_keys=64)
        assert together == alone[:3]


@pytest.mark.parametrize("name", ["llama-Q4_1", "qwen2-Q8_0", "gemma3-window-Q8_0", "mqa-F16"])
def test_sequences_within_a_page_each_take_the_fused_step_of_rows(files, name, on_backend, threads,
                                                                  monkeypatch):
    """Pages that hold each sequence whole: the running ones advance through ops.layer_step_rows
    (one call a layer for all of them) where the model has a fused step, token for token what
    generate gives each alone."""
    model = llama.load(files[name], **EXACT)
    new = [20, 7, 33, 1, 12, 25]
    alone = [model.generate(p, n, ignore_eos=True) for p, n in zip(PROMPTS, new)]
    rows, step_rows = [], model_runner.decode_rows
    monkeypatch.setattr(model_runner, "decode_rows", lambda *a: (rows.append(len(a[2])), step_rows(*a))[1])
    assert model.generate_batch(PROMPTS, new, ignore_eos=True, max_batch=4, page_keys=64) == alone
    assert (max(rows, default=0) == 4) == model.fused and (name == "mqa-F16") != model.fused


def test_batch_of_int8_activations_follows_the_model(files, on_backend):
    """int8 activations: rounding x to 8 bits turns the last-bit differences of two summation orders
    into steps of d_x w (here up to 0.04 in a logit), so tokens are not compared across paths; each
    step's logits are the forward pass's over the same ids (the GEMM path), within that."""
    model = llama.load(files["llama-Q4_1"], activations="int8", kv_dtype="float32")
    logits = _step_logits(batch.Batch(model, max_batch=4, cache_tokens=256, page_keys=16), PROMPTS, 12)
    for s in logits:
        expected = model.forward(list(s.ids) + s.new[:-1])[len(s.ids) - 1:]
        assert len(s.new) == 12 and np.abs(np.array(logits[s]) - expected).max() < 0.1


def _step_logits(runner, prompts, new, later=()):  # -> {sequence: each step's logits}, run to the end
    """later: prompts submitted one a step after the first step."""
    logits = {runner.submit(p, new, ignore_eos=True): [] for p in prompts}
    next_token, later = runner._next, list(later)
    runner._next = lambda seq, row: (logits[seq].append(np.array(row)), next_token(seq, row))[1]
    while not runner.idle:
        runner.step()
        if later:
            logits[runner.submit(later.pop(0), new, ignore_eos=True)] = []
    return logits


def _lone_logits(model, ids, new):  # -> each step's logits as generate(ids) writes `new`
    cache = model.cache(len(ids) + len(new))
    records = model.layer_records(cache)
    logits = [model._run(np.array(ids), cache, 0)[-1]]
    for pos, token in enumerate(new[:-1], len(ids)):
        logits.append(model._run(np.array([token]), cache, pos, records=records)[-1])
    return logits


@pytest.mark.blas
@pytest.mark.parametrize("name, activations, kv", [
    ("llama-Q4_1", "int8", "float32"), ("qwen2-Q8_0", "int8", "float32"),
    ("gemma3-window-Q8_0", "int8", "float32"), ("llama-Q4_1", "float32", "float32"),
    ("llama-Q4_K_M", "int8", "float32"), ("llama-Q4_1", "int8", "float16"),
    ("gemma3-window-Q8_0", "int8", "float16"), ("llama-Q4_K_M", "int8", "float16")])
def test_batches_give_generate_s_logits_to_the_bit(files, name, activations, kv):
    """cython: 13 prompts of 1 to 30 tokens (more rows than a few-row call's 8),
    default pages: every step's logits of every sequence, bit for bit, those generate's own prefill
    and steps give it: the packed prefill's attention split by path (ops.attention_varlen), its
    last layer on each prompt's last row alone, prompts of up to ops.rows_alike tokens packed only
    with each other (generate multiplies their rows in the few-row kernels; the integer GEMM sums
    Q8_0's offsets in another order, the float32 GEMM is the BLAS's), the output head of up to
    Q8_ROWS rows in the few-row kernels, a
    one-token prompt a decoding step at position 0 (generate's prefill of it is the fused step);
    Gemma 3's window (8 positions) shorter than most prompts; a Q4_K_M-like file's Q4_K and Q6_K
    matrices in their 16-row layouts (its Q6_K head's rows not whole groups: the file's); and with
    a float16 KV cache (the prefill's attention over its rows rounded, as generate's over its cache)."""
    import silkattn
    if not silkattn.backends()["cython"].startswith("available"):
        pytest.skip("the cython backend is not built")
    import silkattn.cython
    if silkattn.cython.ISA != "avx512":
        pytest.skip("a row's int8 sums are the same in any call on the AVX-512 copy only")
    rng = np.random.default_rng(5)
    with silkattn.use_backend("cython"):
        model = llama.load(files[name], activations=activations, kv_dtype=kv)
        if name == "llama-Q4_K_M":  # the products read the layouts (read-only blocks, whole groups)
            kinds = {model.head.kind} | {W.kind for L in model.layers for W in (L.wd, L.wqkv)}
            pack = silkattn.cython.KERNELS.pack_rows16  # the head's 265 rows are not whole groups
            assert kinds == {"Q4_K", "Q6_K"} and all(L.wd.rows16(pack) is not None for L in model.layers)
        lengths = (1, 2, 3, 5, 7, 8, 9, 12, 16, 17, 20, 25, 30)
        prompts = [list(rng.integers(3, model.config.vocab, n)) for n in lengths]
        logits = _step_logits(batch.Batch(model, max_batch=16), prompts, 10)
        for s in logits:
            lone = _lone_logits(model, s.ids, s.new)
            assert len(logits[s]) == len(lone) == 10
            assert all(np.array_equal(a, b) for a, b in zip(logits[s], lone)), len(s.ids)


def _sharing_prompts(rng, vocab):  # prompts that share prefixes of many lengths, as chats share a template
    base = list(rng.integers(3, vocab, 30))
    tails = [list(rng.integers(3, vocab, n)) for n in (0, 9, 3, 16, 2, 0, 9, 12, 0, 5)]
    heads = (30, 12, 30, 1, 20, 7, 25, 30, 3, 2)
    prompts = [base[:h] + t for h, t in zip(heads, tails)]
    return prompts + [prompts[3][:2], prompts[1] + [7], base[:5]]


@pytest.mark.blas
@pytest.mark.parametrize("name, activations, kv", [
    ("llama-Q4_1", "int8", "float32"), ("gemma3-window-48-Q8_0", "int8", "float32"),
    ("gemma3-window-Q8_0", "int8", "float32"), ("llama-Q4_1", "float32", "float32"),
    ("qwen2-Q8_0", "int8", "float32"),
    ("llama-Q4_1", "int8", "float16"), ("gemma3-window-48-Q8_0", "int8", "float16")])
def test_prompts_of_one_prefill_share_their_common_prefix_to_the_bit(files, name, activations, kv):
    """cython: prompts that share prefixes (a whole prompt, all but a token, one token, a prefix of
    a prefix) prefilled together: each takes the rows of its longest prefix in common with an
    earlier one instead of multiplying its own, and every step's logits are still, bit for bit,
    those generate gives it alone (long ones with a GEMM, short ones in the few-row kernels, each
    class sharing only within itself). Prompts of up to 8 tokens (the attention's rows path here)
    and those longer than a window (Gemma 3's 8) compute their rows alone. With float32 activations
    the prompts past the few-row kernels (_api.FEW_ROWS) are multiplied by the BLAS's GEMM, whose row
    sums may depend on the call's other rows (OpenBLAS's Haswell kernel): theirs are generate's
    logits within TOL_MODEL, with its greedy tokens."""
    import silkattn
    if not silkattn.backends()["cython"].startswith("available"):
        pytest.skip("the cython backend is not built")
    import silkattn.cython
    if silkattn.cython.ISA != "avx512":
        pytest.skip("a row's int8 sums are the same in any call on the AVX-512 copy only")
    with silkattn.use_backend("cython"):
        model = llama.load(files[name], activations=activations, kv_dtype=kv)
        prompts = _sharing_prompts(np.random.default_rng(8), model.config.vocab)
        runner = batch.Batch(model, max_batch=16)
        logits = _step_logits(runner, prompts, 6)
        for s in logits:
            _assert_generate_s(logits[s], _lone_logits(model, s.ids, s.new), len(s.ids), activations)
        assert runner.stats["prompt_tokens"] == sum(map(len, prompts))
        # in waves: the later prompts take positions from the sequences running (their pages)
        runner = batch.Batch(model, max_batch=16)
        waves = _step_logits(runner, prompts[:1], 6, later=prompts[1:])
        for s in waves:
            _assert_generate_s(waves[s], _lone_logits(model, s.ids, s.new), len(s.ids), activations)
        if name == "gemma3-window-Q8_0":
            assert runner.stats["shared_tokens"] == 0
        else:  # the 30 common positions, several times (float32: fewer, each class apart)
            assert runner.stats["shared_tokens"] > 30


def _assert_generate_s(steps, lone, n, activations):
    """A sequence of n prompt tokens: each step's logits are generate's (lone) to the bit, or,
    where generate's prefill multiplied its float32 rows in the BLAS's GEMM, within TOL_MODEL and
    with the same greedy token."""
    assert len(steps) == len(lone)
    if activations == "float32" and n > _api.FEW_ROWS:  # past the few-row kernels
        for a, b in zip(steps, lone):
            np.testing.assert_allclose(a, b, **TOL_MODEL[np.dtype(np.float32)], err_msg=str(n))
            assert np.argmax(a) == np.argmax(b), n
    else:
        assert all(np.array_equal(a, b) for a, b in zip(steps, lone)), n


@pytest.mark.blas
@pytest.mark.parametrize("name", ["llama-Q4_1", "mqa-F16", "gemma3-window-48-Q8_0"])
def test_prompts_sharing_prefixes_are_generate_one_at_a_time(files, name, on_backend, threads):
    """Every backend: prompts that share prefixes, prefilled together, write generate's tokens."""
    model = llama.load(files[name], **EXACT)
    prompts = _sharing_prompts(np.random.default_rng(8), model.config.vocab)
    alone = [model.generate(p, 8, ignore_eos=True) for p in prompts]
    assert model.generate_batch(prompts, 8, ignore_eos=True, max_batch=16) == alone
    assert (model.stats["shared_tokens"] > 50) == _backends_attention()
    # four at a time: each joins as another leaves and shares with those running
    assert model.generate_batch(prompts, 8, ignore_eos=True, max_batch=4) == alone
    assert (model.stats["shared_tokens"] > 30) == _backends_attention()


@pytest.mark.parametrize("name", ["llama-Q4_1", "gemma3-window-Q8_0", "mqa-F16"])
def test_a_float16_cache_batch_is_generate_one_at_a_time(files, name, on_backend):
    """kv_dtype="float16" (half the cache's bytes): generate_batch over pages of 4 (the paged step,
    its pages widened), of 64 (the fused step of rows), one at a time (the fused step) and with
    shared prefixes writes generate's tokens, each sequence over a float16 cache of its own."""
    model = llama.load(files[name], kv_dtype="float16", activations="float32")
    assert model.kv_dtype == np.float16 and model.cache(10)[0].dtype == np.float16
    new = [20, 7, 33, 1, 12, 25]
    alone = [model.generate(p, n, ignore_eos=True) for p, n in zip(PROMPTS, new)]
    for kw in ({"max_batch": 4, "page_keys": 4}, {"max_batch": 4, "page_keys": 64}, {"max_batch": 1}):
        assert model.generate_batch(PROMPTS, new, ignore_eos=True, **kw) == alone, kw
    prompts = _sharing_prompts(np.random.default_rng(8), model.config.vocab)
    alone = [model.generate(p, 8, ignore_eos=True) for p in prompts]
    assert model.generate_batch(prompts, 8, ignore_eos=True, max_batch=16) == alone


def test_a_float16_cache_keeps_the_model_s_logits_and_halves_the_bytes(files, on_backend):
    """The float16 cache's logits (a prefill, then steps) within float16's rounding of the float32
    cache's, and not the same numbers; the cache, the pool and cache_bytes half as large."""
    wide, half = (llama.load(files["llama-Q4_1"], kv_dtype=kv) for kv in ("float32", "float16"))
    ids, new = PROMPTS[2], [7, 200, 41, 2]
    a, b = _lone_logits(wide, ids, new), _lone_logits(half, ids, new)
    for x, y in zip(a, b):
        np.testing.assert_allclose(y, x, rtol=0, atol=2e-3 * np.abs(x).max())
    assert any(not np.array_equal(x, y) for x, y in zip(a, b))
    assert 2 * half.cache_bytes(50) == wide.cache_bytes(50) == wide.cache(50).nbytes
    c = half.config
    assert 2 * memory.Memory(c, tokens=64, dtype=np.float16).nbytes == memory.Memory(c, tokens=64).nbytes
    runner = batch.Batch(half, max_batch=2)
    assert runner.pool.data.dtype == np.float16


@pytest.mark.parametrize("bad", ["int8", "bfloat16", np.float64, True, None, "half-ish"])
def test_a_bad_kv_dtype_is_refused(files, bad):
    with pytest.raises(ValueError, match="kv_dtype must be 'float32' or 'float16'"):
        llama.load(files["llama-Q4_1"], kv_dtype=bad)
    with pytest.raises(ValueError, match="dtype must be float32 or float16"):
        memory.Memory(llama.load(files["llama-Q4_1"]).config, tokens=16, dtype=np.int8)


def _backends_attention():  # whether the current backend has a compiled attention (sharing needs one)
    from silkattn import _backends
    return _backends.kernels().attention is not None


def test_an_ended_prompt_s_pages_are_kept_for_prompts_that_begin_alike(files):
    """A sequence that ends leaves its prompt's pages kept with its ids (still free: counted so, and
    taken back, least recently used first, when a sequence needs them): a later prompt that begins
    alike copies their keys and writes what generate writes for it alone."""
    model = llama.load(files["llama-Q4_1"], activations="int8", kv_dtype="float32")
    runner, rng = batch.Batch(model, max_batch=4, cache_tokens=4 * 64, page_keys=64), np.random.default_rng(3)
    base = list(rng.integers(3, model.config.vocab, 30))
    first, second = base + [1, 2], base + list(rng.integers(3, model.config.vocab, 12))
    for ids in (first, second):
        seq = runner.submit(ids, 5, ignore_eos=True)
        while not runner.idle:
            runner.step()
        assert seq.new == model.generate(ids, 5, ignore_eos=True)
    assert (seq.shared > 0) == (model_runner.shareable(model, len(second)) > 0)
    assert runner.pool.free == 4 and [ids.tolist() for ids, _ in runner.pool.kept] == [first, second]
    # the same prompt again: it copies the kept one's keys and replaces it, one entry a prompt
    again = runner.submit(first, 5, ignore_eos=True)
    while not runner.idle:
        runner.step()
    assert again.new == model.generate(first, 5, ignore_eos=True) and runner.pool.free == 4
    assert [ids.tolist() for ids, _ in runner.pool.kept] == [second, first]
    # four sequences of a page each at once: the kept pages are taken back for them
    fresh = [list(rng.integers(3, model.config.vocab, 20)) for _ in range(4)]
    seqs, widest = [runner.submit(ids, 5, ignore_eos=True) for ids in fresh], 0
    while not runner.idle:
        runner.step()
        widest = max(widest, len(runner.running))
    assert widest == 4 and [s.new for s in seqs] == [model.generate(ids, 5, ignore_eos=True) for ids in fresh]
    assert runner.pool.free == 4 and runner.pool.reserved == 0 and len(runner.pool.kept) <= 4


def test_a_prefill_that_fails_keeps_no_pages(files, monkeypatch):
    """A prefill that raises part way (the server then cancels its sequences) leaves keys half
    written: their pages go back to the pool unremembered, so no later prompt copies them."""
    model = llama.load(files["llama-Q4_1"], **EXACT)
    runner = batch.Batch(model, max_batch=4, cache_tokens=4 * 64, page_keys=64)
    seqs = [runner.submit(list(range(3, 40)) + [i], 4, ignore_eos=True) for i in range(2)]

    def fail(*args):
        raise RuntimeError("a fault mid-prefill")
    monkeypatch.setattr(model_runner, "prefill_packed", fail)
    with pytest.raises(RuntimeError, match="mid-prefill"):
        runner.step()
    for seq in seqs:
        runner.cancel(seq)
    assert runner.pool.kept == [] and runner.pool.free == 4 and runner.idle


def test_shares_finds_each_prompt_s_longest_common_prefix():
    ids = [np.array(p) for p in ([1, 2, 3, 4], [1, 2, 9], [1, 2, 3, 4, 5], [1, 2, 3, 4], [7, 1], [1],
                                 [1, 2, 3])]
    # the last token is never shared: a prompt needs its own last row's logits
    assert model_runner.shares(ids) == [None, (0, 2), (0, 4), (0, 3), None, None, (0, 2)]
    assert model_runner.shares(ids[:2] + ids[4:6]) == [None, (0, 2), None, None]
    assert model_runner.shares([np.array([1, 2]), np.array([3, 2])]) is None
    # long prompts multiplied by a GEMM: not below `few` rows left, which the few-row kernels would take
    assert model_runner.shares(ids[:4], few=6) == [None, (0, 2), (0, 4), (0, 3)]  # 16 rows, 9 shared
    assert model_runner.shares(ids[:4], few=7) == [None, (0, 2), (0, 4), (0, 2)]
    assert model_runner.shares(ids[:4], few=9) == [None, (0, 2), (0, 4), None]
    assert model_runner.shares(ids[:4], few=15) is None
    # sequences prefilled before come first: a < len(prior) names one of them
    prior = [ids[0], np.array([1, 2, 9, 9])]
    assert model_runner.shares([np.array([1, 2, 9, 9, 5]), ids[2]], prior=prior) == [(1, 4), (0, 4)]
    # each prompt up to what most() allows; one that may share none is no one's source
    assert model_runner.shares(ids, most=lambda n: max(0, n - 3)) == [None, None, (0, 2), (0, 1), None, None,
                                                                      None]


def test_each_sequence_samples_with_its_own_settings_and_seed(files):
    model = llama.load(files["qwen2-Q8_0"], **EXACT)
    temperature, seed = [1.5, 0.0, 0.8, 1.0, 2.0, 1.2], [7, 1, 2, 3, 3, 5]
    top_k = [None, None, 5, 2, None, 40]
    alone = [model.generate(p, 16, temperature=t, seed=s, top_k=k, ignore_eos=True)
             for p, t, s, k in zip(PROMPTS, temperature, seed, top_k)]
    together = model.generate_batch(PROMPTS, 16, temperature=temperature, seed=seed, top_k=top_k,
                                    ignore_eos=True, max_batch=3)
    assert together == alone
    assert model.generate_batch(PROMPTS[:2], 16, temperature=1.5, seed=9, ignore_eos=True) == \
        [model.generate(p, 16, temperature=1.5, seed=9, ignore_eos=True) for p in PROMPTS[:2]]


def test_a_sequence_stops_at_eos_and_the_others_go_on(files):
    """EOS made a token one sequence writes early: it leaves there, as generate stops, the others
    go on to their max_new_tokens."""
    model = llama.load(files["llama-Q4_1"], **EXACT)
    full = [model.generate(p, 20, ignore_eos=True) for p in PROMPTS]
    model.eos_id = full[2][3]
    alone = [model.generate(p, 20) for p in PROMPTS]
    assert len(alone[2]) == 4 and alone[2][-1] == model.eos_id
    assert model.generate_batch(PROMPTS, 20, max_batch=3) == alone


def test_sequences_wait_for_pages_and_give_them_back(files):
    """A pool of 3 pages of 8: two sequences of 2 pages never run together, the one of 1 page waits
    behind the second in line (first come, first served), then runs beside it; every page comes
    back; the waiting never changes what a sequence writes."""
    model = llama.load(files["llama-Q4_1"], **EXACT)
    runner = batch.Batch(model, max_batch=8, cache_tokens=24, page_keys=8)
    assert runner.pool.pages == 3 and runner.pool.free == 3
    seqs = [runner.submit(p, 6, ignore_eos=True) for p in ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], [12] * 2)]
    most = 0
    while not runner.idle:
        runner.step()
        most = max(most, len(runner.running))
        assert runner.pool.free >= 0 and sum(len(s.pages) + s.reserved for s in runner.running) <= 3
    assert most == 2  # the second and third together (2 + 1 pages), after the first
    assert runner.pool.free == 3 and runner.pool.reserved == 0
    for s, p in zip(seqs, ([1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11], [12] * 2)):
        assert s.new == model.generate(p, 6, ignore_eos=True) and s.finish_reason == "length"


def test_cancel_frees_the_pages(files):
    model = llama.load(files["mqa-F16"], **EXACT)
    runner = batch.Batch(model, max_batch=2, cache_tokens=64, page_keys=8)
    a, b, c = (runner.submit(p, 30, ignore_eos=True) for p in PROMPTS[:3])
    runner.step()
    runner.step()
    runner.cancel(a)
    runner.cancel(c)  # still waiting
    assert a.finish_reason == c.finish_reason == "cancelled" and a.pages == []
    while not runner.idle:
        runner.step()
    assert b.new == model.generate(PROMPTS[1], 30, ignore_eos=True) and c.new == []
    assert runner.pool.free == runner.pool.pages


def test_pool_sizes_and_zero_new_tokens(files):
    model = llama.load(files["llama-Q4_1"], **EXACT)
    c = model.config
    pool = memory.Memory(c, nbytes=10 * c.n_layers * 2 * c.h_kv * 16 * c.d_head * 4 + 5, page_keys=16)
    assert pool.pages == 10 and pool.nbytes == 10 * c.n_layers * 2 * c.h_kv * 16 * c.d_head * 4
    assert memory.Memory(c, tokens=33, page_keys=16).pages == 3
    assert model.generate_batch([[1, 2], [3]], 0) == [[], []]
    assert model.generate_batch([], 5) == []


def test_one_page_and_the_default_pages(files):
    """By default each sequence gets one page: generate_batch's pages hold the longest sequence,
    a Batch's with the default pool min(context, POSITIONS) positions (max_batch of them)."""
    assert [batch.one_page(n) for n in (1, 100, 256, 257, 4096, 4097)] == [1, 100, 256, 512, 4096, 4352]
    for bad in (0, -3, 2.5, "7"):
        with pytest.raises((ValueError, TypeError), match="positions"):
            batch.one_page(bad)
    model = llama.load(files["llama-Q4_1"], **EXACT)
    runner = batch.Batch(model, max_batch=3)
    assert runner.pool.page_keys == batch.one_page(min(model.config.context_length, batch.POSITIONS)) == 96
    assert runner.pool.pages == 3
    assert batch.Batch(model, max_batch=3, cache_tokens=512).pool.page_keys == batch.PAGE_KEYS
    assert batch.Batch(model, max_batch=3, page_keys=8).pool.pages == 36  # 3 x 96 positions in pages of 8


@pytest.mark.parametrize("activations", ["float32", "int8"])
def test_default_pages_take_the_fused_step_of_rows(files, activations, on_backend, monkeypatch):
    """generate_batch's default pages hold each sequence whole, so its steps are the fused step of
    rows: token for token what generate gives each alone, with int8 activations too, on every
    backend (the paged step's int8 tokens may part from them:
    test_batch_of_int8_activations_follows_the_model)."""
    model = llama.load(files["llama-Q4_1"], activations=activations, kv_dtype="float32")
    new = [20, 7, 33, 1, 12, 25]
    alone = [model.generate(p, n, ignore_eos=True) for p, n in zip(PROMPTS, new)]
    rows, paged = [], []
    step_rows, decode_paged = model_runner.decode_rows, model_runner.decode_paged
    monkeypatch.setattr(model_runner, "decode_rows", lambda *a: (rows.append(len(a[2])), step_rows(*a))[1])
    monkeypatch.setattr(model_runner, "decode_paged", lambda *a: (paged.append(1), decode_paged(*a))[1])
    together = model.generate_batch(PROMPTS, new, ignore_eos=True, max_batch=4)
    assert max(rows) == 4 and not paged
    assert together == alone


def test_generate_batch_lets_its_pool_go_at_once(files, on_backend, monkeypatch):
    """The fused step's records over the pool's pages (each with its backends' forms, which do not
    refer back to it) go when generate_batch returns, and its pool's memory with them, not at the
    garbage collector's next pass over cycles (two calls in a row held two pools). A first call
    before: with the numba backend a process's first call's pool stays referenced (once, from the
    kernels' first calls; not chased), the later ones go."""
    import gc
    import weakref
    model = llama.load(files["llama-Q4_1"], **EXACT)
    model.generate_batch(PROMPTS, 9, ignore_eos=True, max_batch=4)
    pools, make = [], memory.Memory.__init__

    def init(self, *args, **kw):
        make(self, *args, **kw)
        pools.append(weakref.ref(self.data.base))  # the array that owns the pool's buffer

    monkeypatch.setattr(memory.Memory, "__init__", init)
    collecting = gc.isenabled()
    gc.disable()
    try:
        model.generate_batch(PROMPTS, 9, ignore_eos=True, max_batch=4)
        assert len(pools) == 1 and pools[0]() is None
    finally:
        if collecting:
            gc.enable()


def test_generate_lets_its_cache_go_at_once(files, on_backend, monkeypatch):
    """generate's cache (and the fused step's records over it) go when its tokens are written, with
    the garbage collector off: nothing refers back to a record from its backends' forms of it."""
    import gc
    import weakref
    model = llama.load(files["llama-Q4_1"], activations="int8", kv_dtype="float32")
    model.generate(PROMPTS[2], 5, ignore_eos=True)
    caches, make = [], model.cache

    def cache(capacity):
        c = make(capacity)
        caches.append(weakref.ref(c[0][0].base if c[0][0].base is not None else c[0][0]))
        return c

    monkeypatch.setattr(model, "cache", cache)
    collecting = gc.isenabled()
    gc.disable()
    try:
        assert len(model.generate(PROMPTS[2], 5, ignore_eos=True)) == 5
        assert len(caches) == 1 and caches[0]() is None
    finally:
        if collecting:
            gc.enable()


def _mapping(address):  # -> {field: value} of the mapping holding address in /proc/self/smaps, or None
    lines = open("/proc/self/smaps").read().splitlines()
    for i, line in enumerate(lines):
        span = line.split(" ", 1)[0].split("-")
        if len(span) == 2 and all(v and set(v) <= set("0123456789abcdef") for v in span):
            if int(span[0], 16) <= address < int(span[1], 16):
                fields = {}
                for entry in lines[i + 1:]:
                    name, sep, value = entry.partition(":")
                    if not sep or " " in name:
                        break
                    fields[name] = value.strip()
                return fields
    return None


def test_the_pool_takes_memory_as_it_is_written(files):
    """The pool is a private mapping of its own (page-aligned, writable; not shared, i.e. not shmem)
    that is not backed by huge pages: of a pool of 32768 positions (16 MB here) one written position
    takes one 4 KB page (Linux: smaps' Rss of the mapping; THPeligible 0 where reported), not 2 MB."""
    model = llama.load(files["llama-Q4_1"], **EXACT)
    pool = memory.Memory(model.config, tokens=32768, page_keys=256)
    assert pool.data.flags.writeable and pool.data.ctypes.data % 4096 == 0 and pool.nbytes > 4 << 20
    pool.data[0, 0, 0, 0, 0] = 1.0
    try:
        fields = _mapping(pool.data.ctypes.data)
    except OSError:
        pytest.skip("no /proc/self/smaps on this system")
    assert fields is not None, "the pool's mapping is not in /proc/self/smaps"
    assert fields.get("THPeligible", "0") == "0"
    assert "sh" not in fields.get("VmFlags", "").split()
    assert int(fields["Rss"].split()[0]) <= 64  # kB


@pytest.mark.parametrize("kw, error, match", [
    ({"max_new_tokens": [1, 2, 3]}, ValueError, "max_new_tokens must be one value or one per prompt"),
    ({"seed": [1]}, ValueError, "seed must be one value or one per prompt"),
    ({"max_batch": 0}, ValueError, "max_batch"),
    ({"page_keys": 300}, ValueError, "page_keys must be at most 256"),
    ({"cache_tokens": 8, "page_keys": 8, "max_new_tokens": 6}, ValueError, "raise cache_tokens"),
    ({"cache_tokens": 64, "cache_bytes": 1 << 20}, ValueError, "one of them"),
    ({"cache_bytes": 10}, ValueError, "holds no page"),
    ({"temperature": -1.0}, ValueError, "temperature"),
    ({"max_new_tokens": 95}, ValueError, "context length"),
])
def test_bad_batch_arguments(files, kw, error, match):
    model = llama.load(files["llama-Q4_1"], **EXACT)
    kw = {"max_new_tokens": 4, **kw}
    with pytest.raises(error, match=match):
        model.generate_batch([[1, 2, 3], [4, 5]], **kw)


def test_bad_prompts_are_named(files):
    model = llama.load(files["llama-Q4_1"], **EXACT)
    with pytest.raises(ValueError, match="ids"):
        model.generate_batch([[1, 2], [10 ** 6]], 3)
    with pytest.raises(ValueError, match="ids"):
        model.generate_batch([[1, 2], []], 3)


@pytest.mark.blas
@pytest.mark.parametrize("page_keys", [16, 64])
def test_forks_answer_a_prompt_again_from_its_pages(files, page_keys):
    """n > 1: forks joining with their parent take its prompt's pages (the full ones shared, the
    last one copied) and its first logits; each writes what generate writes with its own seed, and
    every page comes back."""
    model = llama.load(files["llama-Q4_1"], **EXACT)
    prompt, new = list(range(3, 40)), 9
    runner = batch.Batch(model, max_batch=4, cache_tokens=4 * 64, page_keys=page_keys)
    parent = runner.submit(prompt, new, temperature=0.8, seed=0, ignore_eos=True)
    forks = [runner.fork(parent, temperature=0.8, seed=s, ignore_eos=True) for s in (1, 2)]
    runner.step()
    assert runner.stats["prompt_tokens"] == 3 * len(prompt)
    assert runner.stats["shared_tokens"] >= 2 * len(prompt)
    full = len(prompt) // page_keys
    assert all(f.pages[:full] == parent.pages[:full] for f in forks)
    assert all(runner.pool.refs[p] == 3 for p in parent.pages[:full])
    while not runner.idle:
        runner.step()
    for seq, seed in zip([parent] + forks, (0, 1, 2)):
        assert seq.new == model.generate(prompt, new, temperature=0.8, seed=seed, ignore_eos=True)
    assert runner.pool.free == runner.pool.pages and not runner.pool.refs.any()
    with pytest.raises(TypeError, match="fork"):
        runner.fork(forks[0])
