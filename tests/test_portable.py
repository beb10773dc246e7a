"""The generic (non-AVX2) kernels: forced with SILKATTN_ISA=generic, they must pass the same suite."""
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def run(code_or_args, isa):
    env = dict(os.environ, SILKATTN_ISA=isa)
    return subprocess.run([sys.executable, *code_or_args], env=env, capture_output=True, text=True, cwd=HERE)


def test_isa_can_be_forced():
    proc = run(["-c", "import silkattn.cython as c; print(c.ISA)"], "generic")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "generic"
    bad = run(["-c", "import silkattn.cython"], "sse9")
    assert bad.returncode != 0 and "SILKATTN_ISA" in bad.stderr


def test_generic_kernels_pass_the_kernel_suite():
    files = ["test_attention.py", "test_softmax.py", "test_layer_norm.py"]
    proc = run(["-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "-k", "cython", *files], "generic")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "failed" not in proc.stdout
