"""Tune a trainer: a resumable Optuna search (TPE, seeded) whose trials each train --seeds seeds in one process
(the trainer's --num_seeds) and are scored by the interquartile mean (IQM) of the seeds' final evaluation.

    python scripts/tune.py --trainer ppo.py --env_id Pendulum-v1 --trials 40 --seeds 4 \\
        --space learning_rate=1e-4:3e-3:log ent_coef=0.0:0.01 num_minibatches=4,8,16 \\
        -- --num_envs 8 --num_steps 256 --norm_obs --reward_scale 0.1 --eval_freq 2 --total_timesteps 40960
    # the same tuning (its trials done are read, not rerun), then the best and the defaults (ppo.py's with the
    # flags after --) on 10 fresh seeds at 102,400 steps
    python scripts/tune.py --trainer ppo.py --env_id Pendulum-v1 --trials 40 --seeds 4 \\
        --space learning_rate=1e-4:3e-3:log ent_coef=0.0:0.01 num_minibatches=4,8,16 \\
        --confirm 10 --confirm_flags '--total_timesteps 102400' \\
        -- --num_envs 8 --num_steps 256 --norm_obs --reward_scale 0.1 --eval_freq 2 --total_timesteps 40960

A dimension is NAME=LOW:HIGH (of the flag's type; of a flag without a default, ints where both ends are),
NAME=LOW:HIGH:log, or NAME=A,B,C (choices; true,false for a switch); --space_file reads them from a TOML file (NAME
= "LOW:HIGH:log" lines). Flags after -- go to every trial and are the defaults --confirm compares with (a searched
one there is the defaults' value). The tuning's directory (--dir) holds study.db (Optuna's SQLite storage), each
trial's run (runs/trial_N, its seeds' runs inside) and log (logs/trial_N.log), and at the end results.md and the
plots; --storage URL puts the study in a database that tune.py processes on several machines share. The same
command continues an interrupted tuning: a trial whose tune.py died (no heartbeat for --grace seconds) is marked
failed and run again, so none counts twice; a database away for less than --grace is waited for, the trials training
on; a second tune.py of the same settings joins the study, one of others is refused. A trial's
intermediate IQM (read from its TensorBoard logs as it runs) goes to Optuna's median pruner, which stops the trial
with SIGTERM (its checkpoint stays).
--confirm K trains the best trial's settings and the defaults on K seeds that no trial used (nor their envs' reset
seeds), and compares them, one confirmation at a time in a directory;
--confirm_flags='--total_timesteps N' gives those two runs the full budget where trials were shorter.
"""

import argparse
import contextlib
import dataclasses
import difflib
import fcntl
import functools
import hashlib
import importlib.util
import inspect
import itertools
import json
import math
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import threading
import tomllib
import traceback
import urllib.parse
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from plot import DEFAULT_GROUP, UserError, interval_estimates, read_scalars, rliable  # noqa: E402
from plot import plot as plot_curves, seed_runs  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
POLL_SECONDS = 5.0
BOX = re.compile(r"[\u2500-\u257f]+")  # the box tyro draws around its refusals
TOP = 5  # trials in results.md's table
REPS = 2000  # bootstrap resamples of the intervals
MAX_FAILURES = 5  # trials failed in a row that stop a tuning
TUNE_SETS = ("env_id", "seed", "num_seeds", "exp_name", "torch_threads")  # each trial's, from tune.py's own flags
# The trainers' flags that name a file: the trials run inside the tuning's directory, so a path given relative to
# where tune.py started is made absolute (absolute_paths()).
PATH_FLAGS = ("checkpoint",)


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


def parse_dimension(text: str, fields: dict, source: str = "--space") -> Dimension:
    name, equals, spec = text.partition("=")
    if not equals or not spec:
        raise UserError(f"{source} {text!r}: write NAME=LOW:HIGH, NAME=LOW:HIGH:log or NAME=A,B,C")
    if name not in fields:
        raise UserError(f"{source} {text!r}: the trainer has no flag --{name}{did_you_mean(name, fields)}")
    if isinstance(fields[name], (tuple, list)):
        raise UserError(f"{source} {text!r}: --{name} takes several values, which tune.py cannot search; give it "
                        "after -- (every trial's), or tune a copy of the trainer with a flag of one value")
    if "," not in spec and ":" not in spec and not isinstance(fields[name], bool):
        raise UserError(f"{source} {text!r} is one value, not a range or choices: give it after -- (every trial's)")
    try:
        if "," in spec or isinstance(fields[name], bool):
            values = [value.strip() for value in spec.split(",")]
            if isinstance(fields[name], bool):
                if any(value.lower() not in ("true", "false") for value in values):
                    raise ValueError(f"--{name} is a switch: true,false")
                choices = tuple(value.lower() == "true" for value in values)
            else:
                parsed = []
                for value in values:
                    try:
                        parsed.append(number(value))
                    except ValueError:
                        parsed.append(value)
                check_numbers(name, fields, *parsed)
                choices = tuple(parsed)
        else:
            low, high, *scale = spec.split(":")
            if scale not in ([], ["log"]):
                raise ValueError("the third part may only be log")
            low, high = number(low), number(high)
            check_numbers(name, fields, low, high)
            if isinstance(fields[name], float):  # 0:1 of a float flag is floats
                low, high = float(low), float(high)
            if not low < high or (scale and low <= 0):
                raise ValueError("LOW must be below HIGH (and above 0 on a log scale)")
            return Dimension(name, low, high, bool(scale))
    except ValueError as e:
        raise UserError(f"{source} {text!r} does not parse: {e}") from None
    if len(set(choices)) < 2:
        raise UserError(f"{source} {text!r} is one value, not choices: give it after -- (every trial's)")
    return Dimension(name, choices=choices)


def check_numbers(name: str, fields: dict, *values):
    """Refuse a number that is not finite, and one that is not an integer for a flag of integers."""
    numbers = [value for value in values if isinstance(value, (int, float))]
    if not all(map(math.isfinite, numbers)):
        raise ValueError("infinite or NaN: give finite numbers")
    if type(fields[name]) is int and not all(isinstance(value, int) for value in numbers):
        raise ValueError(f"--{name} takes integers: give whole numbers")


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


def check_flags(flags: list[str], fields: dict, source: str = "after --"):
    """Flags given to the trainer: its own, each with its value, and none that tune.py sets for each run."""
    for i, given in enumerate(flags):
        if (name := flag_name(given)) is not None:
            name = name if name in fields else name.removeprefix("no_")
            if name not in fields:
                raise UserError(f"{given} ({source}): the trainer has no such flag{did_you_mean(name, fields)} "
                                "(tune.py's own flags go before --)")
            if name in TUNE_SETS:
                raise UserError(f"{given} ({source}): tune.py sets --{name} for each run from its own flags; drop it")
            if name == "resume":
                raise UserError(f"{given} ({source}): every trial trains from the start; to start each from a run's "
                                "weights, give --checkpoint runs/RUN/final_ckpt.pt")
            valueless = i + 1 == len(flags) or flags[i + 1].startswith("--")
            if not isinstance(fields[name], bool) and "=" not in given and valueless:
                raise UserError(f"{given} ({source}): --{name} takes a value (its default: {fields[name]!r})")


