"""patch(module): swap a NumPy model module's reference-named functions for silkattn's."""
import contextlib

from . import models, ops

# the listing's function names -> silkattn's versions on the current backend
LISTING = {"softmax": ops.softmax, "attention": ops.attention, "layer_norm": ops.layer_norm,
           "multi_head": models.multi_head, "feed_forward": models.feed_forward, "block": models.block,
           "transformer": models.transformer}

_SAVED = "__silkattn_originals__"


def patch(module):
    """Replace every function in `module` named like a listing function (softmax, attention,
    multi_head, layer_norm, feed_forward, block, transformer) by silkattn's; unpatch(module)
    restores them."""
    saved = module.__dict__.setdefault(_SAVED, {})
    for name, fast in LISTING.items():
        if name not in saved and callable(getattr(module, name, None)):
            saved[name] = getattr(module, name)
            setattr(module, name, fast)
    return module


def unpatch(module):
    """Put back the functions patch() replaced."""
    for name, original in module.__dict__.pop(_SAVED, {}).items():
        setattr(module, name, original)
    return module


@contextlib.contextmanager
def patched(module):
    """with silkattn.patched(my_model): ... runs my_model on silkattn's kernels inside the block."""
    patch(module)
    try:
        yield module
    finally:
        unpatch(module)
