"""Learning curves from the TensorBoard logs of run directories: mean and 95% interval across seeds, one PNG per metric
(or the interquartile mean and its stratified bootstrap interval); across tasks, rliable's performance profiles.

    python scripts/plot.py runs/HalfCheetah-v5__* --out plots/                      # eval/return vs steps and wall time
    python scripts/plot.py runs/* --metrics eval/success_once charts/SPS --out plots/
    python scripts/plot.py runs/* --group '^(.*)__seed\\d+$' --out plots/          # how run names map to curves
    python scripts/plot.py runs/HalfCheetah-v5__* --iqm --out plots/                # IQM (pip install rliable)
    python scripts/plot.py runs/*_*__seed* --group '_(\\w+?)__seed\\d+$' --tasks '^(.*?)_' \\
        --normalize Hopper-v5=0:3000 Walker2d-v5=0:4000 --out plots/              # performance profiles
    python scripts/plot.py runs/RUN --lineage --out plots/                          # a --pbt_interval run's lineage

Runs are grouped into curves by name: --group is a regular expression whose first group (else whole match) names
the curve; by default a trailing seed is dropped from the run name (`__seed3` as scripts/sweep.sh names runs, or
the trainers' default `__{seed}__{unix time}`); a --num_seeds run directory stands for its seeds' runs inside
it (runs/RUN/RUN__seed{S}), a curve of as many runs. Each run's curve is interpolated onto the steps (or seconds)
of the group's shortest run; the band is the 95% Student-t interval of the mean across the group's runs, and each
run is drawn thin. The y-axis spans the runs' values (the band of two or three seeds can reach far beyond them).
--iqm draws the interquartile mean instead (the mean of the middle half of the runs; of fewer than 4, the mean) and
its 95% bootstrap interval, each resample drawing whole runs (rliable's sample-efficiency curves). --tasks (with
--normalize, as scripts/summarize.py takes them) writes rliable's performance profile of the first metric's final
values instead: for each group, the fraction of its runs over all tasks that score above tau. pip install rliable.
--lineage draws a population's lineage.csv (ppo.py --pbt_interval): every member's score and settings at each
ranking, thin, and in bold those of the final best member's ancestry (itself, back through the donors it took).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import re
import sys
import warnings
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


def seed_runs(run_dir: Path) -> list[Path]:
    """The seeds' runs of a --num_seeds run directory ({run_name}__seed{S} inside it, in seed order): its own
    logs hold no scalars. Any other run directory is its own one run."""
    seed_name = re.compile(re.escape(run_dir.resolve().name) + r"__seed(\d+)")
    seeds = {int(m.group(1)): path for path in run_dir.iterdir()
             if path.is_dir() and (m := seed_name.fullmatch(path.name))}
    return [seeds[seed] for seed in sorted(seeds)] or [run_dir]


def group_runs(run_dirs: list[Path], pattern: str) -> dict[str, list[Path]]:
    """Curve name -> its runs, in the order the names first appear; a --num_seeds run counts as its seeds' runs."""
    try:
        regex = re.compile(pattern)
    except re.error as e:
        raise UserError(f"--group {pattern!r} is not a regular expression: {e}") from e
    groups, seen = defaultdict(list), set()
    for given in run_dirs:
        if not given.is_dir():
            raise UserError(f"{given} is not a run directory")
        for run_dir in seed_runs(given):
            if run_dir.resolve() in seen:  # a batch given with its seeds' directories: each seed once
                continue
            seen.add(run_dir.resolve())
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


def group_curve(curves: list[tuple[np.ndarray, np.ndarray]], iqm_reps: int = 0) -> tuple[np.ndarray, ...]:
    """x of the shortest curve, and of all curves interpolated onto it: the mean and its interval's bounds, or with
    iqm_reps the interquartile mean and its stratified bootstrap interval (of that many resamples)."""
    shortest = min((x for x, _ in curves), key=lambda x: x[-1])
    values = np.stack([np.interp(shortest, x, y) for x, y in curves])
    if iqm_reps:
        return (shortest, *iqm_and_interval(values, iqm_reps))
    mean, half_width = mean_and_interval(values)
    return shortest, mean, mean - half_width, mean + half_width


def rliable():
    """rliable's library and metrics modules (Agarwal et al. 2021): the IQM, its stratified bootstrap and the
    aggregates across tasks."""
    try:
        from rliable import library, metrics
    except ImportError as e:
        raise UserError(f"the interquartile mean and the aggregates across tasks need rliable ({e}): "
                        "pip install rliable") from e
    return library, metrics


def interval_estimates(scores: dict[str, np.ndarray], statistics, reps: int) -> tuple[dict, dict]:
    """rliable's point estimates and 95% stratified bootstrap intervals (percentile method) of statistics(scores) for
    each entry of scores (runs x tasks, or a pair of such); seeded, so a table or plot is the same each time."""
    library, _ = rliable()
    global_state = np.random.get_state()
    # rliable's StratifiedBootstrap draws its resamples from numpy's global generator, ignoring random_state (which
    # the independent bootstrap of P(X > Y) does use)
    np.random.seed(0)
    try:
        with quiet_bootstrap():
            return library.get_interval_estimates(scores, statistics, reps=reps,
                                                  random_state=np.random.RandomState(0))
    finally:
        np.random.set_state(global_state)


