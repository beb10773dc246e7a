"""The documentation site (docs/, mkdocs.yml): every op and every module is in it, and it builds with
`mkdocs build --strict` (a broken link, a missing page or a docstring mkdocstrings cannot render
fails). Skipped where the checkout's docs/ is absent (a wheel's tests) or the docs extra is not
installed."""
import os
import subprocess
import sys

import pytest

import silkattn
from silkattn import ops

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
pytestmark = pytest.mark.skipif(not os.path.isdir(DOCS), reason="needs the checkout's docs/")
GENERATED = {"silkattn._build_info"}  # written by setup.py at build time (docs/api.md says so)


def read(name):
    with open(os.path.join(DOCS, name), encoding="utf-8") as f:
        return f.read()


def modules():
    """Every Python module of the installed package, by its dotted name."""
    top = os.path.dirname(silkattn.__file__)
    for folder, _, files in os.walk(top):
        for file in files:
            if file.endswith(".py"):
                parts = os.path.relpath(os.path.join(folder, file), top)[:-3].split(os.sep)
                yield ".".join(["silkattn", *parts[:-1]] + ([] if parts[-1] == "__init__" else [parts[-1]]))


def test_every_op_has_its_semantics_documented():
    text = read("ops.md")
    assert [op for op in ops.OPS if f"`{op}" not in text] == []


def test_every_module_is_in_the_docs():
    text = "\n".join(read(name) for name in os.listdir(DOCS) if name.endswith(".md"))
    missing = sorted(m for m in modules()
                     if m not in GENERATED and f"::: {m}\n" not in text and f"`{m}`" not in text)
    assert missing == []


def test_the_site_builds_strictly(tmp_path):
    pytest.importorskip("mkdocs", reason="the docs extra is not installed (pip install 'silkattn[docs]')")
    pytest.importorskip("mkdocstrings", reason="the docs extra is not installed")
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(tmp_path / "site")]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          env=dict(os.environ, NO_MKDOCS_2_WARNING="1"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    with open(tmp_path / "site" / "api" / "index.html", encoding="utf-8") as f:
        api = f.read()
    assert all(f"silkattn.ops.{op}" in api for op in ops.OPS)  # each op's docstring rendered
