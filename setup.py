"""Builds the compiled kernels: kernels/<op>.pyx -> silkattn._cy.<op>. Metadata lives in pyproject.toml.

Environment switches (read at build time):
  SILKATTN_PORTABLE=1     no -march=native: a binary that runs on any x86-64 (the AVX2 kernels are
                          still compiled in and chosen at run time when the CPU has them)
  SILKATTN_BOUNDSCHECK=1  Cython bounds and initialisation checks on, and the C kernels built with
                          AddressSanitizer (run with LD_PRELOAD=$(gcc -print-file-name=libasan.so)),
                          so any out-of-bounds read or write stops with a report
"""
import glob
import os
import tempfile
import warnings

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

OPS = ["softmax", "layer_norm", "attention", "feed_forward", "linear", "linear_q", "rms_norm", "rope",
       "silu_mul", "layer_step"]
# Flags of one op's module only. rope: no FMA contraction, so that x c - y s rounds each product as
# NumPy does and the result is the reference's to the last bit (kernels/tmpl_rope.h).
OP_FLAGS = {"rope": ["-ffp-contract=off"]}


def _flag(name):
    return os.environ.get(name, "0") not in ("", "0")


def openmp_flags():
    """['-fopenmp'] when the compiler can build and link an OpenMP program, else [] and a warning."""
    from setuptools._distutils import ccompiler, sysconfig

    cc = ccompiler.new_compiler()
    sysconfig.customize_compiler(cc)
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "omp.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void) { return omp_get_max_threads() < 1; }\n")
        try:
            objs = cc.compile([src], output_dir=tmp, extra_postargs=["-fopenmp"])
            cc.link_executable(objs, os.path.join(tmp, "omp"), extra_postargs=["-fopenmp"])
            return ["-fopenmp"]
        except Exception:  # any compiler or linker failure means: no OpenMP here
            warnings.warn("silkattn: the compiler has no OpenMP; building single-threaded kernels")
            return []


omp = openmp_flags()
# -Wno-psabi: wide vectors are passed by value between static functions only, so no ABI is at stake
cflags = ["-O3", "-fno-math-errno", "-Wno-psabi"] + ([] if _flag("SILKATTN_PORTABLE") else ["-march=native"])
checks = _flag("SILKATTN_BOUNDSCHECK")
sanitize = ["-fsanitize=address", "-fno-omit-frame-pointer"] if checks else []
cflags += sanitize
directives = dict(language_level=3, boundscheck=checks, initializedcheck=checks, wraparound=False,
                  cdivision=True, nonecheck=False, embedsignature=True)
depends = glob.glob("kernels/*.h") + glob.glob("kernels/*.pxi")
extensions = [Extension(f"silkattn._cy.{op}", [f"kernels/{op}.pyx"],
                        include_dirs=["kernels", numpy.get_include()], depends=depends,
                        extra_compile_args=cflags + OP_FLAGS.get(op, []) + omp,
                        extra_link_args=omp + sanitize + ["-lm"])
              for op in OPS]

setup(ext_modules=cythonize(extensions, compiler_directives=directives))