def absolute_paths(flags: list[str]) -> list[str]:
    """flags with the value of each of PATH_FLAGS (--checkpoint PATH or --checkpoint=PATH) made absolute."""
    flags = list(flags)
    for i, given in enumerate(flags):
        if flag_name(given) in PATH_FLAGS:
            if "=" in given:
                name, _, value = given.partition("=")
                flags[i] = f"{name}={Path(value).absolute()}"
            elif i + 1 < len(flags):
                flags[i + 1] = str(Path(flags[i + 1]).absolute())
    return flags


def did_you_mean(name: str, names) -> str:
    close = difflib.get_close_matches(name, list(names), n=1)
    return f" (did you mean --{close[0]}?)" if close else ""


def flag(name: str, value) -> list[str]:
    if isinstance(value, bool):
        return [f"--{name}" if value else f"--no_{name}"]
    return [f"--{name}={value}"]


def flag_name(given: str) -> str | None:
    """--name, --name=value or --no_name: name (a value, a negative number too, gives None)."""
    if not given.startswith("--"):
        return None
    return given[2:].partition("=")[0].replace("-", "_")


def names(flags: list[str]) -> set[str]:
    """The names flags set, a switch's either way (--no_name: name)."""
    given = set(filter(None, map(flag_name, flags)))
    return given | {name.removeprefix("no_") for name in given}


def flag_values(flags: list[str], fields: dict) -> dict[str, list[str]]:
    """Each flag's values, the last given counting, by name (a switch's as true or false): the same settings however
    ordered or written."""
    values, name = {}, None
    for given in flags:
        if (flag := flag_name(given)) is None:
            if name is not None:
                values[name].append(given)
            continue
        off = flag not in fields and flag.startswith("no_")
        name = flag.removeprefix("no_") if off else flag
        values[name] = ["false"] if off else [given.partition("=")[2]] if "=" in given else []
    return {name: values[name] or ["true"] for name in sorted(values)}


def without(flags: list[str], dropped) -> list[str]:
    """flags less those named in dropped, with their values (a switch's --no_name too)."""
    kept, dropping = [], False
    for given in flags:
        if (name := flag_name(given)) is not None:
            dropping = name in dropped or name.removeprefix("no_") in dropped
        if not dropping:
            kept.append(given)
    return kept


def iqm(values) -> float:
    """The mean of the middle half (scipy's trim_mean at 0.25, as rliable's aggregate_iqm)."""
    values = np.sort(np.asarray(values, dtype=np.float64))
    cut = int(0.25 * len(values))
    return float(values[cut:len(values) - cut].mean())


def finals(run_dir: Path, metric: str) -> list[float]:
    """Each seed's last logged value of metric; empty where a seed logged none."""
    values = [read_scalars(seed, metric)[2] for seed in seed_runs(run_dir)] if run_dir.is_dir() else []
    return [float(v[-1]) for v in values] if values and all(len(v) for v in values) else []


