"""The backend registry: a dict from name to the module that implements the kernels."""
import importlib

# name -> module path; "numpy" is the reference itself.
MODULES = {"numpy": "silkattn.reference", "cython": "silkattn.cython"}


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
