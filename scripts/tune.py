"""Tune a trainer: a resumable Optuna search (TPE, seeded) whose trials each train --seeds seeds in one process
(the trainer's --num_seeds) and are scored by the interquartile mean (IQM) of the seeds' final evaluation.

    python scripts/tune.py --trainer ppo.py --env_id Pendulum-v1 --trials 40 --seeds 4 \\
        --space learning_rate=1e-4:3e-3:log ent_coef=0:0.01 num_minibatches=4,8,16 -- --total_timesteps 100000
    python scripts/tune.py --env_id Pendulum-v1 --space learning_rate=1e-4:3e-3:log --confirm 10   # then the best
                                                                     # and the defaults on 10 fresh seeds

A dimension is NAME=LOW:HIGH (floats, or ints where both are), NAME=LOW:HIGH:log, or NAME=A,B,C (choices; true,false
for a switch); --space_file reads them from a TOML file (NAME = "LOW:HIGH:log" lines). Flags after -- go to every
trial. The tuning's directory (--dir) holds study.db (Optuna's SQLite storage), each trial's run (runs/trial_N, its
seeds' runs inside) and log (logs/trial_N.log), and at the end results.md and the plots. The same command continues
an interrupted tuning: a trial whose process is gone is marked failed and run again, so none counts twice; a second
tune.py on the same directory joins the study. A trial's intermediate IQM (read from its TensorBoard logs as it runs)
goes to Optuna's median pruner, which stops the trial with SIGTERM (its checkpoint stays).
--confirm K trains the best trial's settings and the defaults on K seeds that no trial used, and compares them.
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import tomllib
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import UserError, interval_estimates, read_scalars, report_user_errors, rliable, seed_runs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
POLL_SECONDS = 5.0
TOP = 5  # trials in results.md's table
REPS = 2000  # bootstrap resamples of the intervals


def counted_states(optuna) -> tuple:
    """The states of the trials that --trials counts."""
    return optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED


@dataclasses.dataclass
class Dimension:
    name: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple | None = None

    def suggest(self, trial):
        if self.choices is not None:
            return trial.suggest_categorical(self.name, self.choices)
        if isinstance(self.low, int) and isinstance(self.high, int):
            return trial.suggest_int(self.name, self.low, self.high, log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, log=self.log)


def number(text: str) -> float | int:
    return int(text) if re.fullmatch(r"[+-]?\d+", text) else float(text)


def parse_dimension(text: str, fields: dict) -> Dimension:
    name, equals, spec = text.partition("=")
    if not equals or not spec:
        raise UserError(f"--space {text!r}: write NAME=LOW:HIGH, NAME=LOW:HIGH:log or NAME=A,B,C")
    if name not in fields:
        raise UserError(f"--space {text!r}: the trainer has no flag --{name}")
    try:
        if "," in spec or isinstance(fields[name], bool):
            values = spec.split(",")
            if isinstance(fields[name], bool):
                if any(value.lower() not in ("true", "false") for value in values):
                    raise ValueError(f"--{name} is a switch: true,false")
                return Dimension(name, choices=tuple(value.lower() == "true" for value in values))
            parsed = []
            for value in values:
                try:
                    parsed.append(number(value))
                except ValueError:
                    parsed.append(value)
            return Dimension(name, choices=tuple(parsed))
        low, high, *scale = spec.split(":")
        if scale not in ([], ["log"]):
            raise ValueError("the third part may only be log")
        low, high = number(low), number(high)
        if not low < high or (scale and low <= 0):
            raise ValueError("LOW must be below HIGH (and above 0 on a log scale)")
        return Dimension(name, low, high, bool(scale))
    except ValueError as e:
        raise UserError(f"--space {text!r} does not parse: {e}") from None


def trainer_fields(trainer: Path) -> dict:
    """The trainer's flags and their defaults, read from its Args (the file is imported, not run)."""
    spec = importlib.util.spec_from_file_location(f"tuned_{trainer.stem}", trainer)
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # dataclasses look their module up
    sys.path.insert(0, str(trainer.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as e:
        raise UserError(f"{trainer} cannot be imported: {type(e).__name__}: {e}") from e
    if not hasattr(module, "Args"):
        raise UserError(f"{trainer} has no Args: give a trainer of this project, or a copy of one")
    return {field.name: field.default for field in dataclasses.fields(module.Args)}


def check_flags(flags: list[str], fields: dict):
    for flag in flags:
        if flag.startswith("--"):
            name = flag[2:].partition("=")[0].replace("-", "_")
            if name not in fields and name.removeprefix("no_") not in fields:
                raise UserError(f"{flag}: the trainer has no such flag")


def flag(name: str, value) -> list[str]:
    if isinstance(value, bool):
        return [f"--{name}" if value else f"--no_{name}"]
    return [f"--{name}={value}"]


def iqm(values) -> float:
    """The mean of the middle half (scipy's trim_mean at 0.25, as rliable's aggregate_iqm)."""
    values = np.sort(np.asarray(values, dtype=np.float64))
    cut = int(0.25 * len(values))
    return float(values[cut:len(values) - cut].mean())


def finals(run_dir: Path, metric: str) -> list[float]:
    """Each seed's last logged value of metric; empty where a seed logged none."""
    values = [read_scalars(seed, metric)[2] for seed in seed_runs(run_dir)] if run_dir.is_dir() else []
    return [float(v[-1]) for v in values] if values and all(len(v) for v in values) else []


def progress(run_dir: Path, metric: str) -> list[tuple[int, float]]:
    """(step, IQM over seeds) at each step that every seed has logged."""
    if not run_dir.is_dir():
        return []
    curves = [read_scalars(seed, metric) for seed in seed_runs(run_dir)]
    steps = set.intersection(*(set(curve[0].tolist()) for curve in curves)) if curves else set()
    return [(int(step), iqm([curve[2][curve[0].tolist().index(step)] for curve in curves])) for step in sorted(steps)]


class Tuning:
    def __init__(self, options, fields: dict, space: list[Dimension]):
        self.options, self.fields, self.space = options, fields, space
        self.dir = options.dir.resolve()
        self.trainer = options.trainer.resolve()

    def command(self, params: dict, seed: int, num_seeds: int, exp_name: str) -> list[str]:
        chosen = "capture_video" in params or any("capture_video" in given for given in self.options.flags)
        video = [] if chosen else ["--no_capture_video"]  # videos cost a trial time and the tuning disk
        return [sys.executable, str(self.trainer), f"--env_id={self.options.env_id}", *video,
                *(part for name, value in params.items() for part in flag(name, value)), *self.options.flags,
                f"--num_seeds={num_seeds}", f"--seed={seed}", "--torch_threads=1", f"--exp_name={exp_name}"]

    def train(self, params: dict, seed: int, num_seeds: int, name: str, trial=None) -> tuple[list[float], str]:
        """Run the trainer in the tuning's directory; (each seed's final metric, how it ended). With a trial, its
        intermediate IQMs go to the pruner, which may stop it."""
        run_dir, log = self.dir / "runs" / name, self.dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
        with open(log, "w") as output:
            process = subprocess.Popen(self.command(params, seed, num_seeds, name), cwd=self.dir, env=env,
                                       stdout=output, stderr=subprocess.STDOUT)
            if trial is not None:
                trial.set_user_attr("child", process.pid)
            reported, pruned = set(), False
            while process.poll() is None:
                time.sleep(POLL_SECONDS)
                for step, value in progress(run_dir, self.options.metric) if trial is not None else []:
                    if step not in reported:
                        reported.add(step)
                        trial.report(value, step)
                if trial is not None and reported and not pruned and trial.should_prune():
                    pruned = True
                    process.send_signal(signal.SIGTERM)  # the trainer saves a checkpoint and stops
            process.wait()
        if pruned:
            return [], "pruned"
        if process.returncode != 0:
            lines = [line for line in log.read_text().splitlines() if line.strip()]
            last = next((line for line in reversed(lines) if line.startswith("error")), lines[-1] if lines else "")
            return [], f"failed (exit {process.returncode}): {last} (whole output: {log})"
        values = finals(run_dir, self.options.metric)
        if not values:
            return [], f"logged no {self.options.metric} (give --metric one the trainer logs; {log})"
        return values, "complete"


def optuna_module():
    try:
        import optuna
    except ImportError as e:
        raise UserError(f"scripts/tune.py needs Optuna ({e}): pip install optuna") from e
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # its warning of a failed trial is a traceback: ours is a line
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    return optuna


def alive(trial) -> bool:
    """Whether the process that runs a trial still does (a trial of another machine is taken to)."""
    if trial.user_attrs.get("host") != socket.gethostname():
        return True
    try:
        os.kill(trial.user_attrs["pid"], 0)
    except (ProcessLookupError, KeyError):
        return False
    except PermissionError:
        return True
    return True


def open_study(optuna, tuning: Tuning):
    tuning.dir.mkdir(parents=True, exist_ok=True)
    what = {"trainer": str(tuning.trainer), "env_id": tuning.options.env_id, "flags": tuning.options.flags,
            "space": [dataclasses.asdict(d) for d in tuning.space], "seeds": tuning.options.seeds,
            "seed": tuning.options.seed, "metric": tuning.options.metric}
    what = json.loads(json.dumps(what))  # as the storage gives it back (tuples as lists)
    study = optuna.create_study(
        study_name="tune", storage=f"sqlite:///{tuning.dir / 'study.db'}", load_if_exists=True, direction="maximize",
        sampler=optuna.samplers.TPESampler(seed=tuning.options.sampler_seed),
        pruner=(optuna.pruners.MedianPruner(n_startup_trials=tuning.options.prune_after) if tuning.options.prune_after
                else optuna.pruners.NopPruner()))
    saved = study.user_attrs.get("tuning")
    counted = study.get_trials(deepcopy=False, states=counted_states(optuna))
    if saved is None or not counted:  # settings whose trials all failed (a bad flag, a metric never logged) may change
        study.set_user_attr("tuning", what)
    elif saved != what:
        changed = ", ".join(key for key in what if saved.get(key) != what[key])
        raise UserError(f"{tuning.dir} holds a tuning of other settings ({changed} differ): continue it with its own "
                        "command, or give another --dir")
    for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        if not alive(trial):  # cut short: counted as failed, and its settings run again
            if "child" in trial.user_attrs:  # a trainer its tune.py left behind stops, saving its checkpoint
                try:
                    os.kill(trial.user_attrs["child"], signal.SIGTERM)
                except (ProcessLookupError, PermissionError):
                    pass
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(trial.params, user_attrs={"rerun_of": trial.number})
    return study


def tune(options):
    optuna = optuna_module()
    from tqdm import tqdm

    fields = trainer_fields(options.trainer)
    dimensions = list(options.space)
    if options.space_file is not None:
        try:
            dimensions += [f"{name}={spec}" for name, spec in tomllib.loads(options.space_file.read_text()).items()]
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise UserError(f"--space_file {options.space_file}: {e}") from e
    if not dimensions:
        raise UserError("nothing to search: give --space NAME=LOW:HIGH ... or --space_file")
    if options.seeds > 1 and "num_seeds" not in fields:
        raise UserError(f"{options.trainer.name} trains one seed a process (it has no --num_seeds): give --seeds 1")
    check_flags(options.flags, fields)
    tuning = Tuning(options, fields, [parse_dimension(text, fields) for text in dimensions])
    study = open_study(optuna, tuning)
    done_states = counted_states(optuna)

    def objective(trial):
        trial.set_user_attr("pid", os.getpid())
        trial.set_user_attr("host", socket.gethostname())
        params = {dimension.name: dimension.suggest(trial) for dimension in tuning.space}
        values, ended = tuning.train(params, options.seed, options.seeds, f"trial_{trial.number}", trial)
        if ended == "pruned":
            raise optuna.TrialPruned()
        if ended != "complete":
            if not study.get_trials(deepcopy=False, states=done_states):
                raise UserError(f"trial {trial.number} {ended}")  # the first: a bad flag or metric, likely
            tqdm.write(f"warning: trial {trial.number} {ended}", file=sys.stderr)
            raise TrialFailed()
        trial.set_user_attr("finals", values)
        return iqm(values)

    done = len(study.get_trials(deepcopy=False, states=done_states))
    bar = tqdm(total=options.trials, initial=min(done, options.trials), desc="trials", dynamic_ncols=True)

    def advanced(study, trial):
        bar.n = min(len(study.get_trials(deepcopy=False, states=done_states)), options.trials)
        best = [t.value for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))]
        bar.set_postfix(best_iqm=f"{max(best):.4g}" if best else "-")
        bar.refresh()

    try:
        if done < options.trials:
            study.optimize(objective, n_jobs=options.jobs, catch=(TrialFailed,),
                           callbacks=[optuna.study.MaxTrialsCallback(options.trials, states=done_states), advanced])
    finally:
        bar.close()
    report(optuna, study, tuning)


