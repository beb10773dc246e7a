"""Installs as a user gets them. From source where the C kernels cannot be built as asked: no C
compiler (silkattn installs with the Numba backend alone and says why) and a compiler without OpenMP
(single-threaded kernels, said so): each builds the checkout with pip into a temporary folder, slow, so
marked `build` (`-m "not build"` leaves them out). And, where CI installed the repaired wheel
(SILKATTN_WHEEL_CHECK=1), what that install must be: no compiler on PATH, the package imported from
site-packages, portable kernels, the kernel copy this CPU has, libgomp vendored."""
import glob
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPILERS = ("cc", "gcc", "c++", "g++", "clang")
# what a pip build would not find in a clean checkout either (and the tree's own build products)
LEFT_OUT = shutil.ignore_patterns(".git", ".venv", "venv*", "build", "dist", "wheelhouse", "*.so", "*.c",
                                  "__pycache__", "*.egg-info", "_build_info.py", ".benchmarks",
                                  ".pytest_cache", ".hypothesis", "bench.json", "bench.png", "site")
needs_source = pytest.mark.skipif(not os.path.exists(os.path.join(ROOT, "setup.py")),
                                  reason="needs silkattn's source tree (setup.py) beside the tests")

CHECK = textwrap.dedent("""
    import json, warnings
    import numpy as np
    import silkattn
    from silkattn import reference
    x = np.random.default_rng(0).standard_normal((5, 33)).astype(np.float32)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        got = silkattn.softmax(x)
    print(json.dumps({"file": silkattn.__file__, "backends": silkattn.backends(),
                      "backend": silkattn.get_backend(), "warnings": [str(w.message) for w in seen],
                      "error": float(np.abs(got - reference.softmax(x)).max())}))
""")


def pip_install(tmp_path, **changes):
    """pip-installs a copy of the checkout into tmp_path/site (build isolation, as a user's pip does)
    with these environment changes (and no compiler settings of this shell's); returns pip's verbose
    output and what CHECK prints when run against that install."""
    source, site = tmp_path / "source", tmp_path / "site"
    shutil.copytree(ROOT, source, ignore=LEFT_OUT)
    inherited = ("CC", "CXX", "LDSHARED", "CFLAGS", "PYTHONPATH", "SILKATTN_NATIVE", "SILKATTN_BOUNDSCHECK",
                 "SILKATTN_OPT")
    env = {k: v for k, v in os.environ.items() if k not in inherited} | changes
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-v", "--no-deps", "--target", str(site),
                           str(source)], env=env, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run = subprocess.run([sys.executable, "-c", CHECK], env=dict(os.environ, PYTHONPATH=str(site)),
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    import json
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["file"].startswith(str(site))  # the install under test, not this session's silkattn
    return proc.stdout + proc.stderr, result


def real_compiler():
    """The C compiler's absolute path, looked for where it lives even when PATH hides it; or None."""
    name = (sysconfig.get_config_var("CC") or "gcc").split()[0]
    return shutil.which(name) or shutil.which(name, path="/usr/local/bin:/usr/bin:/bin")


@pytest.mark.build
@needs_source
def test_no_compiler_installs_numba_only(tmp_path):
    empty = tmp_path / "bin"
    empty.mkdir()
    log, result = pip_install(tmp_path, PATH=str(empty))  # pip runs by absolute path; no cc anywhere
    assert "WARNING: no C compiler found at install time" in log
    assert not glob.glob(str(tmp_path / "site" / "silkattn" / "_cy" / "*.so"))
    assert result["backends"]["cython"] == "not built (no C compiler found at install time)"
    assert result["backends"]["numba"].startswith("available")
    assert result["backend"] == "numba" and result["error"] < 1e-6
    said = [w for w in result["warnings"] if "cython backend was not built" in w]
    assert len(said) == 1 and "no C compiler found at install time" in said[0]


@pytest.mark.build
@needs_source
def test_compiler_without_openmp_builds_single_threaded(tmp_path):
    gcc = real_compiler()
    if gcc is None:
        pytest.skip("no C compiler on this machine")
    wrapper = tmp_path / "cc-without-openmp"
    wrapper.write_text('#!/bin/sh\nfor a; do [ "$a" = -fopenmp ] && { echo "no OpenMP" >&2; exit 1; }; done\n'
                       f'exec {gcc} "$@"\n')
    wrapper.chmod(0o755)
    # -O0: what is under test is the build without OpenMP, not the kernels' speed (-O1 took 6 of
    # CI's 20 minutes of tests here, -O0 a fifth of that)
    log, result = pip_install(tmp_path, CC=str(wrapper), SILKATTN_OPT="-O0")
    assert "WARNING: the C compiler has no OpenMP: building single-threaded kernels" in log
    assert result["backends"]["cython"].endswith("built without OpenMP: single-threaded)")
    assert result["backend"] == "cython" and result["error"] < 1e-6 and not result["warnings"]


@pytest.mark.skipif(os.environ.get("SILKATTN_WHEEL_CHECK") != "1",
                    reason="CI's check of the installed wheel (SILKATTN_WHEEL_CHECK=1)")
def test_installed_wheel_runs_where_nothing_compiles():
    import silkattn.cython
    from silkattn import _build_info

    assert [c for c in COMPILERS if shutil.which(c)] == []
    package = os.path.dirname(silkattn.__file__)
    paths = sysconfig.get_paths()
    assert os.path.dirname(package) in (paths["purelib"], paths["platlib"])  # site-packages, not the checkout
    assert _build_info.CYTHON == "built" and _build_info.MARCH == "portable" and _build_info.OPENMP
    assert glob.glob(os.path.join(os.path.dirname(package), "silkattn.libs", "libgomp*.so*"))  # auditwheel
    assert silkattn.cython.ISA == cpu_isa() and silkattn.cython.OPENMP


def cpu_isa():
    """The kernel copy kernels/isa.h picks for this CPU, read from /proc/cpuinfo's flags."""
    with open("/proc/cpuinfo") as f:
        flags = set(next(line for line in f if line.startswith("flags")).split(":")[1].split())
    if {"avx2", "fma", "f16c", "avx512f", "avx512dq", "avx512vl", "avx512bw"} <= flags:
        return "avx512"
    return "avx2" if {"avx2", "fma", "f16c"} <= flags else "generic"
