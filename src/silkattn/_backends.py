"""The backend registry: a dict from name to the module that exports the backend's Kernels record.

A record lists a backend's kernels in the contract silkattn._api documents. A field set to None
means the backend has no kernel for that op: the op then runs its NumPy fallback (silkattn._api).
The "numpy" backend is a record with no kernels at all, i.e. the reference behind the same checks.
"""
import contextlib
import contextvars
import dataclasses
import importlib
import os
import warnings
from typing import Callable, NamedTuple, Optional

Kernel = Optional[Callable]


class TileGeometry(NamedTuple):
    """An attention kernel's query tiles (silkattn._plan): rows of a tile by default, the most rows
    a tile may have, and the rows of a register block tile heights are rounded to."""
    bq: int = 64
    max_bq: int = 64
    mr: int = 4


@dataclasses.dataclass(frozen=True)
class Kernels:
    """One backend's kernels. The first three must be stated (None where the backend leaves the op
    to NumPy); the fused ones are optional."""

    name: str
    softmax: Kernel
    layer_norm: Kernel
    attention: Kernel               # attention(plan, num_threads): silkattn._plan
    attention_tiles: TileGeometry = TileGeometry()  # the query tiles attention's plan is cut into
    attention_backward: Kernel = None  # dQ, dK, dV from the forward's plan (silkattn._api's contract)
    softmax_backward: Kernel = None  # (dy, y, dx, num_threads): rows of y (dy - rowsum(dy y))
    layer_norm_backward: Kernel = None  # (dy, x, g, eps, dx, parts, block, num_threads): dg|db a block
    rms_norm_backward: Kernel = None  # (dy, x, g, eps, dx, dg, block, num_threads): dg a block of rows
    gelu_backward: Kernel = None    # (dh, z, dz, num_threads): dz = dh gelu'(z) over rows
    linear: Kernel = None           # x W (+ b) for a few rows of x: a decoding step's projections
    linear_q: Kernel = None         # the same with W as GGUF blocks (silkattn.quant.QuantizedMatrix)
    linear_qx: Kernel = None        # linear_q for the kinds after quant.ROW_KINDS (float32 activations)
    bias_relu: Kernel = None        # h = max(h + b, 0) in place (the feed-forward's elementwise step)
    bias_gelu: Kernel = None        # h = gelu(h + b) in place (the exact, erf GELU)
    add_layer_norm: Kernel = None   # s = x + r and layer_norm(s) in one pass (residual + next norm)
    rms_norm: Kernel = None         # g x / sqrt(mean(x^2) + eps) per row (the Llama family's norm)
    add_rms_norm: Kernel = None     # s = x + r and rms_norm(s) in one pass
    rope: Kernel = None             # rotary positions over strided rows, from _api's cos/sin tables
    silu_mul: Kernel = None         # silu(g) u over strided rows (the SwiGLU gate)
    gelu_tanh_mul: Kernel = None    # gelu_tanh(g) u, the same way (the GeGLU gate)
    dequantize: Kernel = None       # rows of GGUF blocks to float32 (a prefill's panels of W)
    gemm: Kernel = None             # x W for many rows on silkattn's team: a BLAS sgemm a thread (_blas)
    gemm_q: Kernel = None           # the same with W as GGUF blocks, dequantized a panel a thread
    gemm_q8: Kernel = None          # the same with int8 activations as integer products (AVX-512 VNNI)
    matmul_int8: Kernel = None      # int8 A (m, k) B (k, n) summed exactly in int32 (the integer GEMM)
    pack_rows16: Kernel = None      # blocks in groups of 16 rows for linear_qx's and layer_step's int8
    #                                 products (quant.ROWS16), where this CPU's copy runs them (VNNI)
    layer_step: Kernel = None       # one decoder layer for one token from its record (silkattn._step)
    layer_step_rows: Kernel = None  # the same for a batch's rows through several layers in one call,
    #                                 each row over its own cache of a pool
    isa: str = "numpy"              # the instruction set the kernels run with
    openmp: bool = True             # False: built without OpenMP, single-threaded


# name -> module path, fastest first: the default is the first that imports.
MODULES = {"cython": "silkattn.cython", "numba": "silkattn.numba", "numpy": "silkattn._numpy"}

_global = os.environ.get("SILKATTN_BACKEND") or None  # named explicitly: must exist when first used
_scoped = contextvars.ContextVar("silkattn_backend", default=None)  # use_backend(), per thread/task
_loaded = {}  # module path -> Kernels: every top-level call looks its backend up


def _build_info():
    """How setup.py built the C kernels here (silkattn/_build_info.py); None in an unbuilt checkout."""
    try:
        from . import _build_info
    except ImportError:
        return None
    return _build_info


def _not_built(name):
    """The reason setup.py left backend `name` out of this install ("not built (...)"), or None."""
    info = _build_info()
    if name != "cython" or info is None or info.CYTHON == "built":
        return None
    return info.CYTHON


def load(name):
    """The Kernels record of backend `name`; ValueError for an unknown name, ImportError if missing."""
    if name not in MODULES:
        raise ValueError(f"unknown backend {name!r}: choose one of {', '.join(MODULES)}")
    path = MODULES[name]
    record = _loaded.get(path)
    if record is None:
        try:
            record = _loaded[path] = importlib.import_module(path).KERNELS
        except ImportError as e:
            raise ImportError(f"silkattn backend {name!r} is not available: {e}") from e
    return record


def backends():
    """{name: "available (its kernel copy and build)" or why it is not} for every backend silkattn knows."""
    status = {}
    for name in MODULES:
        try:
            record = load(name)
        except ImportError as e:
            status[name] = _not_built(name) or f"unavailable: {e.__cause__ or e}"
            continue
        info = _build_info() if name == "cython" else None
        notes = [record.isa] if name != "numpy" else []
        notes += [f"{info.MARCH} build"] if info is not None and info.CYTHON == "built" else []
        notes += [] if record.openmp else ["built without OpenMP: single-threaded"]
        status[name] = "available" + (f" ({', '.join(notes)})" if notes else "")
    return status


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
        skipped = _not_built("cython")
        if skipped:  # pip hides the build's own warning: say it where the user sees it
            warnings.warn(f"silkattn: the cython backend was {skipped}; running on {_default_name}. "
                          "Reinstall with a C compiler (gcc or clang), or from a wheel, for it.",
                          RuntimeWarning, stacklevel=3)
    return _default_name  # numpy always imports


def get_backend():
    """The name of the backend the top-level functions run on now."""
    return _scoped.get() or _global or _default()


def kernels():
    """The Kernels record of the backend the top-level functions run on now."""
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
