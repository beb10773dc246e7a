"""Builds the compiled kernels: kernels/<op>.pyx -> silkattn._cy.<op>. Metadata lives in pyproject.toml.

What it builds, and what it writes into silkattn/_build_info.py for silkattn.backends() to report:
  - portable kernels by default: no -march=native, every instruction-set copy (generic, AVX2, AVX-512)
    compiled in and the one the CPU has chosen at run time, so the same binary (a wheel) runs on any
    x86-64 at full speed;
  - no C compiler: nothing compiled, one warning, and silkattn installs with the Numba backend only;
  - a compiler without OpenMP: single-threaded kernels and a warning (scikit-learn's rule);
  - MSVC (no GCC/Clang vector extensions): as with no compiler.

Environment switches (read at build time):
  SILKATTN_NATIVE=1       -march=native: kernels for this CPU alone (a local build, never a wheel)
  SILKATTN_BOUNDSCHECK=1  Cython bounds and initialisation checks on, and the C kernels built with
                          AddressSanitizer (run with LD_PRELOAD=$(gcc -print-file-name=libasan.so)),
                          so any out-of-bounds read or write stops with a report
"""
import glob
import os
import sys
import tempfile

from setuptools import Extension, setup

# Largest first: build_ext -j hands modules out in this order, and layer_step and linear_q take
# most of a build's compile time (4-5 minutes each on one core), the other ten 2 minutes together
OPS = ["layer_step", "linear_q", "attention", "linear", "attention_backward", "layer_norm", "rms_norm",
       "softmax", "feed_forward", "matmul_int8", "rope", "silu_mul"]
# Compiled modules that are not ops: bytepair, the Llama 3 / Qwen2 tokenizers' encoder
TOOLS = ["bytepair"]
# Flags of one op's module only. rope: no FMA contraction, so that x c - y s rounds each product as
# NumPy does and the result is the reference's to the last bit (kernels/tmpl_rope.h).
OP_FLAGS = {"rope": ["-ffp-contract=off"]}
BUILD_INFO = os.path.join("src", "silkattn", "_build_info.py")


def _flag(name):
    return os.environ.get(name, "0") not in ("", "0")


def _say(message):
    """One line on stderr: pip shows it with -v, `python -m build` always."""
    print(f"silkattn: {message}", file=sys.stderr, flush=True)


# The kernels need GCC/Clang vector extensions: a compiler without them (MSVC) cannot build them.
PROBE = "typedef float v4 __attribute__((vector_size(16)));\nint main(void) { v4 a = {1, 2, 3, 4}; " \
        "return (int)(a * a)[0] - 1; }\n"
OMP_PROBE = "#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n"
# OpenMP's flags, tried in turn: (compile, link). GCC and LLVM's clang take -fopenmp; Apple's clang
# needs -Xpreprocessor and libomp (Homebrew's, found through CFLAGS/LDFLAGS; delocate vendors it).
OMP_FLAGS = [(["-fopenmp"], ["-fopenmp"]), (["-Xpreprocessor", "-fopenmp"], ["-lomp"])]


def _compiler():
    from setuptools._distutils import ccompiler, sysconfig

    cc = ccompiler.new_compiler()
    sysconfig.customize_compiler(cc)
    return cc


def _builds(code, cflags=(), ldflags=()):
    """True when the C compiler setuptools would use compiles and links `code` with these flags."""
    cc = _compiler()
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "probe.c")
        with open(src, "w") as f:
            f.write(code)
        try:
            objs = cc.compile([src], output_dir=tmp, extra_postargs=list(cflags))
            cc.link_executable(objs, os.path.join(tmp, "probe"), extra_postargs=list(ldflags))
            return True
        except Exception:  # a missing compiler, header or library: any failure means no
            return False


def _no_compiler_reason():
    """Why the kernels cannot be compiled here, or None when they can."""
    if _builds(PROBE):
        return None
    if _compiler().compiler_type == "msvc":
        return "MSVC cannot compile the kernels' GCC/Clang vector extensions"
    return "no C compiler found at install time"


