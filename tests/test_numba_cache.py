"""Numba's on-disk cache never runs stale machine code: every kernel's cache entries are keyed by a
hash of all of silkattn.numba's sources (numba/_jit.py), so editing a helper in another file
recompiles the kernels that inline it, where Numba's own key (the defining file's time and size)
would load the old code."""
import importlib
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

numba = pytest.importorskip("numba")

from silkattn.numba import _jit  # noqa: E402

KERNEL = textwrap.dedent("""
    import glob
    import os

    import numba

    from silkattn.numba import _jit

    from .helper import h

    HERE = os.path.dirname(os.path.abspath(__file__))
    Cache = _jit.stamped_cache(_jit.sources_stamp(sorted(glob.glob(os.path.join(HERE, "*.py")))))


    @numba.njit
    def k(x):
        return h(x) * 10


    k._cache = Cache(k.py_func)
""")
HELPER = "import numba\n\n\n@numba.njit(inline='always')\ndef h(x):\n    return x + {}\n"
RUN = "from pkg.kernel import k; print(k(1.0), k.stats.cache_hits.get(k.signatures[0], 0))"


def test_an_edited_helper_in_another_file_is_recompiled(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "kernel.py").write_text(KERNEL)

    def run():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path)] + sys.path))
        env.pop("NUMBA_CACHE_DIR", None)
        done = subprocess.run([sys.executable, "-c", RUN], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        value, hits = done.stdout.split()
        return float(value), int(hits)

    (pkg / "helper.py").write_text(HELPER.format(1))
    assert run() == (20.0, 0)           # compiled, and cached
    assert run() == (20.0, 1)           # loaded from the cache
    (pkg / "helper.py").write_text(HELPER.format(2))
    assert run() == (30.0, 0)           # the helper's edit reached the kernel: compiled anew


def test_every_cached_kernel_uses_the_package_stamp():
    """Each dispatcher of silkattn.numba that caches at all caches under _jit.STAMP."""
    import silkattn.numba  # noqa: F401  (imports every kernel module)
    if numba.config.DISABLE_JIT:
        pytest.skip("no dispatchers with NUMBA_DISABLE_JIT")
    seen = 0
    for name in ("attention", "softmax", "layer_norm", "rms_norm", "rope", "silu_mul", "linear", "linear_q",
                 "feed_forward", "layer_step"):
        module = importlib.import_module(f"silkattn.numba.{name}")
        for _, obj in inspect.getmembers(module, lambda o: isinstance(o, numba.core.dispatcher.Dispatcher)):
            if obj.__module__ != module.__name__ or obj.targetoptions.get("inline", "never") != "never":
                continue
            cache = obj._cache
            assert isinstance(cache, (_jit.PackageCache, numba.core.caching.NullCache)), (name, obj)
            assert not isinstance(cache, numba.core.caching.NullCache) or not _jit_cache_on(), (name, obj)
            seen += 1
    assert seen > 20


def _jit_cache_on():
    from silkattn.numba import _simd
    return _simd.CACHE


def test_the_stamp_changes_with_any_source(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("x = 1\n")
    b.write_text("y = 2\n")
    before = _jit.sources_stamp([a, b])
    assert _jit.sources_stamp([a, b]) == before
    b.write_text("y = 3\n")
    assert _jit.sources_stamp([a, b]) != before
    assert _jit.STAMP == _jit.sources_stamp(_jit.SOURCES)
