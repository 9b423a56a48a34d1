"""A markdown table of run directories: the final value of each metric, mean ± std across each group's runs, or
their interquartile mean with its 95% stratified bootstrap interval; across tasks, rliable's aggregates.

    python scripts/summarize.py runs/HalfCheetah-v5__*                        # eval/return
    python scripts/summarize.py runs/* --metrics eval/success_once eval/return
    python scripts/summarize.py runs/mujoco_* --by_run                      # and each run's final eval/return
    python scripts/summarize.py runs/mujoco_* --iqm                         # IQM [95% interval] (pip install rliable)
    python scripts/summarize.py runs/*_*__seed* --group '_(\\w+?)__seed\\d+$' --tasks '^(.*?)_' \\
        --normalize Hopper-v5=0:3000 Walker2d-v5=0:4000 --compare ppo my_idea  # across tasks: IQM, ..., P(X > Y)

Runs are grouped into rows as scripts/plot.py groups them into curves (--group); a --num_seeds run directory
stands for its seeds' runs inside it (runs/RUN/RUN__seed{S}), a row of as many runs. "Final" is the last logged value
of a run; std is over the group's runs (numpy's default, ddof=0, as CleanRL's benchmark tables report it).
--by_run adds a column with each run's final value of the first metric, in the order of the run directories.
--iqm reports the interquartile mean (the mean of the middle half of the runs' final values; of fewer than 4, the
mean) and its 95% bootstrap interval, as Agarwal et al. (2021) recommend over a mean ± std of few seeds.
--tasks names each run's task (its first group, else the whole match): the rows are then --group's groups (the
algorithms), each over all its tasks: rliable's IQM, mean, median and optimality gap (of scores below 1) of the
first metric, with 95% stratified bootstrap intervals (runs resampled within each task). Scores of different tasks
are made comparable with --normalize TASK=LOW:HIGH ((score - LOW) / (HIGH - LOW): a random and a reference score;
success rates need none). --compare X Y adds the probability that a run of X scores above a run of Y on a task.
Every group needs the same tasks, and the same number of runs on each. rliable is optional: pip install rliable.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import UserError, group_runs, interval_estimates, read_scalars, report_user_errors, rliable  # noqa: E402
from plot import run_dirs_parser, task_scores  # noqa: E402


def table(run_dirs: list[Path], metrics: list[str], pattern: str, by_run: bool = False, iqm_reps: int = 0) -> str:
    by_run_header = f" {metrics[0]} by run |" if by_run else ""
    statistic = "final IQM [95% interval]" if iqm_reps else "final"
    rows = ["| runs | n | " + " | ".join(f"{metric} ({statistic})" for metric in metrics) + f" |{by_run_header} "
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
            if finals and iqm_reps:
                point, interval = interval_estimates({"runs": np.array(finals)[:, None]}, iqm, iqm_reps)
                cells.append(f"{point['runs'][0]:.4g} [{interval['runs'][0, 0]:.4g}, {interval['runs'][1, 0]:.4g}]")
            else:
                cells.append(f"{np.mean(finals):.4g} ± {np.std(finals):.3g}" if finals else "-")
        if by_run:
            cells.append(", ".join(first_by_run))
        step_cell = f"{np.mean(steps):.0f}" if steps else "-"
        minute_cell = f"{np.mean(minutes):.1f}" if minutes else "-"
        rows.append(f"| {name} | {len(runs)} | " + " | ".join(cells) + f" | {step_cell} | {minute_cell} |")
    return "\n".join(rows)


def iqm(scores: np.ndarray) -> np.ndarray:
    _, metrics = rliable()
    return np.array([metrics.aggregate_iqm(scores)])


def across_tasks(run_dirs: list[Path], metric: str, pattern: str, task_pattern: str, normalize: list[str],
                 compare: list[str], reps: int) -> str:
    """rliable's aggregates of each group's normalized final scores over all its tasks, and P(X > Y)."""
    _, metrics = rliable()
    matrices, task_names = task_scores(run_dirs, metric, pattern, task_pattern, normalize)
    aggregates = {"IQM": metrics.aggregate_iqm, "mean": metrics.aggregate_mean, "median": metrics.aggregate_median,
                  "optimality gap": metrics.aggregate_optimality_gap}
    point, interval = interval_estimates(matrices, lambda x: np.array([f(x) for f in aggregates.values()]), reps)
    rows = [f"{metric}, final, normalized, over {len(task_names)} tasks: {', '.join(task_names)}", "",
            "| group | runs per task | " + " | ".join(aggregates) + " |", "|---|---:|" + "---:|" * len(aggregates)]
    for name, matrix in matrices.items():
        cells = [f"{point[name][i]:.3g} [{interval[name][0, i]:.3g}, {interval[name][1, i]:.3g}]"
                 for i in range(len(aggregates))]
        rows.append(f"| {name} | {matrix.shape[0]} | " + " | ".join(cells) + " |")
    if compare:
        x, y = compare
        missing = [n for n in compare if n not in matrices]
        if missing:
            raise UserError(f"--compare: no group {missing[0]!r}; the groups are {', '.join(matrices)}")
        point, interval = interval_estimates({"pair": (matrices[x], matrices[y])}, metrics.probability_of_improvement,
                                             reps)
        low, high = interval["pair"].ravel()
        rows += ["", f"P({x} > {y}) = {float(point['pair']):.3g} [{low:.3g}, {high:.3g}]"]
    return "\n".join(rows)


def main(argv: list[str] | None = None) -> int:
    parser = run_dirs_parser(__doc__)
    parser.add_argument("--by_run", action="store_true", help="add each run's final value of the first metric")
    parser.add_argument("--compare", nargs=2, metavar=("X", "Y"), help="with --tasks: P(a run of X beats one of Y)")
    options = parser.parse_args(argv)
    if options.tasks is not None:
        return report_user_errors(lambda: print(across_tasks(
            options.runs, options.metrics[0], options.group, options.tasks, options.normalize, options.compare,
            options.reps)))
    iqm_reps = options.reps if options.iqm else 0
    return report_user_errors(lambda: print(table(options.runs, options.metrics, options.group, options.by_run,
                                                  iqm_reps)))


if __name__ == "__main__":
    sys.exit(main())