def logged_metrics(run_dir: Path) -> list[str]:
    """The scalars a run's first seed logged."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not run_dir.is_dir():
        return []
    accumulator = EventAccumulator(str(seed_runs(run_dir)[0]), size_guidance={"scalars": 0})
    accumulator.Reload()
    return sorted(accumulator.Tags()["scalars"])


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
        self.children = set()  # the trainers running now
        self.stop = threading.Event()  # set by Ctrl-C, SIGTERM or errors: every train() stops its trainer
        self.storage = None  # Optuna's, open_study()'s
        self.beating = set()  # the ids of the trials this process runs, whose heartbeats it records
        self.unbeaten = {}  # the ids of others' running trials without a heartbeat: when this process first saw them
        self.away_since = None  # when the database stopped answering (reach())
        # a trial's last heartbeat may come a beat before the database goes, its next a beat after it answers (the
        # retries' wait): an outage shorter than --grace fails no trial
        self.stale_after = options.grace + 2 * options.heartbeat
        self.reaching = threading.Lock()
        self.what = None  # the settings a study of this command holds, open_study()'s

    def reach(self, call):
        """call(), a database call, made again while the database is away (refused or dropped connections, a server
        starting up), for up to --grace seconds from when it went, the trainers training on: a warning when it goes,
        a line when it answers again; past the grace, a UserError naming the driver's message. Trials whose heartbeats
        stopped for as long are failed and run again by any tune.py, so no process waits longer."""
        from optuna.exceptions import UpdateFinishedTrialError

        delay, again = 0.5, False
        while True:
            try:
                result = call()
            except Exception as e:
                if again and isinstance(e, UpdateFinishedTrialError):  # its write landed as the database went (no
                    self.answered()  # other tune.py fails this one's trials within the grace)
                    return True
                if (cause := database_away(e)) is None:
                    self.answered()  # with an error of another kind
                    raise
                with self.reaching:
                    if self.away_since is None:
                        self.away_since = time.monotonic()
                        tqdm_write(f"warning: the study's database does not answer ({cause}): trying again for up to "
                                   f"{self.options.grace} s (--grace), the trainers training on")
                    away = time.monotonic() - self.away_since
                if away > self.options.grace:
                    raise UserError(f"the study's database did not answer for {self.options.grace} s (--grace): "
                                    f"{cause}; this tune.py's trials run again, by any tune.py once it answers") from e
                if self.stop.wait(delay):
                    raise
                delay, again = min(2 * delay, self.options.heartbeat), True
                continue
            self.answered()
            return result

    def answered(self):
        if self.away_since is not None:
            with self.reaching:
                if self.away_since is not None:
                    tqdm_write(f"the study's database answers again, after {time.monotonic() - self.away_since:.0f} s")
                    self.away_since = None

    @staticmethod
    def keep(run_dir: Path, values: list[float]):
        """A completed run's finals in its finals.json, from which recorded() tells a trial that the database missed
        (whole or not at all: written beside it, then renamed)."""
        if values:
            (run_dir / "finals.json.part").write_text(json.dumps(values))
            (run_dir / "finals.json.part").replace(run_dir / "finals.json")

    def command(self, params: dict, seed: int, num_seeds: int, exp_name: str, extra: list[str] = ()) -> list[str]:
        # the last of a flag's values counts: the confirmation's flags replace those after --, a trial's both
        given = without([*without(self.options.flags, names(extra)), *extra], params)
        chosen = "capture_video" in params or "capture_video" in names(given)
        video = [] if chosen else ["--no_capture_video"]  # videos cost a trial time and the tuning disk
        seeds = [f"--num_seeds={num_seeds}"] if "num_seeds" in self.fields else []
        return [sys.executable, str(self.trainer), f"--env_id={self.options.env_id}", *video, *given,
                *(part for name, value in params.items() for part in flag(name, value)), *seeds, f"--seed={seed}",
                "--torch_threads=1", f"--exp_name={exp_name}"]

    @staticmethod
    def may_prune(study, evaluations: int) -> bool:
        """Whether a trial that has run this many evaluations may be pruned: past a third of the most a completed
        trial ran, as rl-baselines3-zoo's tuner waits (an early evaluation is noise: without, 16 of 24 trials on
        Pendulum-v1 were pruned at their first, benchmarks/results/tune_Pendulum-v1/pruned_at_the_first_evaluation.md),
        and before the last, where pruning would save nothing."""
        from optuna.trial import TrialState
        complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        longest = max((len(trial.intermediate_values) for trial in complete), default=0)
        return longest // 3 < evaluations < longest

    def train(self, params: dict, seed: int, num_seeds: int, name: str, trial=None,
              extra: list[str] = ()) -> tuple[list[float], str]:
        """Run the trainer in the tuning's directory; (each seed's final metric, how it ended: complete, pruned,
        stopped, failed, or failed elsewhere: by another tune.py, its heartbeats late). With a trial, its
        intermediate IQMs go to the pruner, which may stop it."""
        from optuna.exceptions import UpdateFinishedTrialError

        run_dir, log = self.dir / "runs" / name, self.dir / "logs" / f"{name}.log"
        log.parent.mkdir(parents=True, exist_ok=True)
        paths = [os.getcwd(), *filter(None, [os.environ.get("PYTHONPATH")])]  # where module:Env-v0 ids are found
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        with open(log, "w") as output:
            # a session of its own: Ctrl-C reaches tune.py alone, whose one SIGTERM lets the trainer save a checkpoint
            process = subprocess.Popen(self.command(params, seed, num_seeds, name, extra), cwd=self.dir, env=env,
                                       stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
            self.children.add(process)
            evaluations, pruned, stopped, ended, failed_elsewhere = 0, False, False, False, False
            try:
                if trial is not None:
                    trial.set_user_attr("child", process.pid)
                while not ended:
                    ended = process.poll() is not None  # then its last evaluations are read once more
                    if self.stop.is_set() and not (stopped or ended):  # also where the stop came before it started
                        stopped = True
                        process.send_signal(signal.SIGTERM)  # the trainer saves a checkpoint and stops
                    # the pruner compares trials at their k-th evaluation (steps differ where --num_envs is searched),
                    # each evaluation however many one poll finds
                    for k, (_, value) in enumerate(progress(run_dir, self.options.metric) if trial else []):
                        if k < evaluations or pruned or stopped or failed_elsewhere:
                            continue
                        evaluations = k + 1
                        try:
                            trial.report(value, k)
                            if not ended and self.may_prune(trial.study, evaluations) and trial.should_prune():
                                pruned = True
                                trial.set_user_attr("pruned_at", evaluations)
                                process.send_signal(signal.SIGTERM)
                        except UpdateFinishedTrialError:  # another tune.py failed it: it runs again there
                            failed_elsewhere = True
                            process.send_signal(signal.SIGTERM)
                    if not ended:
                        time.sleep(POLL_SECONDS)
            except Exception:  # tune.py stopping (its database away past the grace, in this thread or another, which
                # stops this one's waits): a trainer that finished keeps its result
                if process.poll() == 0 and not (pruned or stopped or failed_elsewhere):
                    self.keep(run_dir, finals(run_dir, self.options.metric))
                raise
            finally:
                if process.poll() is None:  # an error of tune.py's own (a database away): the trainer stops too
                    process.send_signal(signal.SIGTERM)
                process.wait()
                self.children.discard(process)
        if failed_elsewhere:
            return [], "failed elsewhere"
        if pruned:
            return [], "pruned"
        if stopped or self.stop.is_set():  # a trainer that stopped early may exit 0: its finals are not final
            return [], "stopped"
        if process.returncode != 0:
            lines = [text for line in log.read_text().splitlines() if (text := BOX.sub("", line).strip())]
            last = next((line for line in reversed(lines) if line.lower().startswith("error") or
                         "unrecognized" in line.lower()), lines[-1] if lines else "")
            return [], f"failed (exit {process.returncode}): {last} (whole output: {log})"
        values = finals(run_dir, self.options.metric)
        if not values:
            logged = ", ".join(logged_metrics(run_dir)) or "none"
            return [], f"logged no {self.options.metric} (give --metric one it logs: {logged}; {log})"
        self.keep(run_dir, values)
        return values, "complete"


def optuna_module():
    try:
        import optuna
    except ImportError as e:
        raise UserError(f"scripts/tune.py needs Optuna ({e}): pip install optuna") from e
    optuna.logging.set_verbosity(optuna.logging.ERROR)  # its warning of a failed trial is a traceback: ours is a line
    warnings.filterwarnings("ignore", category=optuna.exceptions.ExperimentalWarning)
    warnings.filterwarnings("ignore", message="Heartbeat of storage is supposed to be used with Study.optimize")
    return optuna


def stop_left_behind(trial):
    """SIGTERM the trainer of a cut trial if it still runs (it saves a checkpoint): found by its own command line,
    so that a pid since taken by another process is left alone."""
    pid = trial.user_attrs.get("child")
    try:
        if pid and f"--exp_name=trial_{trial.number}" in Path(f"/proc/{pid}/cmdline").read_bytes().decode().split("\0"):
            os.kill(pid, signal.SIGTERM)
    except (OSError, UnicodeDecodeError):
        pass


# The pip package of each database driver SQLAlchemy imports (a missing one is named by the import's error)
DRIVERS = {"psycopg": "'psycopg[binary]'", "psycopg2": "psycopg2-binary", "pymysql": "PyMySQL",
           "MySQLdb": "mysqlclient"}


def open_storage(optuna, tuning: Tuning):
    """Optuna's RDBStorage at --storage (default: study.db in the tuning's directory), with heartbeats: a trial whose
    tune.py recorded none for --grace seconds, on whatever machine it ran, is failed and runs again. Each of its calls
    is retried while the database is away, for up to the grace (Tuning.reach())."""
    url = tuning.options.storage
    if url is None:
        tuning.dir.mkdir(parents=True, exist_ok=True)
        url = f"sqlite:///{tuning.dir / 'study.db'}"
    shown_url = storage_name(url)
    if re.search(r"[@:/#?]|%(?![0-9A-Fa-f]{2})", split_password(url)[1] or ""):  # a driver's error would quote a part
        raise UserError(f"--storage {shown_url}: the password holds @, :, /, #, ? or % as they are, which a URL "
                        "cannot carry: quote it (urllib.parse.quote(password, safe='')), or leave it out of the URL "
                        "and give it in PGPASSWORD or ~/.pgpass")
    import sqlalchemy

    try:
        for attempt in itertools.count():
            try:
                storage = patient(optuna.storages.RDBStorage, tuning)(
                    url, engine_kwargs={} if url.startswith("sqlite") else {"pool_pre_ping": True},  # idle links drop
                    heartbeat_interval=tuning.options.heartbeat, grace_period=tuning.stale_after,
                    failed_trial_callback=cut_short)
                in_utc(storage.engine)
                return storage
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError, sqlalchemy.exc.OperationalError):
                if attempt == 4:
                    raise
                time.sleep(1)  # workers starting together create the tables together (one wins), or lock SQLite's
    except Exception as e:  # SQLAlchemy's: a driver missing, a URL that does not parse, a server that does not answer
        missing = e
        while missing is not None and not isinstance(missing, ModuleNotFoundError):  # Optuna rewords an ImportError
            missing = missing.__cause__ or missing.__context__
        if missing is not None:
            raise UserError(f"--storage {shown_url} needs its database driver ({missing}): pip install "
                            f"{DRIVERS.get(missing.name, missing.name)}") from e
        reason = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"--storage {shown_url}: {reason}") from e


def patient(storage_class, tuning: Tuning):
    """storage_class with each of its methods retried while the database is away (Tuning.reach()): Optuna's calls
    (asking, telling, reporting, heartbeats) as tune.py's. Its constructor is not: a database that does not answer at
    the start is a wrong URL as often as an outage, and is said at once."""
    inside = threading.local()

    def retried(method):
        @functools.wraps(method)
        def call(*args, **kwargs):
            if getattr(inside, "call", False):  # a call inside another, on its session: the outer one, its session
                return method(*args, **kwargs)  # new, is made again (this one again, on a session rolled back, fails)
            inside.call = True
            try:
                return tuning.reach(lambda: method(*args, **kwargs))
            finally:
                inside.call = False
        return call
    methods = {name: retried(member) for klass in reversed(storage_class.__mro__)
               for name, member in vars(klass).items() if inspect.isfunction(member) and not name.startswith("__")}
    return type(f"Patient{storage_class.__name__}", (storage_class,), methods)


def database_away(e: BaseException) -> str | None:
    """The driver's own message where e (or its cause) says the database cannot be reached, else None."""
    import sqlalchemy

    chain = []
    while e is not None and e not in chain:
        chain.append(e)
        e = e.__cause__ or e.__context__
    away = [link for link in chain if isinstance(link, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError,
                                                         sqlalchemy.exc.DisconnectionError))]
    if not away:
        return None
    driver = getattr(away[0], "orig", None) or away[0]  # the driver's own exception, that SQLAlchemy wraps
    # not an outage: PostgreSQL's errors of a statement (a disk full, a table missing) are of classes other than
    # connection (08) and shutdown or start (57P); SQLite's, other than a database locked by another writer
    sqlstate = getattr(driver, "sqlstate", None) or getattr(driver, "pgcode", None)  # psycopg's, psycopg2's
    if (sqlstate and not sqlstate.startswith(("08", "57P"))
            or type(driver).__module__ == "sqlite3" and "locked" not in str(driver)):
        return None
    return redacted(f"{type(driver).__module__.split('.')[0]}.{first_line(driver)}")


