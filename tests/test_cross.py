"""The kernels off x86: their generic copy (GCC/Clang vector extensions) built for aarch64 with
Debian's cross compiler (gcc-aarch64-linux-gnu), every kernel module compiled that way, and the
generic row kernels checked against double-precision loops under qemu-user (tests/cross/). Skipped
where the cross tools are missing (CI has none); marked `build`: a few minutes."""
import os
import shutil
import subprocess
import sys
import sysconfig

import numpy
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KERNELS = os.path.join(ROOT, "kernels")
CROSS_CC, QEMU, SYSROOT = "aarch64-linux-gnu-gcc", "qemu-aarch64", "/usr/aarch64-linux-gnu"
CHECKED = ["SOFTMAX", "LAYER_NORM", "RMS_NORM", "SILU_MUL", "LINEAR"]  # tests/cross/generic_kernels.c
MODULES = ["softmax", "layer_norm", "attention", "feed_forward", "linear", "linear_q", "rms_norm", "rope",
           "silu_mul", "layer_step"]
CFLAGS = ["-O3", "-fno-math-errno", "-Wno-psabi"]  # setup.py's portable flags

pytestmark = [pytest.mark.build,
              pytest.mark.skipif(not os.path.isdir(KERNELS), reason="needs the source tree's kernels/")]
needs_cross = pytest.mark.skipif(shutil.which(CROSS_CC) is None, reason=f"no {CROSS_CC}")
needs_qemu = pytest.mark.skipif(shutil.which(QEMU) is None or not os.path.isdir(SYSROOT), reason="no qemu")


def build(cc, op, out):
    source = os.path.join(ROOT, "tests", "cross", "generic_kernels.c")
    proc = subprocess.run([cc, *CFLAGS, f"-I{KERNELS}", f"-DCHECK_{op}", source, "-lm", "-o", str(out)],
                          capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def assert_passes(command):
    proc = subprocess.run(command, capture_output=True, text=True)
    assert proc.returncode == 0 and proc.stdout.count(" ok") == 2 and "FAIL" not in proc.stdout, \
        proc.stdout + proc.stderr


@pytest.mark.parametrize("op", CHECKED)
def test_generic_copy_on_this_machine(op, tmp_path):
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler")
    build(cc, op, tmp_path / "check")
    assert_passes([str(tmp_path / "check")])


@needs_cross
@needs_qemu
@pytest.mark.parametrize("op", CHECKED)
def test_generic_copy_on_aarch64_under_qemu(op, tmp_path):
    build(CROSS_CC, op, tmp_path / "check")
    elf = (tmp_path / "check").read_bytes()[:20]
    assert elf[:4] == b"\x7fELF" and int.from_bytes(elf[18:20], "little") == 183  # EM_AARCH64
    assert_passes([QEMU, "-L", SYSROOT, str(tmp_path / "check")])


@needs_cross
@pytest.mark.parametrize("module", MODULES)
def test_every_kernel_module_compiles_for_aarch64(module, tmp_path):
    """The Cython module as setup.py builds it (OpenMP, every template), compiled, not linked: the
    x86 Python headers stand in for aarch64's, which differ in no type the module uses."""
    pytest.importorskip("Cython")
    c_file = tmp_path / f"{module}.c"
    proc = subprocess.run([sys.executable, "-m", "cython", "-3", "-I", KERNELS, "-o", str(c_file),
                           os.path.join(KERNELS, f"{module}.pyx")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    includes = [f"-I{KERNELS}", f"-I{sysconfig.get_paths()['include']}", f"-I{numpy.get_include()}"]
    proc = subprocess.run([CROSS_CC, *CFLAGS, "-fopenmp", "-fPIC", *includes, "-c", str(c_file),
                           "-o", str(tmp_path / f"{module}.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
