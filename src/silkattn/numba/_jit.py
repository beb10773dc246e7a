"""How silkattn.numba's kernels are compiled: numba.njit with the GIL released, cached on disk with
entries keyed by the sources of the whole backend rather than by the one file a function is in.

Numba's own cache checks the modification time and size of the defining file only, but a kernel's
machine code holds the helpers it inlines or calls from other modules (every kernel inlines _simd's
intrinsics; layer_step.py calls linear_q.py's products; the attention kernels read _plan's
constants): after such a helper's file changed, Numba would load stale code. Here every cached
function's index carries one stamp, STAMP, a hash of the text of every module of silkattn.numba and
of silkattn._plan, so that any edit there makes every entry stale; each is compiled afresh on first
use and its entry rewritten. Numba's own checks stay (its version, the CPU and its features).
"""
import glob
import hashlib
import os

import numba
from numba.core import caching

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = sorted(glob.glob(os.path.join(HERE, "*.py"))) + [os.path.join(os.path.dirname(HERE), "_plan.py")]


def sources_stamp(paths):
    """A hash of the files' names and bytes: equal exactly when no file changed."""
    digest = hashlib.sha256()
    for path in paths:
        with open(path, "rb") as f:
            digest.update(os.path.basename(path).encode() + b"\0" + f.read() + b"\0")
    return digest.hexdigest()


STAMP = sources_stamp(SOURCES)


def stamped_cache(stamp):
    """A Numba function cache class whose index entries are valid only under `stamp`: Numba's
    locators (a NUMBA_CACHE_DIR, __pycache__ beside the source, the user's cache folder), each with
    the source stamp replaced."""
    class Stamp:
        def get_source_stamp(self):
            return stamp

    base = caching.FunctionCache._impl_class
    locators = [type(f"Stamped{c.__name__}", (Stamp, c), {}) for c in base._locator_classes]
    impl = type("StampedCacheImpl", (base,), {"_locator_classes": locators})
    return type("StampedFunctionCache", (caching.FunctionCache,), {"_impl_class": impl})


PackageCache = stamped_cache(STAMP)


def jit(cache=True, **options):
    """numba.njit(nogil=True, **options), its compiled code cached on disk under STAMP (cache=False:
    not cached, e.g. when the code depends on a setting forced for one process)."""
    def compile_later(f):
        dispatcher = numba.njit(nogil=True, **options)(f)
        if cache and not numba.config.DISABLE_JIT and options.get("inline", "never") == "never":
            dispatcher._cache = PackageCache(dispatcher.py_func)
        return dispatcher
    return compile_later