def in_utc(engine):
    """Every connection of the engine in UTC. Heartbeats are stored without a zone, as the database's clock reads in
    the connection's zone (PGTZ, a server's or a role's default), and compared with its clock in the comparing
    connection's: tune.py processes of other zones would fail each other's live trials, or never a dead one's."""
    import sqlalchemy

    utc = {"postgresql": "SET TIME ZONE 'UTC'", "mysql": "SET time_zone = '+00:00'"}.get(engine.dialect.name)
    if utc is None:  # SQLite's clock is UTC
        return

    def set_utc(connection, _):
        cursor = connection.cursor()
        cursor.execute(utc)
        cursor.close()
        connection.commit()  # a SET in a transaction rolled back would be undone
    sqlalchemy.event.listen(engine, "connect", set_utc)
    engine.dispose()  # the connections RDBStorage opened before


def split_password(url: str) -> tuple[str, str | None]:
    """The URL without its password, and the password (None where it has none). The credentials end at the URL's
    last '@': a password holding '@', ':', '/', '#', '?' or '%', quoted or not, is found whole, whether the rest of the
    URL parses or not."""
    scheme, separator, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    user, colon, password = credentials.partition(":")
    if not (separator and at and colon):
        return url, None
    return f"{scheme}://{user}@{host}", password


def study_url(url: str) -> str:
    """The URL as a study's name holds it: without a password, in its credentials or its query, so that giving it
    another way (PGPASSWORD, ~/.pgpass) keeps the study."""
    return re.sub(r"([?&])password=[^&]*&?", r"\1", split_password(url)[0]).rstrip("?&")


def storage_name(url: str) -> str:
    """The URL as lines show it: its password, if any, as ***."""
    without, password = split_password(url)
    return without if password is None else without.replace("@", ":***@", 1)


SECRETS: set[str] = set()  # --storage's password, as given, quoted and unquoted: never printed (redacted())


