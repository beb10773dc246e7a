"""The house's one-way rule, read from the imports themselves: the models, the server, training and
Dask reach the kernels through the public ops and records (silkattn.ops, silkattn.quant, the
records of silkattn._step through ops.layer_step_record, silkattn.tools), never through the ops'
bookkeeping (_api), the attention plan (_plan), the backend registry (_backends) or a kernel module
(silkattn._cy, silkattn.cython, silkattn.numba)."""
import ast
import os

import silkattn

PACKAGE = os.path.dirname(os.path.abspath(silkattn.__file__))
ABOVE_OPS = ["models", "serve.py", "dask.py"]  # models/ holds training (models/train.py) too
BELOW_OPS = ("silkattn._api", "silkattn._plan", "silkattn._backends", "silkattn._cy", "silkattn.cython",
             "silkattn.numba")


def _files():
    for entry in ABOVE_OPS:
        path = os.path.join(PACKAGE, entry)
        if entry.endswith(".py"):
            yield path
            continue
        for folder, _, names in os.walk(path):
            yield from (os.path.join(folder, n) for n in sorted(names) if n.endswith(".py"))


def _module(path):
    parts = os.path.relpath(path, PACKAGE)[:-3].split(os.sep)
    return ".".join(["silkattn", *(parts[:-1] if parts[-1] == "__init__" else parts)])


def imported(path):
    """The absolute names a module imports, every import statement (at the top or inside a
    function): `from .. import _api` gives silkattn._api."""
    name = _module(path)
    package = name if path.endswith("__init__.py") else name.rsplit(".", 1)[0]
    found = set()
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            found.update(f"{base}.{alias.name}" for alias in node.names)
            found.add(base)
    return found


def below(name):
    return next((b for b in BELOW_OPS if name == b or name.startswith(b + ".")), None)


def test_the_models_server_training_and_dask_import_no_bookkeeping_or_kernels():
    crossings = {(_module(p), below(n)) for p in _files() for n in imported(p) if below(n)}
    assert crossings == set(), "imports below the ops"


def test_the_rule_reads_relative_and_absolute_imports(tmp_path):
    """The reader sees what the rule must catch, however the import is written."""
    models = os.path.join(PACKAGE, "models")
    assert "silkattn.ops" in imported(os.path.join(models, "runner.py"))  # from .. import ops
    assert "silkattn._plan" in imported(os.path.join(PACKAGE, "ops.py"))  # from . import ..., _plan
    assert _module(os.path.join(models, "__init__.py")) == "silkattn.models"
    assert below("silkattn._cy.bytepair") == "silkattn._cy" and below("silkattn.ops") is None
    assert below("silkattn._api.product_ops.few_rows") == "silkattn._api"
