"""The backend registry: a dict from name to the module that implements the kernels.

Every module offers softmax(x, *, out=None), attention(Q, K, V, mask=None, *, causal=False,
out=None) and layer_norm(X, g, b, eps=1e-5, *, out=None) with the reference's results.
"""
import contextlib
import contextvars
import importlib
import os

# name -> module path, fastest first: the default is the first that imports.
MODULES = {"cython": "silkattn.cython", "numba": "silkattn.numba", "numpy": "silkattn._numpy"}

_global = os.environ.get("SILKATTN_BACKEND") or None  # named explicitly: must exist when first used
_scoped = contextvars.ContextVar("silkattn_backend", default=None)  # use_backend(), per thread/task


def backends():
    """{name: "available" or the reason it is not} for every backend silkattn knows."""
    status = {}
    for name, path in MODULES.items():
        try:
            module = importlib.import_module(path)
        except ImportError as e:
            status[name] = f"unavailable: {e}"
            continue
        status[name] = "available" + ("" if getattr(module, "OPENMP", True) else " (built without OpenMP: single-threaded)")
    return status


_imported = {}  # module path -> module: every top-level call looks its backend up (~1 us saved a call)


def load(name):
    """The module of backend `name`; ValueError for an unknown name, ImportError if it is missing."""
    if name not in MODULES:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(MODULES)}")
    path = MODULES[name]
    if path not in _imported:
        try:
            _imported[path] = importlib.import_module(path)
        except ImportError as e:
            raise ImportError(f"silkattn backend {name!r} is not available: {e}") from e
    return _imported[path]


_default_name = None


def _default():
    global _default_name
    if _default_name is None:
        for name in MODULES:
            try:
                load(name)
            except ImportError:
                continue
            _default_name = name
            break
    return _default_name  # numpy always imports


def get_backend():
    """The name of the backend the top-level functions run on now."""
    return _scoped.get() or _global or _default()


def module():
    return load(get_backend())


def set_backend(name):
    """Run the top-level functions on backend `name` from now on; returns the previous name."""
    global _global
    load(name)
    previous, _global = get_backend(), name
    return previous


@contextlib.contextmanager
def use_backend(name):
    """with silkattn.use_backend("numba"): ... runs the block (in this thread only) on that backend."""
    load(name)
    token = _scoped.set(name)
    try:
        yield name
    finally:
        _scoped.reset(token)