class TrialFailed(Exception):
    pass


def with_interval(values: list[float]) -> str:
    if len(values) < 2:
        return f"{iqm(values):.4g}" if values else "-"
    try:
        _, metrics = rliable()
        point, interval = interval_estimates({"x": np.array(values)[:, None]}, metrics.aggregate_iqm, REPS)
    except UserError:  # rliable is optional: the IQM alone
        return f"{iqm(values):.4g}"
    (value,), (low, high) = np.ravel(point["x"]), np.ravel(interval["x"])
    return f"{value:.4g} [{low:.4g}, {high:.4g}]"


def report(optuna, study, tuning: Tuning):
    """results.md: the best trials, the command of the best, the confirmation; the plots beside it."""
    complete = sorted(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)),
                      key=lambda t: -t.value)
    if not complete:
        raise UserError(f"no trial of {tuning.dir} completed (see {tuning.dir / 'logs'})")
    pruned = len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,)))
    names = [dimension.name for dimension in tuning.space]
    lines = [f"{len(complete)} trials completed, {pruned} pruned; {tuning.options.metric}, IQM of "
             f"{tuning.options.seeds} seeds [95% interval]\n",
             f"| trial | {' | '.join(names)} | IQM | seeds | wall time (min) |",
             f"|---:|{'---|' * len(names)}---|---:|---:|"]
    for trial in complete[:TOP]:
        minutes = (trial.datetime_complete - trial.datetime_start).total_seconds() / 60
        shown = (f"{value:.4g}" if isinstance(value, float) else str(value) for value in map(trial.params.get, names))
        lines.append(f"| {trial.number} | {' | '.join(shown)} | "
                     f"{with_interval(trial.user_attrs['finals'])} | {len(trial.user_attrs['finals'])} | "
                     f"{minutes:.1f} |")
    best = complete[0]
    command = tuning.command(best.params, tuning.options.seed, tuning.options.seeds, f"best_of_{tuning.dir.name}")
    lines += ["", "The best trial's command:", "", f"    {shlex.join(['python', *command[1:]])}"]
    if tuning.options.confirm:
        lines += ["", *confirm(tuning, best.params, tuning.options.confirm)]
    text = "\n".join(lines) + "\n"
    (tuning.dir / "results.md").write_text(text)
    print(text, end="")
    plots(optuna, study, tuning.dir, names)


