"""``benchmarks/results/sage/perf.md``: the hand-written text quotes the run whose tables it holds.

``perf_report.py`` rewrites only the tables between the AUTO markers; a re-run whose text is not
updated (tables of one run under text about another) fails here.
"""
import pathlib
import re

PERF_MD = pathlib.Path(__file__).resolve().parents[2] / "benchmarks/results/sage/perf.md"
BEGIN, END = "<!-- BEGIN AUTO -->", "<!-- END AUTO -->"


def test_the_introduction_quotes_the_run_of_the_tables():
    md = PERF_MD.read_text(encoding="utf-8")
    auto = md[md.index(BEGIN):md.index(END)]
    run = re.search(r"on (\d{4}-\d\d-\d\d \d\d:\d\d) \((\d+) s\), commit `(\w+)`", auto)
    assert run, "the AUTO block names no run"
    intro = " ".join(md[:md.index("## How to run")].split())
    quoted = f"the full run of {run[1]} UTC (commit `{run[3]}`), which took {run[2]} s"
    assert quoted in intro, f"perf.md's introduction does not quote its tables' run: {quoted!r}"
    day = run[1].split()[0]
    assert f"Short answer (the run of {day}" in intro
