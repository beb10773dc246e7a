"""patch(module): swap a NumPy model module's reference-named functions for silkattn's."""
import contextlib

from . import model

_SAVED = "__silkattn_originals__"


def patch(module):
    """Replace every function in `module` named like a reference op (softmax, attention, multi_head,
    layer_norm, feed_forward, block, transformer) by silkattn's; unpatch(module) restores them."""
    saved = module.__dict__.setdefault(_SAVED, {})
    for name in model.OPS:
        if name not in saved and callable(getattr(module, name, None)):
            saved[name] = getattr(module, name)
            setattr(module, name, getattr(model, name))
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
