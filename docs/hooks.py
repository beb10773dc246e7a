"""mkdocs hook: the benchmarks page's latest run, rendered from the JSON `python -m silkattn bench
--json PATH` writes (bench.json at the repository's top, or $SILKATTN_BENCH_JSON), by the same table
code the command prints, so no figure on that page is typed by hand."""
import json
import os

MARKER = "<!-- bench:latest -->"


def _latest(path):
    from silkattn import _bench

    with open(path) as f:
        run = json.load(f)
    results = {int(t): r for t, r in run["seconds"].items()}
    ours = [c for c in run["contenders"] if c in ("cython", "numba")]
    m = run["machine"]
    head = (f"cpu: {m.get('cpu')} ({m.get('cores')} cores; {m.get('cpu_isa')}); silkattn kernels: "
            f"{m.get('silkattn_isa')} (cython), {m.get('numba_simd')} (numba); {run['rounds']} alternating "
            f"rounds, medians; contenders: {', '.join(run['contenders'])}")
    table = _bench.table(run["cases"], results, run["contenders"], ours)
    return f"From `{os.path.basename(path)}`:\n\n```text\n{head}\n{table}\n```\n"


def on_page_markdown(markdown, page, config, files, **kwargs):
    if MARKER not in markdown:
        return markdown
    path = os.environ.get("SILKATTN_BENCH_JSON") or os.path.join(os.path.dirname(config["config_file_path"]),
                                                                  "bench.json")
    if not os.path.exists(path):
        table = (f"No `{path}` at build time: `python -m silkattn bench --json bench.json`, then "
                 "`mkdocs build`, puts the latest run here.\n")
    else:
        table = _latest(path)
    return markdown.replace(MARKER, table)
