"""Learning curves from the TensorBoard logs of run directories: mean and 95% interval across seeds, one PNG per metric.

    python scripts/plot.py runs/HalfCheetah-v5__* --out plots/                      # eval/return vs steps and wall time
    python scripts/plot.py runs/* --metrics eval/success_once charts/SPS --out plots/
    python scripts/plot.py runs/* --group '^(.*)__seed\\d+$' --out plots/          # how run names map to curves

Runs are grouped into curves by name: --group is a regular expression whose first group (else whole match) names
the curve; by default a trailing seed is dropped from the run name (`__seed3` as scripts/sweep.sh names runs, or
the trainers' default `__{seed}__{unix time}`). Each run's curve is interpolated onto the steps (or seconds) of the
group's shortest run; the band is the 95% Student-t interval of the mean across the group's runs, and each run
is drawn thin. The y-axis spans the runs' values (the band of two or three seeds can reach far beyond them).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

DEFAULT_GROUP = r"^(.*?)(?:__seed\d+|__\d+__\d+)?$"
# Two-sided 95% quantiles of Student's t for 1..30 degrees of freedom; beyond, the normal's.
T_95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


class UserError(Exception):
    pass


def read_scalars(run_dir: Path, metric: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(global steps, seconds since the run's first event, values) of one metric; steps that a resume replaced
    are left out, as TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    accumulator = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    accumulator.Reload()
    if metric not in accumulator.Tags()["scalars"]:
        return np.array([]), np.array([]), np.array([])
    events = accumulator.Scalars(metric)
    start = min(e.wall_time for tag in accumulator.Tags()["scalars"] for e in accumulator.Scalars(tag)[:1])
    return (np.array([e.step for e in events], dtype=np.float64), np.array([e.wall_time - start for e in events]),
            np.array([e.value for e in events], dtype=np.float64))


def group_runs(run_dirs: list[Path], pattern: str) -> dict[str, list[Path]]:
    """Curve name -> its runs, in the order the names first appear."""
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise UserError(f"--group {pattern!r} is not a regular expression: {e}") from e
    groups = defaultdict(list)
    for run_dir in run_dirs:
        if not run_dir.is_dir():
            raise UserError(f"{run_dir} is not a run directory")
        match = regex.search(run_dir.name)
        if match is None:
            raise UserError(f"--group {pattern!r} does not match the run name {run_dir.name!r}")
        groups[match.group(1) if regex.groups else match.group(0)].append(run_dir)
    return dict(groups)


def mean_and_interval(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean over runs (axis 0) and the half-width of its 95% interval (0 for a single run)."""
    n = values.shape[0]
    mean = values.mean(0)
    if n == 1:
        return mean, np.zeros_like(mean)
    t = T_95[n - 2] if n - 1 <= len(T_95) else 1.96
    return mean, t * values.std(0, ddof=1) / np.sqrt(n)


def group_curve(curves: list[tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x of the shortest curve, and the mean and interval half-width of all curves interpolated onto it."""
    shortest = min((x for x, _ in curves), key=lambda x: x[-1])
    values = np.stack([np.interp(shortest, x, y) for x, y in curves])
    return (shortest, *mean_and_interval(values))


def plot(run_dirs: list[Path], metrics: list[str], pattern: str, out_dir: Path) -> list[Path]:
    try:
        import matplotlib
    except ImportError as e:
        raise UserError("plotting needs matplotlib: pip install matplotlib") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = group_runs(run_dirs, pattern)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for metric in metrics:
        figure, (by_step, by_time) = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
        plotted, low, high = 0, np.inf, -np.inf
        for name, runs in groups.items():
            series = [read_scalars(run, metric) for run in runs]
            series = [s for s in series if len(s[0]) > 0]
            if not series:
                continue
            plotted += 1
            label = f"{name} ({len(series)} run{'s' if len(series) > 1 else ''})"
            for axis, index, scale in ((by_step, 0, 1.0), (by_time, 1, 60.0)):
                curves = [(s[index] / scale, s[2]) for s in series]
                x, mean, half_width = group_curve(curves)
                line, = axis.plot(x, mean, label=label)
                axis.fill_between(x, mean - half_width, mean + half_width, color=line.get_color(), alpha=0.2)
                for run_x, run_y in curves:  # each run thin: with few seeds the t-interval is wide
                    axis.plot(run_x, run_y, color=line.get_color(), linewidth=0.6, alpha=0.5)
            values = np.concatenate([s[2] for s in series])
            low, high = min(low, values.min()), max(high, values.max())
        if plotted == 0:
            plt.close(figure)
            raise UserError(f"no run logged {metric!r}; the metrics are tags such as eval/return or charts/SPS")
        by_step.set_xlabel("global step")
        by_time.set_xlabel("wall time (minutes)")
        by_step.set_ylabel(metric)
        margin = 0.1 * (high - low) or 1.0
        by_step.set_ylim(low - margin, high + margin)  # the runs' range, not the band's, which few seeds widen a lot
        by_step.legend(fontsize="small")
        for axis in (by_step, by_time):
            axis.grid(alpha=0.3)
        figure.suptitle(f"{metric}: mean and 95% interval across runs")
        figure.tight_layout()
        path = out_dir / (metric.replace("/", "_") + ".png")
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written


def run_dirs_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments plot.py and summarize.py share: run directories, metrics and how runs are grouped."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    parser.add_argument("--metrics", nargs="+", default=["eval/return"], help="TensorBoard scalar tags")
    parser.add_argument("--group", default=DEFAULT_GROUP, help="regular expression naming a run's curve or row")
    return parser


def report_user_errors(work) -> int:
    """Run work(); a UserError becomes one error line and exit status 2."""
    try:
        work()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = run_dirs_parser(__doc__)
    parser.add_argument("--out", type=Path, default=Path("plots"), help="directory for the PNG files")
    options = parser.parse_args(argv)
    return report_user_errors(lambda: print(*plot(options.runs, options.metrics, options.group, options.out), sep="\n"))


if __name__ == "__main__":
    sys.exit(main())
