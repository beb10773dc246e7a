"""The other kernel copies (kernels/instances.h), forced with SILKATTN_ISA, pass the same kernel suite:
generic (16-byte vectors), avx2 where the CPU has AVX-512 (the copy AVX2-only CPUs run), avx2x64 (the
AVX-512 copy's 16-lane float code compiled for AVX2, so its logic is tested on any AVX2 CPU) and
avx512 itself where the CPU has it. The copy this CPU runs by default is the main suite's."""
import os
import subprocess
import sys

import pytest

import silkattn.cython

HERE = os.path.dirname(os.path.abspath(__file__))
KERNEL_SUITE = ["test_attention.py", "test_attention_varlen.py", "test_attention_paged.py", "test_softmax.py",
                "test_layer_norm.py", "test_linear.py", "test_bias_gelu.py", "test_bias_relu.py",
                "test_add_layer_norm.py", "test_rms_norm.py", "test_rope.py", "test_silu_mul.py",
                "test_linear_q.py", "test_matmul_int8.py"]


def run(code_or_args, isa, **env):
    env = dict(os.environ, SILKATTN_ISA=isa, **env)
    return subprocess.run([sys.executable, *code_or_args], env=env, capture_output=True, text=True, cwd=HERE)


def test_isa_can_be_forced():
    for isa in ("generic", "avx2x64"):
        proc = run(["-c", "import silkattn.cython as c; print(c.ISA)"], isa)
        assert proc.returncode == 0, proc.stderr
        assert proc.stdout.strip() == isa
    bad = run(["-c", "import silkattn.cython"], "sse9")
    assert bad.returncode != 0 and "SILKATTN_ISA" in bad.stderr


def has_avx512():
    return run(["-c", "import silkattn.cython"], "avx512").returncode == 0


def skip_unless_another_copy_runs(isa):
    if isa == silkattn.cython.ISA:
        pytest.skip(f"{isa} is this CPU's own copy: the main suite runs it")
    if isa == "avx512" and not has_avx512():
        pytest.skip("this CPU has no AVX-512 (F, DQ, VL, BW): its 16-lane code runs as avx2x64 instead")
    if isa in ("avx2", "avx2x64") and silkattn.cython.ISA == "generic":
        pytest.skip("this CPU has no AVX2")


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx2x64", "avx512"])
def test_every_copy_passes_the_kernel_suite(isa):
    skip_unless_another_copy_runs(isa)
    proc = run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "cython", *KERNEL_SUITE], isa)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


@pytest.mark.parametrize("isa", ["generic", "avx2", "avx2x64", "avx512"])
def test_every_copy_reads_and_writes_a_float16_cache(isa):
    """The fused steps over a float16 KV cache in each copy: F16C's conversions in the AVX2 (8 lanes,
    two of them for avx2x64's 16) and AVX-512 copies, the integer ones in the generic copy; the rows
    written to the bit as numpy rounds them (tests/test_layer_step.py's float16 cases)."""
    skip_unless_another_copy_runs(isa)
    proc = run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "cython and float16",
                "test_layer_step.py"], isa)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_avx512_without_vnni_passes_the_int8_suite():
    """On a CPU with AVX-512 VNNI the int8 products run their avx512vnni copy; SILKATTN_VNNI=0 sends
    them to the avx512 copy's own integer code (vpmaddwd, vpmaddubsw), which CPUs with AVX-512 and no
    VNNI (Skylake-X) run: the same suites, through it."""
    if not has_avx512():
        pytest.skip("this CPU has no AVX-512 (F, DQ, VL, BW)")
    probe = "from silkattn._cy import matmul_int8 as m; print(m.INSTRUCTION)"
    assert run(["-c", probe], "avx512", SILKATTN_VNNI="0").stdout.strip() == "vpmaddwd"
    proc = run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "cython", "test_linear_q.py",
                "test_matmul_int8.py", "test_layer_step.py"], "avx512", SILKATTN_VNNI="0")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout


def test_numba_64_byte_vectors_pass_the_kernel_suite():
    """The Numba kernels at 512 bits (SILKATTN_NUMBA_VBYTES=64: what a CPU with AVX-512F gets), on any
    CPU; float32, where 16 lanes a register change the code's shape. Without a cache: a minute. On a
    CPU whose Numba kernels are 512-bit already the main suite runs them."""
    from silkattn.numba import _simd
    if _simd.VBYTES == 64 and not _simd._FORCED:
        pytest.skip("the Numba kernels are 512-bit on this CPU: the main suite runs them")
    env = dict(os.environ, SILKATTN_NUMBA_VBYTES="64")
    files = ["test_attention.py", "test_attention_varlen.py", "test_softmax.py", "test_layer_norm.py",
             "test_linear.py", "test_rms_norm.py", "test_rope.py", "test_silu_mul.py", "test_linear_q.py"]
    command = [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k",
               "numba and float32 and not 2threads", *files]
    proc = subprocess.run(command, env=env, capture_output=True, text=True, cwd=HERE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
