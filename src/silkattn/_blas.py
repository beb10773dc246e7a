"""numpy's BLAS on silkattn's thread count while silkattn's own calls run it.

silkattn's ops hand their large products to numpy's matmul (a prefill's projections, a batch's
feed-forward), and numpy's BLAS keeps a thread pool of its own, by default one thread a core. So
that silkattn.set_num_threads(n) governs every thread a silkattn call runs, those GEMMs run inside
threads(): the first silkattn call to enter sets the BLAS's count to silkattn's, the last one to
leave puts the user's count back, so numpy outside silkattn's calls keeps the user's setting.
(OpenBLAS's count is one per process: a GEMM the user runs on another Python thread while a
silkattn call is inside takes silkattn's count for that while.)

The BLAS is found among the libraries the process has loaded: OpenBLAS (numpy's wheels:
scipy_openblas_set_num_threads64_; a system one: openblas_set_num_threads), MKL
(MKL_Set_Num_Threads) or BLIS (bli_thread_set_num_threads). With none of them (Accelerate, a BLAS
without such a call) threads() changes nothing (controls() is then empty).

Better than two pools taking turns on the cores (OpenBLAS's threads for the GEMMs, silkattn's
OpenMP team for the rest, each spinning while the other works): where numpy's BLAS is OpenBLAS,
both backends' GEMM kernels (Kernels.gemm, gemm_q) run the GEMMs on silkattn's own team,
each thread calling the library's sgemm (sgemm()) on its panel of the output, the library's
threads held at one. One team then runs the whole forward pass.
"""
import contextlib
import ctypes
import threading
from typing import NamedTuple

from . import _threads

# (what the library's file name contains, the setters and the getters of its thread count, by
# the names its builds export them under)
CONTROLS = (
    ("openblas", ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads",
                  "openblas_set_num_threads64_", "openblas_set_num_threads"),
     ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
      "openblas_get_num_threads")),
    ("mkl", ("MKL_Set_Num_Threads",), ("MKL_Get_Max_Threads",)),
    ("blis", ("bli_thread_set_num_threads",), ("bli_thread_get_num_threads",)),
)


def _loaded_libraries():
    """Paths of the shared libraries this process has loaded (Linux), else []."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if ".so" in line.rsplit("/", 1)[-1]})
    except OSError:
        return []


def _find():
    """[(set, get)] for each BLAS found: ctypes functions taking and returning an int."""
    found = []
    for path in _loaded_libraries():
        name = path.rsplit("/", 1)[-1].lower()
        for key, sets, gets in CONTROLS:
            if key not in name:
                continue
            try:
                lib = ctypes.CDLL(path)
            except OSError:
                continue
            setter = next((getattr(lib, s) for s in sets if hasattr(lib, s)), None)
            getter = next((getattr(lib, g) for g in gets if hasattr(lib, g)), None)
            if setter is not None and getter is not None:
                setter.argtypes, getter.restype = [ctypes.c_int], ctypes.c_int
                found.append((setter, getter))
    return found


# The CBLAS sgemm of numpy's OpenBLAS, for the GEMMs silkattn's own team of threads runs a panel a
# thread (kernels/gemm.h): (the symbol, whether its integers are 64-bit), in the order tried.
SGEMMS = (("scipy_cblas_sgemm64_", True), ("cblas_sgemm64_", True), ("scipy_cblas_sgemm", None),
          ("cblas_sgemm", None))


class Sgemm(NamedTuple):
    address: int   # the function's address
    ilp64: bool    # its integers are 64-bit


def _find_sgemm():
    """The first OpenBLAS's Sgemm, or None. A symbol without the 64 suffix is 64-bit when the
    library says USE64BITINT in its openblas_get_config."""
    for path in _loaded_libraries():
        if "openblas" not in path.rsplit("/", 1)[-1].lower():
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        config = next((getattr(lib, g) for g in ("scipy_openblas_get_config64_", "scipy_openblas_get_config",
                                                   "openblas_get_config64_", "openblas_get_config")
                       if hasattr(lib, g)), None)
        if config is None:
            continue
        config.restype = ctypes.c_char_p
        wide = b"USE64BITINT" in (config() or b"")
        for name, ilp64 in SGEMMS:
            if hasattr(lib, name):
                return Sgemm(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value,
                             wide if ilp64 is None else ilp64)
    return None


_sgemm = False  # not looked up yet


def sgemm():
    """numpy's OpenBLAS sgemm (Sgemm), or None where numpy uses another BLAS (the GEMMs then go
    through numpy's matmul on the BLAS's own threads, held at silkattn's count)."""
    global _sgemm
    if _sgemm is False:
        import numpy  # noqa: F401  (its BLAS is loaded with it)
        _sgemm = _find_sgemm()
    return _sgemm


_controls = None
_lock = threading.Lock()
_users = 0    # silkattn calls inside threads() now
_saved = []   # the BLAS counts the first of them found


def controls():
    """The BLAS thread controls found (looked up once, after numpy has loaded its BLAS)."""
    global _controls
    if _controls is None:
        import numpy  # noqa: F401  (its BLAS is loaded with it)
        _controls = _find()
    return _controls


@contextlib.contextmanager
def threads(n=None):
    """The block's BLAS calls run on n threads, by default silkattn.get_num_threads() (see the
    module doc); n=1 for the sgemm calls silkattn's own team makes."""
    global _users, _saved
    found = controls()
    if not found:
        yield
        return
    n = _threads.get_num_threads() if n is None else n
    with _lock:
        if _users == 0:
            _saved = [get() for _, get in found]
        _users += 1
        for set_, get in found:
            if get() != n:
                set_(n)
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0:
                for (set_, get), count in zip(found, _saved):
                    if get() != count:
                        set_(count)
