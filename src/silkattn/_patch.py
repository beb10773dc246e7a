"""patch(module): swap a NumPy model module's reference-named functions for silkattn's."""
import contextlib

from . import models, ops

# the listing's function names -> silkattn's versions on the current backend
LISTING = {"softmax": ops.softmax, "attention": ops.attention, "layer_norm": ops.layer_norm,
           "multi_head": models.multi_head, "feed_forward": models.feed_forward, "block": models.block,
           "transformer": models.transformer, "rms_norm": ops.rms_norm, "rope": ops.rope,
           "swiglu": models.swiglu}

_SAVED = "__silkattn_originals__"


def patch(module):
    """Replace every function in `module` named like a listing function (softmax, attention,
    multi_head, layer_norm, feed_forward, block, transformer) or a Llama-family reference function
    (rms_norm, rope, swiglu) by silkattn's; unpatch(module) restores them. attention takes the
    reference's keywords (grouped K/V heads, causal, q_offset, scale, ...)."""
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