def redacted(text: str) -> str:
    for secret in sorted(SECRETS, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def open_study(optuna, tuning: Tuning):
    """Create the study, or join it where its settings are this command's (refused otherwise, before anything
    runs); trials of a tune.py that died are failed and wait to run again. A refused command writes nothing."""
    name = tuning.options.study_name
    # the directory's runs and logs are numbered by one study's trials
    # without the password: one moved to PGPASSWORD or ~/.pgpass, as docs/tuning.md advises, names the same study
    ours = f"{name} in {'study.db' if tuning.options.storage is None else study_url(tuning.options.storage)}"
    marker = tuning.dir / "study"
    if marker.is_file() and (held := marker.read_text().strip()) != ours:
        raise UserError(f"--dir {tuning.options.dir} holds the runs of study {held}, whose trial numbers {ours}'s "
                        "would reuse: give each study its own --dir")
    tuning.storage = open_storage(optuna, tuning)
    trainer = tuning.trainer.read_bytes()
    what = {"trainer": f"{tuning.trainer.name} (sha256 {hashlib.sha256(trainer).hexdigest()[:12]})",
            "env_id": tuning.options.env_id, "flags": flag_values(tuning.options.flags, tuning.fields),
            "space": [dataclasses.asdict(d) for d in sorted(tuning.space, key=lambda d: d.name)],
            "seeds": tuning.options.seeds,
            "seed": tuning.options.seed, "metric": tuning.options.metric, "grace": tuning.options.grace}
    tuning.what = what = json.loads(json.dumps(what))  # as the storage gives it back (tuples as lists)
    pruner = (optuna.pruners.MedianPruner(n_startup_trials=tuning.options.prune_after) if tuning.options.prune_after
              else optuna.pruners.NopPruner())
    try:  # atomic: of processes starting together, one creates the study
        study = optuna.create_study(study_name=name, storage=tuning.storage, direction="maximize", pruner=pruner)
    except optuna.exceptions.DuplicatedStudyError:
        study = optuna.load_study(study_name=name, storage=tuning.storage, pruner=pruner)
        recorded(optuna, study, tuning)
        fail_stale(optuna, study, tuning)
        if (saved := study_settings(optuna, study, tuning)) not in (None, what):
            raise other_settings(study, tuning, saved)
    try:
        tuning.dir.mkdir(parents=True, exist_ok=True)
        marker.write_text(ours + "\n")
    except OSError as e:
        raise UserError(f"--dir {tuning.options.dir} cannot be written ({e}): give a directory you can write") from e
    return study


def study_settings(optuna, study, tuning: Tuning, below: int | None = None) -> dict | None:
    """The study's settings: those its first trial that counts, runs or waits carries (numbered below `below`, if
    given); None where it has none, new or all its trials failed (a bad flag, a metric never logged), so that the next
    command's settings hold. Each trial carries its tune.py's settings from the moment it is asked for, so that of two
    commands of other settings starting together the first to ask holds the study, whatever they read before."""
    states = optuna.trial.TrialState
    deadline = time.monotonic() + 2 * tuning.options.heartbeat
    while True:
        trials = sorted(study.get_trials(deepcopy=False, states=(*counted_states(optuna), states.RUNNING,
                                                                 states.WAITING)), key=lambda t: t.number)
        for trial in trials if below is None else [t for t in trials if t.number < below]:
            if "tuning" in trial.user_attrs:
                return trial.user_attrs["tuning"]
            if trial.state == states.RUNNING and time.monotonic() < deadline:  # asked for by a tune.py that writes
                break  # its settings next, or died (else a trial of a tune.py that gave trials no settings)
        else:
            return None
        time.sleep(0.2)


def other_settings(study, tuning: Tuning, saved: dict) -> UserError:
    changed = "; ".join(f"{key} {shown(key, saved.get(key))} there, {shown(key, tuning.what[key])} here"
                        for key in tuning.what if saved.get(key) != tuning.what[key])
    where = (f"--storage's study {study.study_name!r}" if tuning.options.storage else str(tuning.dir))
    return UserError(f"{where} holds a tuning of other settings ({changed}): continue it with its own command "
                     "(logs/ holds its trials' commands), or give another --dir or --study_name")


def shown(key: str, value) -> str:
    """A setting as the command gives it: the space as NAME=LOW:HIGH[:log] or NAME=A,B; flags as a command line."""
    if key == "space" and isinstance(value, list):
        return " ".join(f"{d['name']}=" + (",".join(map(str, d["choices"])) if d["choices"] is not None else
                                           f"{d['low']}:{d['high']}{':log' * d['log']}") for d in value)
    if key == "flags" and isinstance(value, dict):
        return shlex.join(f"--{name}={' '.join(values)}" for name, values in value.items()) or "none"
    return str(value)


def rerun_later(tuning: Tuning, study, trial):
    """A trial cut short fails, so that it counts nowhere, and its settings wait to run again: enqueued by the one
    process whose write failed it, where two try at once."""
    from optuna.exceptions import UpdateFinishedTrialError
    from optuna.trial import TrialState
    try:
        failed = tuning.storage.set_trial_state_values(trial._trial_id, state=TrialState.FAIL)
    except UpdateFinishedTrialError:
        failed = False
    if failed:
        run_again(study, tuning.storage.get_trial(trial._trial_id))


def run_again(study, trial):
    study.enqueue_trial(drawn(trial), user_attrs={"rerun_of": trial.number, "tuning": trial.user_attrs.get("tuning")})


def drawn(trial) -> dict:
    """A frozen trial's settings: a rerun's wait in its system attributes till it is asked for and suggests them."""
    return trial.params or trial.system_attrs.get("fixed_params", {})


def cut_short(study, trial):
    """Optuna's callback of a trial that fail_stale_trials() failed for want of heartbeats (only in the process
    that failed it): its tune.py died. Its settings run again; its trainer, where it runs on this machine, stops."""
    tqdm_write(f"warning: trial {trial.number}, run by a tune.py on {trial.user_attrs.get('host', 'a machine')} that "
               "records no heartbeat, failed: its settings run again")
    if trial.user_attrs.get("host") == socket.gethostname():
        stop_left_behind(trial)
    run_again(study, trial)


def recorded(optuna, study, tuning: Tuning):
    """Record the results of this directory's trials that ended while the database was away, their tune.py then
    giving up (past --grace), from their runs' finals.json, before any tune.py fails them as stale."""
    states = optuna.trial.TrialState
    for trial in study.get_trials(deepcopy=False, states=(states.RUNNING,)):
        finals = tuning.dir / "runs" / f"trial_{trial.number}" / "finals.json"
        if trial.user_attrs.get("host") == socket.gethostname() and finals.is_file():
            values = json.loads(finals.read_text())
            tuning.storage.set_trial_user_attr(trial._trial_id, "finals", values)
            study.tell(trial.number, iqm(values), state=states.COMPLETE, skip_if_finished=True)
            tqdm_write(f"trial {trial.number} ended while the study's database was away: its result recorded from "
                       f"{finals}")


def fail_stale(optuna, study, tuning: Tuning):
    """Fail the trials of tune.py processes that died: those whose heartbeats stopped (Optuna's fail_stale_trials(),
    which calls cut_short()), and those that never recorded one (their tune.py died, or lost its database, right
    after asking for them), once this process has seen them so for --grace; their settings, if drawn, run again."""
    optuna.storages.fail_stale_trials(study)
    now, states = time.monotonic(), optuna.trial.TrialState
    unbeaten = {trial._trial_id: trial for trial in study.get_trials(deepcopy=False, states=(states.RUNNING,))
                if "host" not in trial.user_attrs and trial._trial_id not in tuning.beating}
    tuning.unbeaten = {trial_id: tuning.unbeaten.get(trial_id, now) for trial_id in unbeaten}
    for trial_id, since in tuning.unbeaten.items():
        if now - since > tuning.stale_after:
            trial = unbeaten[trial_id]
            try:
                if tuning.storage.set_trial_state_values(trial_id, state=states.FAIL) and drawn(trial):
                    run_again(study, trial)
            except optuna.exceptions.UpdateFinishedTrialError:  # another tune.py failed it first
                continue
            tqdm_write(f"warning: trial {trial.number}, asked for by a tune.py that recorded no heartbeat of it, failed"
                       f"{': its settings run again' if drawn(trial) else ''}")


def heartbeats(tuning: Tuning, study, done: threading.Event, errors: list):
    """Every --heartbeat seconds, a heartbeat of each trial this process runs (Optuna's own heartbeat thread runs
    inside study.optimize(), which tune.py's trials, asked for and told, do not), and the trials of a tune.py that
    died failed (their trainers here stopped) however long this one's trials run."""
    optuna = optuna_module()
    while not done.wait(tuning.options.heartbeat):
        try:
            for trial_id in list(tuning.beating):
                tuning.storage.record_heartbeat(trial_id)
            fail_stale(optuna, study, tuning)
        except UserError as e:  # the database away past the grace: the trainers stop
            errors.append(e)
            tuning.stop.set()
            return
        except Exception as e:  # noqa: BLE001 (a database away a while: the next beat may reach it)
            if tuning.stop.is_set():  # stopped while it waited for the database (reach())
                return
            tqdm_write(f"warning: no heartbeat recorded: {first_line(e)}")


def first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"


def tqdm_write(line: str):
    from tqdm import tqdm
    tqdm.write(redacted(line), file=sys.stderr)


def tune(options):
    optuna = optuna_module()
    fields = trainer_fields(options.trainer)
    dimensions = [(text, "--space") for text in options.space]
    if options.space_file is not None:
        source = f"--space_file {options.space_file}"
        try:
            space = tomllib.loads(options.space_file.read_text())
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise UserError(f"{source}: {e}") from e
        for name, spec in space.items():  # a TOML array is a list of choices
            if not isinstance(spec, (str, list)):
                raise UserError(f"{source}: {name} = {spec!r}: give a string \"LOW:HIGH[:log]\" or a list of choices")
            dimensions.append((f"{name}={','.join(map(str, spec)) if isinstance(spec, list) else spec}", source))
    if not dimensions:
        raise UserError("nothing to search: give --space NAME=LOW:HIGH ... or --space_file")
    if (options.seeds > 1 or options.confirm > 1) and "num_seeds" not in fields:
        raise UserError(f"{options.trainer.name} trains one seed a process (it has no --num_seeds): give --seeds 1, "
                        "and confirm on more seeds with scripts/sweep.sh")
    check_flags(options.flags, fields)
    confirm_flags = shlex.split(options.confirm_flags)
    check_flags(confirm_flags, fields, "--confirm_flags")
    options.flags = absolute_paths(options.flags)
    if (absolute := absolute_paths(confirm_flags)) != confirm_flags:  # a string rewritten only where it names a path
        options.confirm_flags = shlex.join(absolute)
    space, given = [parse_dimension(text, fields, source) for text, source in dimensions], {}
    for (text, source), dimension in zip(dimensions, space):
        if dimension.name in given:
            raise UserError(f"{source} {text!r}: --{dimension.name} is searched twice ({given[dimension.name]} "
                            "too): give each flag one range or one list of choices")
        given[dimension.name] = f"{source} {text!r}"
    if options.dir.exists() and not options.dir.is_dir():
        raise UserError(f"--dir {options.dir} is a file: give the tuning's directory (where results.md and the study "
                        "go), a new one or one a tuning wrote")
    # where the directory would be made: the SQLite study and the runs go there
    existing = next(path for path in (options.dir.absolute(), *options.dir.absolute().parents) if path.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        why = "not a directory" if not existing.is_dir() else "read-only"
        raise UserError(f"--dir {options.dir} cannot be written ({existing} is {why}): give --dir a directory you "
                        "can write")
    tuning = Tuning(options, fields, space)
    study = open_study(optuna, tuning)
    previous = signal.signal(signal.SIGTERM, interrupt)  # as Ctrl-C: the trainers stop, their trials run again later
    try:
        run_trials(optuna, study, tuning)
        report(optuna, study, tuning)
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_trials(optuna, study, tuning: Tuning):
    """--jobs workers, each asking for a trial (one at a time: a waiting rerun goes to one of them) while fewer than
    --trials are counted or running, in any process. A stop (Ctrl-C, SIGTERM, errors) stops the trainers; their
    trials wait to run again."""
    from tqdm import tqdm

    options, states, stop = tuning.options, optuna.trial.TrialState, tuning.stop
    lock, errors, failures = threading.Lock(), [], []

    def counted() -> int:
        return len(study.get_trials(deepcopy=False, states=counted_states(optuna)))

    bar = tqdm(total=options.trials, initial=min(counted(), options.trials), desc="trials", dynamic_ncols=True)

    def worker():
        try:
            work()
        except Exception as e:  # a thread's error would otherwise end it unseen, its trial left running
            if not (stop.is_set() and database_away(e)):  # else stopped as it waited for the database: why is said
                errors.append(e)  # raised again in the main thread: a bug's with its traceback
            stop.set()

    def work():
        while not stop.is_set():
            with lock:
                fail_stale(optuna, study, tuning)
                if (saved := study_settings(optuna, study, tuning)) not in (None, tuning.what):  # replaced by another's
                    raise other_settings(study, tuning, saved)
                if counted() >= options.trials:
                    return
                # the trials that run, in this process or another, may yet fail and run again: wait for them
                if counted() + len(study.get_trials(deepcopy=False, states=(states.RUNNING,))) >= options.trials:
                    trial = None
                    show()
                else:
                    trial, params = ask()
            if trial is None:
                stop.wait(options.heartbeat)
                continue
            values, ended = tuning.train(params, options.seed, options.seeds, f"trial_{trial.number}", trial)
            with lock:
                tuning.beating.discard(trial._trial_id)
                try:
                    if ended == "failed elsewhere" or tuning.storage.get_trial(trial._trial_id).state.is_finished():
                        raise optuna.exceptions.UpdateFinishedTrialError  # as telling it would
                    tell(trial, values, ended)
                except optuna.exceptions.UpdateFinishedTrialError:  # or its tell, written as the database went, again
                    if tuning.storage.get_trial(trial._trial_id).state == states.FAIL:
                        tqdm_write(f"warning: trial {trial.number} was failed by another tune.py as it ran, its "
                                   "heartbeats late (a machine or database stalled past --grace); its settings run "
                                   "again")
                show()

    def ask():
        """A trial, and its settings: drawn by a sampler seeded by its number, so that workers starting together
        draw apart; one that processes asking together took past --trials fails, marked surplus, counted nowhere."""
        trial = study.ask()
        try:
            tuning.storage.record_heartbeat(trial._trial_id)  # Optuna's own Trial has no public id
        except Exception:
            study.tell(trial, state=states.FAIL)  # without a heartbeat, it would never be found stale
            raise
        tuning.beating.add(trial._trial_id)
        trial.set_user_attr("host", socket.gethostname())
        rerun_settings = trial.user_attrs.get("tuning")  # a rerun's, waiting since an earlier tune.py enqueued it
        trial.set_user_attr("tuning", tuning.what)
        if (saved := rerun_settings or study_settings(optuna, study, tuning, trial.number)) not in (None, tuning.what):
            trial.set_user_attr("other_settings", True)  # counted nowhere; a rerun waits again for its own settings
            study.tell(trial, state=states.FAIL)
            tuning.beating.discard(trial._trial_id)
            if rerun_settings is not None:
                study.enqueue_trial(drawn(tuning.storage.get_trial(trial._trial_id)),
                                    user_attrs={"rerun_of": trial.user_attrs.get("rerun_of"), "tuning": rerun_settings})
            raise other_settings(study, tuning, saved)
        before = study.get_trials(deepcopy=False, states=(*counted_states(optuna), states.RUNNING))
        if sum(other.number < trial.number for other in before) >= options.trials:
            trial.set_user_attr("surplus", True)
            study.tell(trial, state=states.FAIL)
            tuning.beating.discard(trial._trial_id)
            return None, None
        study.sampler = optuna.samplers.TPESampler(seed=options.sampler_seed + trial.number)
        try:
            return trial, {dimension.name: dimension.suggest(trial) for dimension in tuning.space}
        except Exception as e:  # a trial without its settings would wait for ever to run again
            study.tell(trial, state=states.FAIL)
            tuning.beating.discard(trial._trial_id)
            if isinstance(e, ValueError):  # Optuna's check of a study's one distribution per setting
                raise UserError(f"the study {study.study_name!r} holds failed trials that drew a setting of --space "
                                f"from other values ({e}): give another --dir (or --study_name)") from e
            raise

    def tell(trial, values: list[float], ended: str):
        if ended == "stopped":  # train() says so of any trial that ran while tune.py was stopping
            rerun_later(tuning, study, trial)
        elif ended in ("complete", "pruned"):
            failures.clear()
            if ended == "complete":
                trial.set_user_attr("finals", values)
            study.tell(trial, iqm(values) if values else None, state=states.COMPLETE if values else states.PRUNED,
                       skip_if_finished=True)
        else:
            study.tell(trial, state=states.FAIL, skip_if_finished=True)
            failures.append(f"trial {trial.number} {ended}")
            # the first trial failing for its input (exit 2: a trainer's refusal), or a metric never logged
            if not counted() and ("exit 2)" in ended or "logged no" in ended) or len(failures) >= MAX_FAILURES:
                errors.append(UserError(failures[-1] if len(failures) == 1 else
                                        f"{len(failures)} trials failed in a row; the last: {failures[-1]}"))
                stop.set()
            else:
                tqdm_write(f"warning: trial {trial.number} {ended}")

    def show():
        bar.n = min(counted(), options.trials)
        best = [t.value for t in study.get_trials(deepcopy=False, states=(states.COMPLETE,))]
        bar.set_postfix(best_iqm=f"{max(best):.4g}" if best else "-")
        bar.refresh()

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(options.jobs)]
    done = threading.Event()
    threading.Thread(target=heartbeats, args=(tuning, study, done, errors), daemon=True).start()
    try:
        for thread in threads:
            thread.start()
        wait_for(threads, tuning)
    finally:
        done.set()
        bar.close()
    if errors:
        raise errors[0]


def wait_for(threads: list[threading.Thread], tuning: Tuning):
    """Join threads that run trainers; on Ctrl-C or SIGTERM, stop the trainers and wait for the threads to see
    them end (a thread's trial is then marked to run again)."""
    try:
        while any(thread.is_alive() for thread in threads):
            # not join(timeout): on Python 3.11, a KeyboardInterrupt inside it marks a running thread stopped
            # (CPython gh-90882), and tune.py would end before its trainers
            time.sleep(0.2)
    except KeyboardInterrupt:
        tuning.stop.set()
        for process in list(tuning.children):  # at once; each train() would within a poll
            process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join()
        raise


def interrupt(signum, frame):
    raise KeyboardInterrupt


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
    pruned = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.PRUNED,))
    names = [dimension.name for dimension in tuning.space]
    failed = len([trial for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.FAIL,))
                  if not (trial.user_attrs.get("surplus") or trial.user_attrs.get("other_settings"))])
    lines = [f"{len(complete)} trials completed, {len(pruned)} pruned, {failed} failed (cut trials among them, run "
             f"again); {tuning.options.metric}, IQM of {tuning.options.seeds} seeds [95% interval]\n",
             *savings(complete, pruned), f"The best {min(TOP, len(complete))} of the {len(complete)} completed:\n",
             f"| trial | {' | '.join(names)} | IQM | seeds | wall time (min) |",
             f"|---:|{'---|' * len(names)}---|---:|---:|"]
    for trial in complete[:TOP]:
        cells = map(value_text, map(trial.params.get, names))
        lines.append(f"| {trial.number} | {' | '.join(cells)} | "
                     f"{with_interval(trial.user_attrs['finals'])} | {len(trial.user_attrs['finals'])} | "
                     f"{minutes(trial):.1f} |")
    best = complete[0]
    command = tuning.command(best.params, tuning.options.seed, tuning.options.seeds, f"best_of_{tuning.dir.name}")
    trainer = Path(command[1])
    # a path that runs from where tune.py ran, and reads as the user gave it
    trainer = trainer.relative_to(Path.cwd()) if trainer.is_relative_to(Path.cwd()) else trainer
    lines += ["", "The best trial's command (from the directory tune.py ran in):", "",
              f"    {shlex.join(['python', str(trainer), *command[2:]])}"]
    for earlier in tuning.dir.glob("confirmation_*.png"):  # a picture shows results.md's confirmation or none
        earlier.unlink(missing_ok=True)  # (a second tune.py on the directory may have removed it)
    (tuning.dir / "results.md").write_text("\n".join(lines) + "\n")  # kept if the confirmation fails
    confirmed = []
    if tuning.options.confirm:
        confirmation, confirmed = confirm(study, tuning, best, tuning.options.confirm)
        lines += ["", *confirmation]
    text = "\n".join(lines) + "\n"
    (tuning.dir / "results.md").write_text(text)
    print(text, end="")
    plots(optuna, study, tuning.dir, names)
    if confirmed:
        confirmation_curves(confirmed, tuning)


