"""silkattn: fast, tested CPU transformer kernels behind the NumPy reference's API."""
from . import reference
from ._backends import backends
from ._threads import get_num_threads, set_num_threads

__version__ = "0.1.0"
__all__ = ["reference", "backends", "get_num_threads", "set_num_threads"]
