"""House rules a reviewer would otherwise check by eye, on the checkout's sources: kernels take
records, not long positional lists (no function in silkattn/numba nor def in kernels/*.pyx with
more than 12 parameters); no function in src/ over 80 lines; one cache (silkattn._cache) for what
is made from a call's shape, none keyed by object ids."""
import ast
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
SRC = ROOT / "src" / "silkattn"
MAX_PARAMETERS = 12
MAX_LINES = 80

pytestmark = pytest.mark.skipif(not (SRC / "numba").is_dir() or not (ROOT / "kernels").is_dir(),
                                reason="needs the source checkout (src/ and kernels/)")


def functions(path):
    """(name, parameter count, lines) of every function defined in a Python file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + bool(a.vararg) + bool(a.kwarg)
            yield node.name, count, node.end_lineno - node.lineno + 1


def pyx_signatures(path):
    """(name, parameter count) of every def, cdef and cpdef function of a Cython file."""
    text = path.read_text()
    pattern = (r"^\s*c?p?def\s+(?:[\w\[\]\s\*]+\s+)?(\w+)\s*\(([^)]*)\)"  # name(parameters)
               r"\s*(?:(?:no)?except[^:]*)?(?:nogil)?\s*:")
    for m in re.finditer(pattern, text, re.M):
        params = [p for p in m.group(2).split(",") if p.strip()]
        yield m.group(1), len(params)


def test_no_kernel_entry_takes_more_than_twelve_parameters():
    wide = [f"{p.relative_to(ROOT)}:{name} ({n})" for p in sorted((SRC / "numba").glob("*.py"))
            for name, n, _ in functions(p) if n > MAX_PARAMETERS]
    wide += [f"{p.relative_to(ROOT)}:{name} ({n})" for p in sorted((ROOT / "kernels").glob("*.pyx"))
             for name, n in pyx_signatures(p) if n > MAX_PARAMETERS]
    assert not wide, f"kernels take records (silkattn._plan.Plan, silkattn._step.LayerStep): {wide}"


def test_the_pyx_signature_reader_sees_the_kernels():  # the test above could fail only if this holds
    names = {name for p in (ROOT / "kernels").glob("*.pyx") for name, _ in pyx_signatures(p)}
    assert {"attention", "layer_step", "softmax", "linear_q", "dequantize"} <= names


def test_no_function_is_longer_than_eighty_lines():
    long = [f"{p.relative_to(ROOT)}:{name} ({n} lines)" for p in sorted(SRC.rglob("*.py"))
            for name, _, n in functions(p) if n > MAX_LINES]
    assert not long, long


def test_one_cache():
    """Memo caches go through silkattn._cache (one eviction rule, one clear()), none keyed by id()."""
    offenders = []
    for p in sorted(SRC.rglob("*.py")):
        text = p.read_text()
        if re.search(r"lru_cache|functools\.cache\b", text):
            offenders.append(f"{p.relative_to(ROOT)}: functools cache")
        if re.search(r"\bmap\(id,|\bid\([^)]*\)\s*[,)]\s*#?.*key|key\s*=\s*\(?\s*id\(", text):
            offenders.append(f"{p.relative_to(ROOT)}: a key made of id()")
    assert not offenders, offenders