@contextlib.contextmanager
def quiet_bootstrap():
    """arch, rliable's bootstrap, announces at every call that it will take a Generator instead of a RandomState."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield


def iqm_and_interval(values: np.ndarray, reps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The interquartile mean over runs (axis 0) at each point of axis 1, and its 95% bootstrap interval: each
    resample draws whole runs, curves and all, as rliable's sample-efficiency curves do."""
    _, metrics = rliable()

    def iqm_at_each_point(scores: np.ndarray) -> np.ndarray:  # scores: runs x 1 task x points
        return np.array([metrics.aggregate_iqm(scores[..., i]) for i in range(scores.shape[-1])])

    point, interval = interval_estimates({"runs": values[:, None, :]}, iqm_at_each_point, reps)
    return point["runs"], interval["runs"][0], interval["runs"][1]


def pyplot():
    try:
        import matplotlib
    except ImportError as e:
        raise UserError("plotting needs matplotlib: pip install matplotlib") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def task_scores(run_dirs: list[Path], metric: str, pattern: str, task_pattern: str,
                normalize: list[str]) -> tuple[dict[str, np.ndarray], tuple[str, ...]]:
    """Each group's final values of metric as a runs x tasks matrix, each task's scaled by --normalize's
    (score - LOW) / (HIGH - LOW), and the tasks' names: what rliable's aggregates take."""
    bounds = {}
    for item in normalize:
        task, _, span = item.rpartition("=")
        try:
            low, high = (float(x) for x in span.split(":"))
        except ValueError:
            low = high = None
        if not task or low is None or high == low:
            raise UserError(f"--normalize takes TASK=LOW:HIGH with LOW != HIGH, got {item!r}")
        bounds[task] = (low, high)
    matrices, tasks = {}, set()
    for name, runs in group_runs(run_dirs, pattern).items():
        by_task = {}
        for task, task_runs in sorted(group_runs(runs, task_pattern).items()):
            finals = [read_scalars(run, metric)[2] for run in task_runs]
            empty = [run for run, values in zip(task_runs, finals) if len(values) == 0]
            if empty:
                raise UserError(f"{empty[0]} logged no {metric!r}")
            low, high = bounds.get(task, (0.0, 1.0))
            by_task[task] = (np.array([values[-1] for values in finals]) - low) / (high - low)
        counts = {task: len(values) for task, values in by_task.items()}
        if len(set(counts.values())) > 1:
            raise UserError(f"{name} has a different number of runs on its tasks ({counts}); the stratified bootstrap "
                            "needs as many on each")
        matrices[name] = np.stack(list(by_task.values()), axis=1)
        tasks.add(tuple(by_task))
    if len(tasks) > 1:
        raise UserError(f"the groups have different tasks ({sorted(tasks)}); check --group and --tasks")
    unknown = set(bounds) - set(*tasks)
    if unknown:
        raise UserError(f"--normalize names {sorted(unknown)}, which no run is a task of; the tasks: {sorted(*tasks)}")
    return matrices, tasks.pop()