def confirm(tuning: Tuning, params: dict, seeds: int) -> list[str]:
    """The best settings and the defaults, each on seeds that no trial used (those after the tuning's)."""
    first = tuning.options.seed + tuning.options.seeds
    results = {}
    for name, settings in (("best", params), ("defaults", {})):
        values, ended = tuning.train(settings, first, seeds, f"confirm_{name}")
        if ended != "complete":
            raise UserError(f"--confirm: the {name} run {ended}")
        results[name] = values
    lines = [f"Confirmed on seeds {first}-{first + seeds - 1} (no trial used them), {tuning.options.metric} IQM "
             "[95% interval]:", "", "| settings | IQM | seeds |", "|---|---|---:|"]
    lines += [f"| {name} | {with_interval(values)} | {len(values)} |" for name, values in results.items()]
    try:
        _, metrics = rliable()
        point, interval = interval_estimates({"pair": (np.array(results["best"])[:, None],
                                                       np.array(results["defaults"])[:, None])},
                                             metrics.probability_of_improvement, REPS)
        (value,), (low, high) = np.ravel(point["pair"]), np.ravel(interval["pair"])
        lines += ["", f"P(best > defaults) = {value:.2f} [{low:.2f}, {high:.2f}]"]
    except UserError as e:
        lines += ["", f"(no probability of improvement: {e})"]
    return lines


