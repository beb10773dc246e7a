"""Models named by their Hub repository (models.hub), against a cache laid out as huggingface_hub
lays it out (models--Org--Repo/refs/main, snapshots/<commit>/ linking to blobs/), with no network:
huggingface_hub's offline mode, and a Hub endpoint that refuses connections. The chat and complete
commands and load() take the name; the file picked is the one the name selects."""
import hashlib
import os
import socket
import subprocess
import sys

import pytest

pytest.importorskip("huggingface_hub", reason='pip install "silkattn[llm]"')

from silkattn.models import hub, llama  # noqa: E402

import llama_files  # noqa: E402

REPO, COMMIT = "silkattn-test/Tiny-GGUF", "0123456789abcdef0123456789abcdef01234567"
FILES = ["tiny-Q4_K_M.gguf", "tiny-Q8_0.gguf", "mmproj-tiny-F16.gguf"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """A huggingface_hub cache holding REPO at COMMIT: two models and a vision projector."""
    root = tmp_path_factory.mktemp("hf") / "hub"
    repo = root / ("models--" + REPO.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(COMMIT)
    snapshot, blobs = repo / "snapshots" / COMMIT, repo / "blobs"
    snapshot.mkdir(parents=True)
    blobs.mkdir()
    made = tmp_path_factory.mktemp("made")
    for name, kind, seed in zip(FILES, ["Q4_K", "Q8_0", "F32"], [0, 1, 2]):
        p = str(made / name)
        llama_files.write(p, kind, d=256, h=4, h_kv=2, d_ff=256, n_layers=1, context=64, seed=seed)
        data = open(p, "rb").read()
        blob = blobs / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        os.symlink(os.path.relpath(blob, snapshot), snapshot / name)
    (snapshot / "README.md").write_text("a test repository\n")
    return str(root), str(snapshot)


def _closed_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # nothing listens there once closed


def _cli(cache, args, offline=True):
    env = {**os.environ, "HF_HUB_CACHE": cache[0], "HF_HUB_DISABLE_TELEMETRY": "1"}
    env.pop("HF_HUB_OFFLINE", None)
    if offline:
        env["HF_HUB_OFFLINE"] = "1"
    else:  # a Hub that cannot be reached: huggingface_hub falls back to its cache
        env["HF_ENDPOINT"] = f"http://127.0.0.1:{_closed_port()}"
    return subprocess.run([sys.executable, "-m", "silkattn", *args], capture_output=True, text=True,
                          env=env, timeout=300)


@pytest.mark.parametrize("name, picked", [
    (REPO, "tiny-Q4_K_M.gguf"), (REPO + ":Q8_0", "tiny-Q8_0.gguf"), (REPO + ":q8_0", "tiny-Q8_0.gguf"),
    (REPO + ":tiny-Q8_0.gguf", "tiny-Q8_0.gguf"), ("hf.co/" + REPO + ":Q4_K_M", "tiny-Q4_K_M.gguf")])
def test_the_name_picks_its_file_offline(cache, monkeypatch, name, picked):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", cache[0])  # as HF_HUB_CACHE=... does, for load()
    path = hub.resolve(name, cache_dir=cache[0])
    assert os.path.basename(path) == picked and os.path.samefile(path, os.path.join(cache[1], picked))
    assert llama.load(name, activations="float32").path == path  # load() takes the name too


def test_commands_take_a_hub_name_without_a_network(cache):
    expected = llama.load(os.path.join(cache[1], "tiny-Q8_0.gguf")).complete("ab c", 5)
    for offline in (True, False):
        done = _cli(cache, ["complete", "--model", REPO + ":Q8_0", "--max-new-tokens", "5", "--threads", "1",
                            "ab c"], offline)
        assert done.returncode == 0, done.stderr[-2000:]
        assert done.stdout == "ab c" + expected + "\n"  # the text, then its continuation
    done = _cli(cache, ["chat", "--model", REPO, "--max-new-tokens", "3", "--threads", "1", "hi"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert "tiny-Q4_K_M.gguf" in done.stderr  # the stats line names the file picked


def test_what_a_name_cannot_give_is_refused_by_name(cache, monkeypatch):
    from huggingface_hub import constants
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ValueError, match="no GGUF file for 'Q5_K_M'; it has tiny-Q4_K_M.gguf, "
                                         "tiny-Q8_0.gguf"):
        hub.resolve(REPO + ":Q5_K_M", cache_dir=cache[0])
    with pytest.raises(ValueError, match="Other/Missing-GGUF is not in huggingface_hub's cache and "
                                         "HF_HUB_OFFLINE is set"):
        hub.resolve("Other/Missing-GGUF", cache_dir=cache[0])
    done = _cli(cache, ["complete", "--model", "Other/Missing-GGUF", "x"], offline=False)
    assert done.returncode != 0 and "could not be reached" in done.stderr


def test_choosing_among_a_repositorys_files():
    files = ["README.md", "m-Q4_K_S.gguf", "m-Q4_K_M.gguf", "m-IQ4_XS.gguf", "m-Q8_0.gguf",
             "mmproj-m-f16.gguf", "big/m-Q6_K-00001-of-00002.gguf", "big/m-Q6_K-00002-of-00002.gguf"]
    assert hub.choose(files, None, "r") == "m-Q4_K_M.gguf"
    assert hub.choose(files, "Q4_K_S", "r") == "m-Q4_K_S.gguf"
    assert hub.choose(files, "iq4_xs", "r") == "m-IQ4_XS.gguf"
    assert hub.choose(["only-F16.gguf", "mmproj-F16.gguf"], None, "r") == "only-F16.gguf"
    with pytest.raises(ValueError, match="no GGUF file for 'Q6_K'"):  # split files are not loaded
        hub.choose(files, "Q6_K", "r")
    with pytest.raises(ValueError, match="split files"):
        hub.choose(["a-00001-of-00002.gguf", "a-00002-of-00002.gguf"], None, "r")
    assert hub.parse("Org/Repo-GGUF:Q4_K_M") == ("Org/Repo-GGUF", "Q4_K_M")
    assert hub.parse("models/x.gguf") is None and hub.parse("x.gguf") is None and hub.parse(5) is None
