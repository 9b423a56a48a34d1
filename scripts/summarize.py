"""A markdown table of run directories: the final value of each metric, mean ± std across each group's runs.

    python scripts/summarize.py runs/HalfCheetah-v5__*                        # eval/return
    python scripts/summarize.py runs/* --metrics eval/success_once eval/return

Runs are grouped into rows as scripts/plot.py groups them into curves (--group). "Final" is the last logged value
of a run; std is over the group's runs (numpy's default, ddof=0, as CleanRL's benchmark tables report it).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import DEFAULT_GROUP, UserError, group_runs, read_scalars  # noqa: E402


def table(run_dirs: list[Path], metrics: list[str], pattern: str) -> str:
    rows = ["| runs | n | " + " | ".join(f"{metric} (final)" for metric in metrics) + " | global step | wall time (min) |",
            "|---|---:|" + "---:|" * len(metrics) + "---:|---:|"]
    for name, runs in group_runs(run_dirs, pattern).items():
        cells, steps, minutes = [], [], []
        for metric in metrics:
            finals = []
            for run in runs:
                step, seconds, values = read_scalars(run, metric)
                if len(values):
                    finals.append(values[-1])
                    if metric == metrics[0]:  # the step and time columns: where the first metric's value was logged
                        steps.append(step[-1])
                        minutes.append(seconds[-1] / 60)
            cells.append(f"{np.mean(finals):.4g} ± {np.std(finals):.3g}" if finals else "-")
        step_cell = f"{np.mean(steps):.0f}" if steps else "-"
        minute_cell = f"{np.mean(minutes):.1f}" if minutes else "-"
        rows.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + f" | {step_cell} | {minute_cell} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    parser.add_argument("--metrics", nargs="+", default=["eval/return"], help="TensorBoard scalar tags")
    parser.add_argument("--group", default=DEFAULT_GROUP, help="regular expression naming a run's row (see plot.py)")
    options = parser.parse_args(argv)
    try:
        print(table(options.runs, options.metrics, options.group))
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