def performance_profile(run_dirs: list[Path], metric: str, pattern: str, task_pattern: str, normalize: list[str],
                        out_dir: Path, reps: int) -> Path:
    """rliable's performance profile of each group: the fraction of its runs (over all tasks) whose normalized final
    score exceeds tau, against tau, with 95% stratified bootstrap bands."""
    library, _ = rliable()
    plt = pyplot()
    from rliable import plot_utils

    out_dir.mkdir(parents=True, exist_ok=True)
    matrices, task_names = task_scores(run_dirs, metric, pattern, task_pattern, normalize)
    low = min(m.min() for m in matrices.values())
    high = max(m.max() for m in matrices.values())
    taus = np.linspace(min(low, 0.0), max(high, 1.0), 101)
    with quiet_bootstrap():
        profiles, bands = library.create_performance_profile(matrices, taus, reps=reps)
    figure, axis = plt.subplots(figsize=(7, 4.5))
    colors = dict(zip(matrices, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    plot_utils.plot_performance_profiles(profiles, taus, performance_profile_cis=bands, ax=axis, colors=colors)
    axis.set_title(f"{metric}, final, normalized: {len(task_names)} tasks")
    axis.legend(handles=[plt.Line2D([], [], color=colors[name], label=name) for name in matrices], fontsize="small")
    figure.tight_layout()
    path = out_dir / ("performance_profile_" + metric.replace("/", "_") + ".png")
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path


def plot(run_dirs: list[Path], metrics: list[str], pattern: str, out_dir: Path, iqm_reps: int = 0,
         prefix: str = "") -> list[Path]:
    plt = pyplot()
    if iqm_reps:
        rliable()  # before any figure opens
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
                x, center, low_band, high_band = group_curve(curves, iqm_reps)
                line, = axis.plot(x, center, label=label)
                axis.fill_between(x, low_band, high_band, color=line.get_color(), alpha=0.2)
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
        statistic = "interquartile mean and 95% stratified bootstrap interval" if iqm_reps else "mean and 95% interval"
        figure.suptitle(f"{metric}: {statistic} across runs")
        figure.tight_layout()
        path = out_dir / (prefix + metric.replace("/", "_") + ".png")
        figure.savefig(path, dpi=100)
        plt.close(figure)
        written.append(path)
    return written


def ancestry(rows: list[dict]) -> list[dict]:
    """The rows of lineage.csv that the final best member descends through: its own back to the ranking where it took
    a donor's state (with the donor's score there, which was the line's), then the donor's before it, and so on."""
    by_ranking = defaultdict(dict)
    for row in rows:
        by_ranking[int(row["iteration"])][row["member"]] = row
    rankings = sorted(by_ranking)
    last = by_ranking[rankings[-1]].values()
    member = max(last, key=lambda row: -math.inf if math.isnan(float(row["score"])) else float(row["score"]))["member"]
    line = []
    for iteration in reversed(rankings):
        row = by_ranking[iteration][member]
        line.append({**row, "score": by_ranking[iteration][row["donor"]]["score"]} if row["donor"] else row)
        member = row["donor"] or member
    return line[::-1]


def plot_lineage(run_dir: Path, out_dir: Path) -> Path:
    path = run_dir / "lineage.csv"
    if not path.is_file():
        raise UserError(f"{path} is missing: --lineage draws a run of ppo.py --pbt_interval (its run directory)")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    if not rows:
        raise UserError(f"{path} holds no ranking yet")
    names = ["score", *list(rows[0])[5:]]
    best, plt = ancestry(rows), pyplot()
    figure, axes = plt.subplots(len(names), 1, figsize=(9, 2.2 * len(names)), sharex=True, squeeze=False)
    for axis, name in zip(axes[:, 0], names):
        for member in dict.fromkeys(row["member"] for row in rows):
            own = [row for row in rows if row["member"] == member]
            axis.step([int(row["global_step"]) for row in own], [float(row[name]) for row in own], where="post",
                      linewidth=0.6, alpha=0.5)
        axis.step([int(row["global_step"]) for row in best], [float(row[name]) for row in best], where="post",
                  color="black", linewidth=2, label=f"the best's ancestry (seed {best[-1]['member']} at the end)")
        values = [float(row[name]) for row in rows if float(row[name]) > 0]
        if name != "score" and len(values) == len(rows) and max(values) > 10 * min(values):
            axis.set_yscale("log")
        axis.set_ylabel(name)
        axis.grid(alpha=0.3)
    axes[0, 0].legend(fontsize="small")
    axes[-1, 0].set_xlabel("global step")
    figure.suptitle(f"{run_dir.name}: each member's score and settings at each ranking")
    figure.tight_layout()
    out_dir.mkdir(parents=True, exist_ok=True)
    figure.savefig(out_dir / f"{run_dir.name}_lineage.png", dpi=100)
    plt.close(figure)
    return out_dir / f"{run_dir.name}_lineage.png"


def run_dirs_parser(doc: str) -> argparse.ArgumentParser:
    """The arguments plot.py and summarize.py share: run directories, metrics and how runs are grouped."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="run directories (runs/NAME)")
    parser.add_argument("--metrics", nargs="+", default=["eval/return"], help="TensorBoard scalar tags")
    parser.add_argument("--group", default=DEFAULT_GROUP, help="regular expression naming a run's curve or row")
    parser.add_argument("--iqm", action="store_true",
                        help="the interquartile mean and its 95%% stratified bootstrap interval (pip install rliable)")
    parser.add_argument("--tasks", help="regular expression naming a run's task: rliable's aggregates across tasks")
    parser.add_argument("--normalize", nargs="+", default=[], metavar="TASK=LOW:HIGH",
                        help="with --tasks: a task's scores as (score - LOW) / (HIGH - LOW)")
    parser.add_argument("--reps", type=int, default=2000, help="bootstrap resamples of --iqm and --tasks")
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
    parser.add_argument("--lineage", action="store_true", help="each run's population lineage (--pbt_interval)")
    options = parser.parse_args(argv)
    if options.lineage:
        return report_user_errors(lambda: print(*(plot_lineage(run, options.out) for run in options.runs), sep="\n"))
    if options.tasks is not None:
        return report_user_errors(lambda: print(performance_profile(
            options.runs, options.metrics[0], options.group, options.tasks, options.normalize, options.out,
            options.reps)))
    iqm_reps = options.reps if options.iqm else 0
    return report_user_errors(lambda: print(*plot(options.runs, options.metrics, options.group, options.out, iqm_reps),
                                            sep="\n"))


if __name__ == "__main__":
    sys.exit(main())
