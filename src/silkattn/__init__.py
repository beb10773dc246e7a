"""silkattn: fast, tested CPU transformer kernels behind the NumPy reference's API.

The top-level functions are the reference's (silkattn.reference) running on the fastest installed
backend; choose one with set_backend(name), `with use_backend(name):` or SILKATTN_BACKEND.
"""
from . import _openblas  # noqa: F401  (numpy's idle BLAS threads sleep: see the module)
from . import reference
from ._backends import backends, get_backend, set_backend, use_backend
from ._patch import patch, patched, unpatch
from ._threads import get_num_threads, set_num_threads
from .model import (attention, block, causal_mask, feed_forward, init_params, layer_norm, multi_head,
                    positional_encoding, softmax, transformer)

__version__ = "0.1.0"
__all__ = ["reference", "backends", "get_backend", "set_backend", "use_backend", "patch", "patched", "unpatch",
           "get_num_threads", "set_num_threads", "softmax", "attention", "multi_head", "layer_norm",
           "feed_forward", "block", "transformer", "positional_encoding", "causal_mask", "init_params"]
