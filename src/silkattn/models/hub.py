"""A model named by its Hugging Face Hub repository, as llama.cpp's `-hf` and ollama's pull name
one: `Org/Repo-GGUF` (the repository's Q4_K_M file, else its only or first GGUF file),
`Org/Repo-GGUF:Q8_0` (the file of that quantization), or `Org/Repo-GGUF:name.gguf` (that file).

The file comes through huggingface_hub: its cache (HF_HUB_CACHE / HF_HOME, shared with transformers
and llama.cpp's downloads), its offline mode (HF_HUB_OFFLINE=1: only what the cache holds), its
progress bar and its token for gated repositories. Without a network the cache's copy of the
repository is used, as huggingface_hub does. Files a model cannot load alone are never chosen: a
vision projector (mmproj-*) or a part of a split file (-00001-of-00003.gguf)."""
import os
import re

DEFAULT = "Q4_K_M"  # what llama.cpp's -hf picks when no quantization is named
TIMEOUT = 10  # seconds for the Hub's list of a repository's files
_NAME = re.compile(r"^(?:hf\.co/|https://huggingface\.co/)?([A-Za-z0-9][\w.-]*/[\w.-]+?)(?::([\w.+-]+))?$")
_SPLIT = re.compile(r"-\d{5}-of-\d{5}\.gguf$")


def parse(name):
    """(repository, selector or None) of a Hub name, or None where `name` is not one (a path)."""
    if not isinstance(name, str) or os.path.exists(name):
        return None
    m = _NAME.match(name)
    if m is None or m.group(1).endswith(".gguf"):
        return None
    return m.group(1), m.group(2)


def _hub():
    try:
        import huggingface_hub
    except ImportError as e:
        raise ImportError("models named by their Hub repository need huggingface_hub: "
                          "pip install \"silkattn[llm]\"") from e
    return huggingface_hub


def choose(files, selector, repo):
    """The GGUF file of `files` a selector names (a quantization such as Q4_K_M, any case, or a
    file name); without one, the Q4_K_M file, else the only or first GGUF file."""
    ggufs = sorted(f for f in files if f.lower().endswith(".gguf")
                   and not os.path.basename(f).lower().startswith("mmproj") and not _SPLIT.search(f))
    if not ggufs:
        split = sorted(f for f in files if _SPLIT.search(f))
        extra = f" (it has split files, which silkattn does not load: {', '.join(split[:3])})" \
            if split else ""
        raise ValueError(f"model: the Hub repository {repo} has no GGUF file silkattn can load{extra}")
    if selector is not None and selector.lower().endswith(".gguf"):
        hits = [f for f in ggufs if f == selector or os.path.basename(f) == selector]
    else:
        want = (selector or DEFAULT).lower()
        pattern = re.compile(r"(^|[-._])" + re.escape(want) + r"([-._]|$)")
        hits = [f for f in ggufs if pattern.search(os.path.basename(f).lower()[:-len(".gguf")])]
        if not hits and selector is None:
            hits = ggufs
    if not hits:
        raise ValueError(f"model: the Hub repository {repo} has no GGUF file for {selector!r}; "
                         f"it has {', '.join(ggufs)}")
    return hits[0]


def _cached_files(hub, repo, cache_dir):  # -> file names of the repository's cached snapshot
    try:
        folder = hub.snapshot_download(repo, local_files_only=True, cache_dir=cache_dir)
    except Exception:  # noqa: BLE001 - huggingface_hub's "not in the cache" has several classes
        return []
    out = []
    for root, _, names in os.walk(folder):
        out += [os.path.relpath(os.path.join(root, n), folder) for n in names]
    return out


def resolve(name, cache_dir=None):
    """The local path of the GGUF file a Hub name (see the module) picks, downloaded into
    huggingface_hub's cache unless it is there; a ValueError naming what was missing."""
    parsed = parse(name)
    if parsed is None:
        raise ValueError(f"model: {name!r} is neither a file nor a Hub name (Org/Repo[:Q4_K_M])")
    repo, selector = parsed
    hub = _hub()
    from huggingface_hub import constants, errors
    offline = constants.HF_HUB_OFFLINE
    files, why = None, "HF_HUB_OFFLINE is set" if offline else None
    if not offline:
        try:
            # one request, no retries: without a network the cache answers at once
            files = [s.rfilename for s in hub.model_info(repo, timeout=TIMEOUT).siblings or []]
        except (errors.RepositoryNotFoundError, errors.GatedRepoError) as e:
            raise ValueError(f"model: no Hub repository {repo} that this machine may read "
                             f"({type(e).__name__}; a gated one needs `hf auth login`)") from None
        except Exception as e:  # noqa: BLE001 - no network: the cache's copy, as huggingface_hub does
            why = f"the Hub could not be reached ({type(e).__name__})"
    if files is None:
        files = _cached_files(hub, repo, cache_dir)
        if not any(f.lower().endswith(".gguf") for f in files):
            raise ValueError(f"model: {repo} is not in huggingface_hub's cache and {why}")
    filename = choose(files, selector, repo)
    try:
        return hub.hf_hub_download(repo, filename, cache_dir=cache_dir, local_files_only=why is not None)
    except Exception as e:  # noqa: BLE001 - the download's failures, whatever their class
        raise ValueError(f"model: {repo}/{filename} could not be fetched: {type(e).__name__}: {e}") from None


def path_of(model, cache_dir=None):
    """model itself where it is a path (or not a Hub name), else the file its Hub name picks."""
    return resolve(model, cache_dir) if parse(model) is not None else model