def value_text(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def given_value(flags: list[str], name: str, default):
    """The value flags give --name (the last one counts), else default."""
    value = default
    for i, given in enumerate(flags):
        flag_given = flag_name(given)
        if flag_given == f"no_{name}":
            value = False
        elif flag_given == name:
            values = list(itertools.takewhile(lambda token: flag_name(token) is None, flags[i + 1:]))
            value = given.partition("=")[2] if "=" in given else " ".join(values) if values else True
    return value


def minutes(trial) -> float:
    return (trial.datetime_complete - trial.datetime_start).total_seconds() / 60


def savings(complete: list, pruned: list) -> list[str]:
    """What pruning saved: the pruned trials' time against what they would have taken at the completed trials' mean
    (an estimate: a trial's time depends on its settings and on what runs beside it)."""
    if not pruned:
        return []
    ran, mean = sum(map(minutes, pruned)), np.mean(list(map(minutes, complete)))
    saved = len(pruned) * mean - ran
    whole = sum(map(minutes, complete)) + ran + saved
    return [f"Pruning: the {len(pruned)} pruned trials ran {ran:.1f} min; run to their end at the completed trials' "
            f"mean of {mean:.1f} min they would have taken about {len(pruned) * mean:.1f}: {saved:.1f} min saved, "
            f"{saved / whole:.0%} of the {whole:.1f} min the trials would have taken unpruned (trainer time, the "
            "trials side by side counted each).\n"]


def confirm(study, tuning: Tuning, best, seeds: int) -> tuple[list[str], list[Path]]:
    """The best trial's settings and the defaults (the trainer's, with the flags after --, then --confirm_flags),
    side by side where --jobs allows, each on seeds that no trial used (confirmation_seed()); a run that an
    earlier confirmation of the same trial, seeds and --confirm_flags completed is read from the study, not rerun.
    Its results.md lines and the two runs' directories, the best's first."""
    first = confirmation_seed(tuning)
    extra = shlex.split(tuning.options.confirm_flags)
    tag = f"_{hashlib.sha1(shlex.join(extra).encode()).hexdigest()[:8]}" if extra else ""
    run_dirs = {name: tuning.dir / "runs" / f"confirm{seeds}_{kind}{tag}"  # the best's first
                for name, kind in (("best", f"trial{best.number}"), ("defaults", "defaults"))}
    results, errors = {}, []

    def run(name: str, settings: dict):
        run_dir = run_dirs[name]
        run_name = run_dir.name
        try:
            values = study.user_attrs.get(f"{run_name}_from_seed{first}")
            if values is None:
                if run_dir.exists():  # a confirmation cut short: set aside, so that no seed's curve reads on into it
                    run_dir.rename(run_dir.with_name(f"{run_name}_cut_{time.strftime('%Y%m%d-%H%M%S')}"))
                values, ended = tuning.train(settings, first, seeds, run_name, extra=extra)
                if ended != "complete":
                    raise UserError(f"--confirm: the {name} run {ended}")
                study.set_user_attr(f"{run_name}_from_seed{first}", values)
            results[name] = values
        except Exception as e:  # the other run stops too
            errors.append(e if isinstance(e, UserError) else UserError(f"--confirm: {type(e).__name__}: {e}"))
            tuning.stop.set()

    threads = [threading.Thread(target=run, args=(name, settings), daemon=True)
               for name, settings in (("best", best.params), ("defaults", {}))]
    with one_at_a_time(tuning.dir / "confirm.lock"):  # another tune.py's confirmation: its result is read
        for batch in [threads] if tuning.options.jobs > 1 else [[thread] for thread in threads]:
            for thread in batch:
                thread.start()
            wait_for(batch, tuning)
    if errors:
        raise errors[0]
    lines = [f"Confirmed on seeds {first}-{first + seeds - 1} (no trial used them or their envs' reset seeds)"
             f"{', with ' * bool(extra)}"
             f"{shlex.join(extra)}, {tuning.options.metric} IQM [95% interval]:", "",
             f"| settings | {' | '.join(best.params)} | IQM | seeds |", f"|---|{'---|' * len(best.params)}---|---:|"]
    flags = [*tuning.options.flags, *extra]
    defaults = {name: given_value(flags, name, tuning.fields[name]) for name in best.params}
    for name, values in (("best", best.params), ("defaults", defaults)):
        lines.append(f"| {name} | {' | '.join(map(value_text, values.values()))} | {with_interval(results[name])} | "
                     f"{len(results[name])} |")
    try:
        _, metrics = rliable()
        point, interval = interval_estimates({"pair": (np.array(results["best"])[:, None],
                                                       np.array(results["defaults"])[:, None])},
                                             metrics.probability_of_improvement, REPS)
        (value,), (low, high) = np.ravel(point["pair"]), np.ravel(interval["pair"])
        lines += ["", f"P(best > defaults) = {value:.2f} [{low:.2f}, {high:.2f}]"]
    except UserError as e:
        lines += ["", f"(no probability of improvement: {e})"]
    return lines, list(run_dirs.values())


def confirmation_seed(tuning: Tuning) -> int:
    """The confirmation's first seed: past every seed a trial used, its envs' reset seeds too. A run of seed s resets
    its num_envs training envs with seeds s, s + 1, ... and its num_eval_envs evaluation envs with the next ones (a
    resumed run further on; no trial resumes), so seed s + i of --num_seeds uses up to s + i + num_envs +
    num_eval_envs - 1, with the most of each flag that a trial may take (searched, or given after --)."""
    options, most = tuning.options, 0
    for name in ("num_envs", "num_eval_envs"):
        searched = [value for d in tuning.space if d.name == name for value in (d.choices or (d.high,))]
        most += max(map(int, searched or [given_value(options.flags, name, tuning.fields.get(name, 0))]))
    return options.seed + options.seeds - 1 + max(most, 1)


@contextlib.contextmanager
def one_at_a_time(path: Path):
    """An exclusive lock of path (flock: released when its process ends, however it ends)."""
    with open(path, "a") as lock:
        try:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                print(f"waiting for another tune.py's confirmation ({path})", file=sys.stderr)
                fcntl.flock(lock, fcntl.LOCK_EX)
        except OSError as e:  # a file system without locks (some NFS and Lustre mounts)
            raise UserError(f"--confirm cannot lock {path} ({e.strerror}): give a --dir on a local file "
                            "system") from e
        yield


def confirmation_curves(run_dirs: list[Path], tuning: Tuning):
    """The confirmation runs' curves of the metric, as scripts/plot.py --iqm draws them, in confirmation_<metric>.png;
    where they cannot be drawn, a warning."""
    try:
        plot_curves(run_dirs, [tuning.options.metric], DEFAULT_GROUP, tuning.dir, REPS, prefix="confirmation_")
    except UserError as e:  # matplotlib or rliable missing, or a run directory moved away: results.md stands alone
        print(f"warning: no confirmation curves: {e}", file=sys.stderr)


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
        # Optuna's views set their style for the whole process, the confirmation curves' too: rc_context undoes it.
        # matplotlib warns of the axes of a parameter that took one value.
        with warnings.catch_warnings(), matplotlib.rc_context():
            warnings.simplefilter("ignore", UserWarning)
            try:
                axes = draw()
            except (RuntimeError, ValueError):
                continue
            figure = (axes.flat[0] if isinstance(axes, np.ndarray) else axes).get_figure()
            figure.savefig(directory / f"{name}.png", dpi=100, bbox_inches="tight")
        plt.close(figure)


class OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str):  # as every error of tune.py's: --help gives the usage
        self.exit(2, f"error: {message}\n")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    own, flags = (argv[:argv.index("--")], argv[argv.index("--") + 1:]) if "--" in argv else (argv, [])
    if "--confirm_flags" in own[:-1]:  # argparse takes a value that starts with -- only after =
        at = own.index("--confirm_flags")
        own[at:at + 2] = [f"--confirm_flags={own[at + 1]}"]
    parser = OneLineErrors(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    parser.add_argument("--confirm_flags", default="", metavar="'FLAGS'", help="trainer flags of --confirm's runs "
                        "alone, such as the full budget: --confirm_flags='--total_timesteps 1000000'")
    parser.add_argument("--dir", type=Path, help="the tuning's directory (default: tunes/{env}__{trainer})")
    parser.add_argument("--storage", metavar="URL", help="the study's database, an SQLAlchemy URL that Optuna's "
                        "RDBStorage takes, shared by tune.py processes on several machines (docs/tuning.md), such as "
                        "postgresql+psycopg://USER@HOST/DB (default: study.db, SQLite, in --dir)")
    parser.add_argument("--study_name", default="tune", help="the study's name in its storage (--storage or "
                        "study.db); a --dir holds the runs of one study")
    parser.add_argument("--heartbeat", type=int, default=10, metavar="SECONDS", help="a running trial's heartbeat, "
                        "recorded in the study every this many seconds")
    parser.add_argument("--grace", type=int, default=180, metavar="SECONDS", help="a trial whose tune.py recorded no "
                        "heartbeat for this long, on any machine, is failed and runs again; a database away for this "
                        "long is waited for, the trials training on (docs/tuning.md)")
    options = parser.parse_args(own)
    options.flags = flags
    for name, least in (("trials", 1), ("seeds", 1), ("jobs", 1), ("prune_after", 0), ("confirm", 0),
                        ("heartbeat", 1), ("grace", 2 * options.heartbeat)):
        if getattr(options, name) < least:
            parser.error(f"--{name} must be at least {least}" + " (twice --heartbeat)" * (name == "grace"))
    if not options.trainer.is_file():
        parser.error(f"--trainer {options.trainer}: no such file")
    options.dir = options.dir or Path("tunes") / f"{re.sub('[:/]', '_', options.env_id)}__{options.trainer.stem}"
    if options.storage is not None:
        in_query = []  # libpq's and SQLAlchemy's ?password=
        with contextlib.suppress(ValueError):  # a URL that does not parse: its error says so, redacted
            in_query = urllib.parse.parse_qs(urllib.parse.urlsplit(options.storage).query).get("password", [])
        for password in filter(None, [split_password(options.storage)[1], *in_query]):
            plain = urllib.parse.unquote(password)
            SECRETS.update({password, plain, urllib.parse.quote(plain, safe="")})
    try:
        tune(options)
        return 0
    except UserError as e:
        print(f"error: {redacted(str(e))}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"interrupted: the same command continues the tuning in {options.dir}", file=sys.stderr)
        return 130
    except Exception:  # a bug's traceback, without the password that a database error may quote
        sys.stderr.write(redacted(traceback.format_exc()))
        return 1


if __name__ == "__main__":
    sys.exit(main())
