"""silkattn.models.train: the listing's decoder's loss and gradients (against the reference forward
by finite differences, every parameter kind, on every backend), AdamW and clipping by their
formulas, the training loop (loss falls; a resumed run has the same losses as an uninterrupted one;
a write killed mid-way leaves the previous checkpoint whole), and the `train` / `complete
--checkpoint` commands."""
import os
import subprocess
import sys

import numpy as np
import pytest

from silkattn import reference as ref
from silkattn.models import train
from silkattn.models.config import DecoderConfig

TINY = DecoderConfig(vocab=256, d=16, h=2, n_layers=1, d_ff=32, max_len=64)


def reference_loss(P, ids, targets):
    """The mean next-token cross-entropy of reference.transformer over the batch's rows."""
    total = 0.0
    for row, t in zip(ids, targets):
        logits = ref.transformer(row, P)
        top = logits.max(-1)
        lse = top + np.log(np.exp(logits - top[:, None]).sum(-1))
        total += (lse - logits[np.arange(len(row)), t]).sum()
    return total / ids.size


def test_loss_and_grads_match_finite_differences(on_backend, rng):
    config = DecoderConfig(vocab=40, d=16, h=2, n_layers=2, d_ff=24, max_len=32)
    P = config.init_params(seed=1, dtype=np.float64)
    ids, targets = rng.integers(0, 40, (3, 10)), rng.integers(0, 40, (3, 10))
    loss, grads = train.loss_and_grads(P, ids, targets)
    assert abs(loss - reference_loss(P, ids, targets)) < 1e-12
    assert grads["pos"] is None
    pairs = [(P["emb"], grads["emb"])]
    for p, g in zip(P["layers"], grads["layers"]):
        for key in ("ln1", "attn", "ln2", "ffn"):
            pairs += list(zip(p[key], g[key]))
    for x, gx in pairs:
        assert gx.shape == x.shape
        for _ in range(3):
            i = tuple(rng.integers(0, n) for n in x.shape)
            keep = x[i]
            x[i] = keep + 1e-6
            up = reference_loss(P, ids, targets)
            x[i] = keep - 1e-6
            down = reference_loss(P, ids, targets)
            x[i] = keep
            assert abs((up - down) / 2e-6 - gx[i]) < 1e-7 + 1e-5 * abs(gx[i])


def test_loss_and_grads_refuses_bad_batches():
    P = TINY.init_params()
    ids = np.zeros((2, 8), np.int64)
    with pytest.raises(ValueError, match="ids"):
        train.loss_and_grads(P, ids + 256, ids)
    with pytest.raises(ValueError, match="targets"):
        train.loss_and_grads(P, ids, ids[:, :4])
    with pytest.raises(TypeError, match="ids"):
        train.loss_and_grads(P, ids.astype(float), ids)
    with pytest.raises(ValueError, match="ids"):
        train.loss_and_grads(P, ids[0], ids[0])
    with pytest.raises(ValueError, match="positions"):
        train.loss_and_grads(P, np.zeros((1, 65), np.int64), np.zeros((1, 65), np.int64))


def test_adamw_and_clipping_follow_their_formulas(rng):
    P = TINY.init_params(seed=3)
    before = [a.copy() for a in train.parameters(P)]
    def noise(arrays):
        return tuple(rng.standard_normal(np.shape(a)).astype(np.float32) for a in arrays)

    layer = P["layers"][0]
    grads = {"emb": noise([P["emb"]])[0], "pos": None,
             "layers": [{key: noise(layer[key]) for key in ("ln1", "attn", "ln2", "ffn")} | {"h": 2}]}

    def global_norm():
        arrays = [g.astype(np.float64) for g in train.parameters(grads) if g is not None]
        return np.sqrt(sum(float((g ** 2).sum()) for g in arrays))

    norm = global_norm()
    assert abs(train.clip_grad_norm(grads, 1.0) - norm) < 1e-3 * norm
    clipped = global_norm()
    assert abs(clipped - 1.0) < 1e-4
    opt = train.AdamW(P, lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    opt.step(grads)
    opt.step(grads)
    for p, p0, g in zip(train.parameters(P), before, train.parameters(grads)):
        if g is None:  # the positions: held fixed
            np.testing.assert_array_equal(p, p0)
            continue
        x, m, v = p0.astype(np.float64), 0.0, 0.0
        for t in (1, 2):
            m, v = 0.9 * m + 0.1 * g, 0.95 * v + 0.05 * g.astype(np.float64) ** 2
            if p.ndim == 2:
                x = x * (1 - 1e-2 * 0.1)
            x = x - 1e-2 * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.95 ** t)) + 1e-8)
        np.testing.assert_allclose(p, x, rtol=1e-4, atol=1e-5)
    with pytest.raises(ValueError, match="lr"):
        train.AdamW(P, lr=0)
    with pytest.raises(ValueError, match="max_norm"):
        train.clip_grad_norm(grads, -1)


