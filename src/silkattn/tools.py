"""Compiled helpers that are not ops (setup.py's TOOLS), for the models: each None where silkattn
runs without its compiled modules, so that the caller keeps its pure-Python way."""


def bytepair():
    """The compiled byte-level BPE encoder's module (kernels/bytepair.pyx: its BytePair class, the
    Llama 3 / Qwen2 pre-tokenizers written out as code and the merges by rank), or None."""
    try:
        from ._cy import bytepair as module
    except ImportError:
        return None
    return module