def _write_build_info(cython, march, openmp):
    with open(BUILD_INFO, "w") as f:
        f.write('"""How the compiled kernels were built: written by setup.py, not kept in git."""\n'
                f"CYTHON = {cython!r}  # 'built', or 'not built (the reason)'\n"
                f"MARCH = {march!r}  # 'portable' (every ISA copy, chosen at run time) or 'native'\n"
                f"OPENMP = {openmp!r}  # False: single-threaded kernels\n")


def extensions():
    """The kernel modules to compile, or [] (and a warning) where no C compiler works."""
    reason = _no_compiler_reason()
    if reason:
        _say(f"WARNING: {reason}: installing without the cython backend (the numba backend runs every op). "
             "Install gcc or clang and reinstall, or install a wheel, for the compiled kernels.")
        _write_build_info(f"not built ({reason})", None, False)
        return []
    import numpy
    from Cython.Build import cythonize

    omp, omp_link = next(((c, ln) for c, ln in OMP_FLAGS if _builds(OMP_PROBE, c, ln)), ([], []))
    if not omp:
        _say("WARNING: the C compiler has no OpenMP: building single-threaded kernels")
    native = _flag("SILKATTN_NATIVE")
    _say(f"building {'native (-march=native)' if native else 'portable'} kernels"
         f"{'' if omp else ' without OpenMP'}")
    _write_build_info("built", "native" if native else "portable", bool(omp))
    # -Wno-psabi: wide vectors are passed by value between static functions only, so no ABI is at stake
    # SILKATTN_OPT=-O0: a quicker build (a fifth of -O1's time) with slow kernels (the tests that
    # build from source take it: what they test is the build, not the kernels' speed)
    opt = os.environ.get("SILKATTN_OPT", "-O3")
    if opt not in ("-O0", "-O1", "-O2", "-O3"):
        raise SystemExit(f"SILKATTN_OPT must be -O0, -O1, -O2 or -O3, got {opt!r}")
    checks = _flag("SILKATTN_BOUNDSCHECK")
    # Build time: SA_GENERIC_O2, the x86 generic copy at -O2 in an -O3 build (kernels/instances.h);
    # -g0, no debug information (Python's CFLAGS ask for it; it took linear_q from 241 to 373 s of
    # gcc 12, and a wheel is stripped of it), except in a checked build, whose reports cite lines
    cflags = [opt, "-fno-math-errno", "-Wno-psabi"] + (["-march=native"] if native else []) + \
        (["-DSA_GENERIC_O2"] if opt == "-O3" else []) + ([] if checks else ["-g0"])
    sanitize = ["-fsanitize=address", "-fno-omit-frame-pointer"] if checks else []
    directives = dict(language_level=3, boundscheck=checks, initializedcheck=checks, wraparound=False,
                      cdivision=True, nonecheck=False, embedsignature=True)
    tools = [f"kernels/{name}.h" for name in TOOLS]  # a tool's header rebuilds the tool alone
    depends = [h for h in glob.glob("kernels/*.h") if h not in tools] + glob.glob("kernels/*.pxi")
    modules = [Extension(f"silkattn._cy.{op}", [f"kernels/{op}.pyx"],
                         include_dirs=["kernels", numpy.get_include()],
                         depends=depends + ([f"kernels/{op}.h"] if op in TOOLS else []),
                         extra_compile_args=cflags + sanitize + OP_FLAGS.get(op, []) + omp,
                         extra_link_args=omp_link + sanitize + ["-lm"])
               for op in OPS + TOOLS]
    return cythonize(modules, compiler_directives=directives, nthreads=os.cpu_count() or 1)


# build_ext -j: the modules compile two (or more) at a time
setup(ext_modules=extensions(), options={"build_ext": {"parallel": os.cpu_count() or 1}})