TEXT = b"the quick brown fox jumps over the lazy dog. " * 40 + b"pack my box with five dozen jugs. " * 40


def test_loss_falls_and_resume_repeats_the_losses(tmp_path):
    kw = dict(batch=4, seq=24, config=TINY, lr=3e-3, warmup=5, seed=5)
    whole = train.train_text(TEXT, tmp_path / "whole", steps=60, every=20, **kw)
    assert np.mean(whole[-10:]) < np.mean(whole[:10]) - 1.0, (whole[:10], whole[-10:])
    part = train.train_text(TEXT, tmp_path / "split", steps=40, every=20, **kw)
    assert part == whole[:40]
    resumed = train.train_text(TEXT, tmp_path / "split", steps=60, every=20, resume=True, **kw)
    assert resumed == whole  # the same losses, bit for bit
    P, state, meta = train.load_checkpoint(tmp_path / "split")
    assert meta["step"] == 60 and state["t"] == 60
    with pytest.raises(ValueError, match="another text"):
        train.train_text(TEXT[:-1], tmp_path / "split", steps=70, every=20, resume=True, **kw)


def test_a_killed_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    P = TINY.init_params()
    opt = train.AdamW(P)
    train.save_checkpoint(tmp_path, P, opt, {"step": 1, "losses": [5.0]})
    good = (tmp_path / "checkpoint.npz").read_bytes()

    def dies(f, **arrays):
        f.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(np, "savez", dies)
    with pytest.raises(KeyboardInterrupt):
        train.save_checkpoint(tmp_path, P, opt, {"step": 2, "losses": [5.0, 4.0]})
    assert (tmp_path / "checkpoint.npz").read_bytes() == good
    assert os.listdir(tmp_path) == ["checkpoint.npz"]  # no temporary left behind
    monkeypatch.undo()
    assert train.load_checkpoint(tmp_path)[2]["step"] == 1


def test_the_train_and_complete_commands(tmp_path):
    pytest.importorskip("tqdm", reason="pip install silkattn[train]")
    pytest.importorskip("matplotlib", reason="pip install silkattn[train]")
    text = tmp_path / "corpus.txt"
    text.write_bytes(TEXT)
    out = tmp_path / "run"
    common = [sys.executable, "-m", "silkattn", "train", "--text", str(text), "--batch", "2", "--seq", "16",
              "--d", "16", "--heads", "2", "--layers", "1", "--d-ff", "32", "--out", str(out), "--every", "3"]
    done = subprocess.run(common + ["--steps", "6"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "6 steps" in done.stdout and (out / "checkpoint.npz").is_file()
    assert (out / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    done = subprocess.run(common + ["--steps", "9", "--resume"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "9 steps" in done.stdout and train.load_checkpoint(out)[2]["step"] == 9
    done = subprocess.run([sys.executable, "-m", "silkattn", "complete", "--checkpoint", str(out), "the ",
                           "--max-new-tokens", "8"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("the ") and len(done.stdout.rstrip("\n")) > len("the ")


def test_the_commands_refuse_bad_input_with_a_message(tmp_path):
    pytest.importorskip("tqdm", reason="pip install silkattn[train]")
    short = tmp_path / "short.txt"
    short.write_bytes(b"too short")
    cases = [(["train", "--text", str(short), "--seq", "64", "--steps", "1", "--d", "16", "--heads", "2",
               "--layers", "1", "--d-ff", "16", "--out", str(tmp_path / "o")], "fewer than seq"),
             (["train", "--text", str(tmp_path / "missing.txt"), "--steps", "1"], "cannot read --text"),
             (["train", "--text", str(short), "--steps", "0"], "--steps must be at least 1"),
             (["train", "--text", str(short), "--d", "10", "--heads", "3"], "train:"),
             (["complete", "--checkpoint", str(tmp_path / "nothing"), "hi"], "cannot read a checkpoint")]
    for argv, message in cases:
        done = subprocess.run([sys.executable, "-m", "silkattn", *argv], capture_output=True, text=True,
                              timeout=300)
        assert done.returncode != 0 and message in done.stderr, (argv, done.stderr[-500:])
        assert "Traceback" not in done.stderr, done.stderr