def plots(optuna, study, directory: Path, names: list[str]):
    """Optuna's optimization history, parameter importances and, of the two most important parameters, a contour
    (a slice of one), as PNGs; skipped where matplotlib is missing or the trials are too few."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    from optuna.visualization import matplotlib as views

    importance = list(names)
    evaluator = optuna.importance.PedAnovaImportanceEvaluator()  # Optuna's default, fANOVA, needs scikit-learn
    drawings = [("history", lambda: views.plot_optimization_history(study))]
    if len(study.get_trials(states=(optuna.trial.TrialState.COMPLETE,))) > 1 and len(names) > 1:
        try:
            importance = list(optuna.importance.get_param_importances(study, evaluator=evaluator, params=names))
        except (RuntimeError, ValueError):
            pass
        drawings.append(("importances", lambda: views.plot_param_importances(study, evaluator=evaluator,
                                                                              params=names)))
    drawings.append(("contour", lambda: views.plot_contour(study, params=importance[:2])) if len(importance) > 1
                    else ("slice", lambda: views.plot_slice(study, params=importance[:1])))
    for name, draw in drawings:
        try:
            with warnings.catch_warnings():  # matplotlib's about the axes of a parameter that took one value
                warnings.simplefilter("ignore", UserWarning)
                axes = draw()
        except (RuntimeError, ValueError):
            continue
        figure = (axes.flat[0] if isinstance(axes, np.ndarray) else axes).get_figure()
        figure.savefig(directory / f"{name}.png", dpi=100, bbox_inches="tight")
        plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", type=Path, default=REPO / "ppo.py", help="a trainer, or a copy of one")
    parser.add_argument("--env_id", required=True)
    parser.add_argument("--space", nargs="*", default=[], help="NAME=LOW:HIGH[:log] or NAME=A,B,C")
    parser.add_argument("--space_file", type=Path, help="a TOML file of NAME = \"LOW:HIGH[:log]\" or \"A,B,C\"")
    parser.add_argument("--trials", type=int, default=40, help="trials to complete or prune")
    parser.add_argument("--seeds", type=int, default=4, help="seeds a trial trains in one process (--num_seeds)")
    parser.add_argument("--seed", type=int, default=1, help="the first of the trials' seeds")
    parser.add_argument("--metric", default="eval/return", help="the logged metric whose final IQM is maximized")
    parser.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1), help="trials at a time")
    parser.add_argument("--prune_after", type=int, default=5, help="completed trials before the median pruner stops "
                                                                       "any (0: run every trial to its end)")
    parser.add_argument("--sampler_seed", type=int, default=0, help="TPE's seed")
    parser.add_argument("--confirm", type=int, default=0, metavar="K", help="rerun the best and the defaults on K "
                                                                           "fresh seeds")
    parser.add_argument("--dir", type=Path, help="the tuning's directory (default: tunes/{env}__{trainer})")
    options = parser.parse_args(own)
    options.flags = flags
    for name in ("trials", "seeds", "jobs"):
        if getattr(options, name) < 1:
            parser.error(f"--{name} must be positive")
    if not options.trainer.is_file():
        parser.error(f"--trainer {options.trainer}: no such file")
    options.dir = options.dir or Path("tunes") / f"{re.sub('[:/]', '_', options.env_id)}__{options.trainer.stem}"
    try:
        return report_user_errors(lambda: tune(options))
    except KeyboardInterrupt:
        print(f"interrupted: the same command continues the tuning in {options.dir}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
