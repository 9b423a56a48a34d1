"""A markdown table of run directories: the final value of each metric, mean ± std across each group's runs.

    python scripts/summarize.py runs/HalfCheetah-v5__*                        # eval/return
    python scripts/summarize.py runs/* --metrics eval/success_once eval/return
    python scripts/summarize.py runs/mujoco_* --by_run                      # and each run's final eval/return

Runs are grouped into rows as scripts/plot.py groups them into curves (--group). "Final" is the last logged value
of a run; std is over the group's runs (numpy's default, ddof=0, as CleanRL's benchmark tables report it).
--by_run adds a column with each run's final value of the first metric, in the order of the run directories.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import group_runs, read_scalars, report_user_errors, run_dirs_parser  # noqa: E402


def table(run_dirs: list[Path], metrics: list[str], pattern: str, by_run: bool = False) -> str:
    by_run_header = f" {metrics[0]} by run |" if by_run else ""
    rows = ["| runs | n | " + " | ".join(f"{metric} (final)" for metric in metrics) + f" |{by_run_header} "
            "global step | wall time (min) |",
            "|---|---:|" + "---:|" * len(metrics) + "---|" * by_run + "---:|---:|"]
    for name, runs in group_runs(run_dirs, pattern).items():
        cells, steps, minutes, first_by_run = [], [], [], []
        for metric in metrics:
            finals = []
            for run in runs:
                step, seconds, values = read_scalars(run, metric)
                if len(values):
                    finals.append(values[-1])
                if metric == metrics[0]:  # the step, time and by-run columns: where and what the first metric logged
                    first_by_run.append(f"{values[-1]:.4g}" if len(values) else "-")
                    if len(values):
                        steps.append(step[-1])
                        minutes.append(seconds[-1] / 60)
            cells.append(f"{np.mean(finals):.4g} ± {np.std(finals):.3g}" if finals else "-")
        if by_run:
            cells.append(", ".join(first_by_run))
        step_cell = f"{np.mean(steps):.0f}" if steps else "-"
        minute_cell = f"{np.mean(minutes):.1f}" if minutes else "-"
        rows.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + f" | {step_cell} | {minute_cell} |")
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = run_dirs_parser(__doc__)
    parser.add_argument("--by_run", action="store_true", help="add each run's final value of the first metric")
    options = parser.parse_args(argv)
    return report_user_errors(lambda: print(table(options.runs, options.metrics, options.group, options.by_run)))


if __name__ == "__main__":
    sys.exit(main())
