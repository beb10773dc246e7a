"""The tests of a promise that numpy's BLAS could break run under each OpenBLAS setting in BLAS_SETTINGS,
whatever the machine's environment holds (a pytest plugin, loaded by conftest.py).

numpy's OpenBLAS picks its kernel by the CPU, or by OPENBLAS_CORETYPE where that is set (some AMD
EPYC machines' environments set OPENBLAS_CORETYPE=Haswell and OPENBLAS_L2_SIZE=512). Kernels differ
in how a row's sums depend on the call around it: with the Haswell one a row of X W comes out in
other last bits when the call has other rows before or after it, or W another number of columns.
A test marked `blas` states what silkattn promises on any BLAS; in the main run its body does not
run in this process: the marked tests the session collected run in one child pytest a setting
(the variables of the setting set, the others removed), and each marked test passes when it passed
under every setting, fails naming the setting and the child's report where it failed there, and is
skipped where it was skipped under all of them. The child runs them as this session would
(SILKATTN_BLAS_SETTING set: the hook below then leaves them alone).
"""
import json
import os
import subprocess
import sys
import tempfile

import pytest

VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
BLAS_SETTINGS = {
    "openblas-own-choice": {},  # neither variable: the library's kernel for this CPU
    "openblas-haswell-l2-512": {"OPENBLAS_CORETYPE": "Haswell", "OPENBLAS_L2_SIZE": "512"},
}
CHILD = os.environ.get("SILKATTN_BLAS_SETTING")  # this process is a child below, under that setting
TIMEOUT = 1500  # seconds a child may take: a hang fails the marked tests, not the whole CI run


def pytest_configure(config):
    config.addinivalue_line("markers", "blas: a promise that must hold under every OpenBLAS setting of "
                                       "tests/blas_settings.py (run there in a child pytest each)")


def pytest_runtest_logreport(report):
    """In a child: each marked test's phases, for the parent to read."""
    path = os.environ.get("SILKATTN_BLAS_REPORT")
    if CHILD and path and "blas" in report.keywords:
        text = report.longreprtext if report.outcome != "passed" else ""
        if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
            text = report.longrepr[2]  # the skip's reason
        with open(path, "a") as f:
            f.write(json.dumps({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
                                "text": text}) + "\n")


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    if CHILD or pyfuncitem.get_closest_marker("blas") is None:
        return None
    failed, skipped = [], []
    for setting, (phases, tail) in _children(pyfuncitem.session).items():
        mine = phases.get(pyfuncitem.nodeid)
        if mine is None:
            failed.append(f"under {setting}: no report (the child ended: {tail})")
        elif any(outcome == "failed" for outcome, _ in mine.values()):
            text = "\n".join(t for outcome, t in mine.values() if outcome == "failed")
            failed.append(f"under {setting}:\n{text[-4000:]}")
        elif any(outcome == "skipped" for outcome, _ in mine.values()):
            skipped.append(next(t for outcome, t in mine.values() if outcome == "skipped"))
    if failed:
        pytest.fail("\n\n".join(failed), pytrace=False)
    if len(skipped) == len(BLAS_SETTINGS):
        pytest.skip(f"under every OpenBLAS setting: {skipped[0]}")
    return True


def _children(session):  # -> {setting: ({nodeid: {phase: (outcome, text)}}, how the child ended)}
    """The marked tests of the session, run once in a child pytest a setting (the first marked
    test to run asks; the others read what it found)."""
    found = getattr(session, "_silkattn_blas", None)
    if found is not None:
        return found
    ids = [item.nodeid for item in session.items if item.get_closest_marker("blas") is not None]
    found = {}
    for setting, variables in BLAS_SETTINGS.items():
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "report.jsonl")
            env = {k: v for k, v in os.environ.items() if k not in VARIABLES}
            env.update(variables, SILKATTN_BLAS_SETTING=setting, SILKATTN_BLAS_REPORT=report)
            command = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-o", "addopts=",
                       "--rootdir", str(session.config.rootpath), *ids]
            try:
                run = subprocess.run(command, cwd=session.config.rootpath, env=env, capture_output=True,
                                     text=True, timeout=TIMEOUT)
                tail = f"exit status {run.returncode}: {(run.stdout + run.stderr)[-2000:]}"
            except subprocess.TimeoutExpired as e:
                tail = f"timed out after {TIMEOUT} s: {str(e.stdout or '')[-2000:]}"
            phases = {}
            if os.path.exists(report):
                with open(report) as f:
                    for line in f:
                        r = json.loads(line)
                        phases.setdefault(r["nodeid"], {})[r["when"]] = (r["outcome"], r["text"])
        found[setting] = (phases, tail)
    session._silkattn_blas = found
    return found
