"""Does a copy of a trainer keep the copy contract (ppo.py's docstring)? Short runs of the copy on a small env of the
tests (tests/envs.py's PointMassHalves, whose episodes terminate halfway and restart alike whatever their seed, so a
resumed run can equal an uninterrupted one) or on --env_id, then a table of what holds and how it was checked, each
failure with what to change.

    python scripts/verify_copy.py my_idea.py                                   # PointMassHalves, Box actions
    python scripts/verify_copy.py my_idea.py --env_id Pendulum-v1              # your env (resume: see below)
    python scripts/verify_copy.py my_idea.py --flags "--ent_coef 0.01"         # the copy's own flags, for every run
    python scripts/verify_copy.py my_idea.py --flags --norm_obs                # a flag without a value
    python scripts/verify_copy.py my_idea.py --checks resume exports           # some of the checks

The checks, each run of the copy a process of its own in a temporary directory (forked from one that has imported
torch and the rest), two at a time; the runs evaluate and save a checkpoint every iteration:
  trains      8 iterations end with a final checkpoint whose numbers are all finite, and PPO learned: the policy
              loss and the approximate KL are not 0 in every update, every trainable parameter moved after the
              first iteration, the evaluation's return moved (a run that changes what is not state stops with its
              error line)
  same_seed   the same seed twice: the same weights, optimizer state and logged numbers, to the bit
  resume      stopped by SIGTERM at two points and resumed, the run ends as the uninterrupted one: the same weights
              and buffers (the Agent's state, a copy's own included), every optimizer's state, reward normalizer, to
              the bit; and every optimizer the copy created holds no state that the checkpoint lacks (Adam's moments
              of an optimizer kept in a variable of train()). The points: after the first iteration in which the
              copy's own state changed (a checkpoint's tensor that does not change every iteration), and halfway
              from there to the end
  seeds       (a copy of a trainer with --num_seeds) --num_seeds 2 ends with each seed as its run alone, within 100
              times the float rounding that the stock trainer's seeds part by in the same runs
  population  (a copy of a trainer with --pbt_interval) 4 members as a population, their settings drawn from a space
              of every setting the copy can search, ranked every 2 of 4 iterations: the run ends (each member's
              first update ran alone with its own numbers too, a setting used as one number stops it), lineage.csv
              holds both rankings and each member's checkpoint its settings and its state, its donor's after a copy
  evaluates   ppo_eval.py evaluates the final checkpoint
  exports     the ONNX policy of ppo_eval.py --export gives the actions the envs received in the copy's own last
              evaluation in training (recorded where TorchVecEnv hands them to the Gymnasium vector env), its first
              10 steps; ippo.py's copies: the export and its own check. Needs pip install onnx onnxscript onnxruntime
On --env_id, a Gymnasium env starts other episodes after a resume than the uninterrupted run does, and float rounding
can flip a discrete action between a seed alone and in a batch: where resume or seeds fails there, the stock trainer
runs the same check on the env, and if it fails too, the copy is checked on the test env of the same action space
instead; the row says where. An idea behind a flag that is off by default is checked only where --flags switches it
on. Exits 1 if a check fails, 2 (one error line) on bad input. Not scripts/check_copies.py, which keeps the project's
own trainers' marked copies equal.
"""

import argparse
import contextlib
import dataclasses
import importlib.util
import io
import hashlib
import json
import logging
import multiprocessing
import os
import re
import runpy
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ppo_eval  # noqa: E402
from tests.util import TIMING_TAGS, fast_args, scalars  # noqa: E402

# Which trainer a copy is of, by a field of its Args; its default env and flags.
KINDS = {"ippo": ("agent_obs", "vmas:tests.vmas_scenarios:Clock", dict(max_episode_steps=16)),
         "ppo_rnn": ("rnn_hidden_size", "tests.envs:PointMassHalves-v0", dict(seq_len=8, rnn_hidden_size=16)),
         # tanh heads: a ReLU unit at its kink switches under float rounding, and a seed of a batch then parts from
         # its run alone by more than rounding (7e-5 in a weight after 4 iterations, where tanh's part by 4e-8)
         "ppo_rgb": ("obs_mode", "tests.envs:PointMassPixelsHalves-v0", dict(activation="tanh")),
         "ppo": ("num_seeds", "tests.envs:PointMassHalves-v0", {})}
CHECKS = ("trains", "same_seed", "resume", "seeds", "population", "evaluates", "exports")
# the population check's space: each setting the copy's population can search, about the trainers' defaults
POPULATION_SPACE = {"learning_rate": "1e-4:1e-3:log", "ent_coef": "0:0.01", "clip_coef": "0.1:0.3", "vf_coef": "0.25:1",
                    "max_grad_norm": "0.25:1", "gamma": "0.9:0.99", "gae_lambda": "0.8:0.95", "target_kl": "0.05:0.2"}
POPULATION_ITERATIONS = 4
ITERATIONS = 8
SEEDS_ROUNDING_FACTOR, SEEDS_ROUNDING_FLOOR = 100, 1e-7  # the seeds check's tolerance, of the stock trainer's rounding
EXPORT_STEPS = 10
# run()'s server of forks, which imports these once (a platform without forkserver starts each run afresh);
# torch._dynamo too, which a process's first torch.optim optimizer imports (1.5 s of each run; starts no thread)
FORKS = multiprocessing.get_context("forkserver") if "forkserver" in multiprocessing.get_all_start_methods() else None
if FORKS is not None:
    FORKS.set_forkserver_preload(["__main__", "gymnasium", "numpy", "torch", "torch._dynamo", "torch.utils.tensorboard",
                                  "tqdm", "tyro"])
NUM_ENVS = 3  # not the number of seeds of the seeds check: a buffer broadcast against the wrong dimension fails
# The harnesses' start: the copy (sys.argv[1]) imported as a module of its own name, as a user's python my_idea.py runs
# it, so that they can wrap its functions.
IMPORT_COPY = """
import importlib.util, os, sys
path = sys.argv[1]
spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
copy = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = copy
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
spec.loader.exec_module(copy)
"""
# Runs the copy with its update() wrapped to send this process SIGTERM after iteration STOP_AFTER's: the trainer
# saves at the end of that iteration and exits, as a run stopped by a scheduler does. Then it writes to REPORT where
# the copy created each optimizer whose state (Adam's moments) the checkpoint it saved does not hold.
STOPPED_RUN = IMPORT_COPY + """
import json, signal, traceback
import torch
stop_after, report, checkpoint, argv = int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5:]
update, calls, created = copy.update, [], []
def update_then_stop(*args, **kwargs):
    stats = update(*args, **kwargs)
    calls.append(1)
    if len(calls) == stop_after:
        os.kill(os.getpid(), signal.SIGTERM)
    return stats
copy.update = update_then_stop
optimizer_init = torch.optim.Optimizer.__init__
def recorded_init(self, *args, **kwargs):
    optimizer_init(self, *args, **kwargs)
    lines = [f"line {f.lineno} ({f.name})" for f in traceback.extract_stack() if f.filename == copy.__file__]
    created.append((self, lines[-1] if lines else "outside the copy"))
torch.optim.Optimizer.__init__ = recorded_init
sys.argv[0] = path
status = copy.cli(argv)
def tensors(x):
    if isinstance(x, dict):
        return [t for value in x.values() for t in tensors(value)]
    return [t for value in x for t in tensors(value)] if isinstance(x, (list, tuple)) else [x] * torch.is_tensor(x)
saved = tensors(torch.load(checkpoint, map_location="cpu", weights_only=True)) if os.path.isfile(checkpoint) else []
lost = sorted({where for optimizer, where in created for state in optimizer.state.values()
               for key, value in state.items() if key != "step" and torch.is_tensor(value)
               and not any(s.shape == value.shape and torch.equal(s, value.cpu()) for s in saved)})
with open(report, "w") as f:
    json.dump(lost, f)
sys.exit(status)
"""

# Runs the copy as it is, recording its last evaluation where the evaluation envs (TorchVecEnv) hand the actions to the
# Gymnasium vector env: the observations the policy acted on, the episodes' ends, the actions the envs received. The
# export check replays them: an exported policy must act as training's own evaluation acted.
RECORDED_RUN = IMPORT_COPY + """
import numpy as np, torch
record, argv = sys.argv[2], sys.argv[3:]
make_envs, evaluation = copy.make_envs, {}
def cloned(obs):
    return {key: value.cpu().clone() for key, value in obs.items()} if isinstance(obs, dict) else obs.cpu().clone()
def recording_make_envs(*args, **kwargs):
    envs = make_envs(*args, **kwargs)
    if not kwargs.get("evaluation") or not hasattr(envs, "env"):
        return envs
    reset, step, vector_step = envs.reset, envs.step, envs.env.step
    def recorded_reset(*args, **kwargs):
        obs = reset(*args, **kwargs)
        evaluation.update(obs=[cloned(obs)], dones=[], actions=[])
        return obs
    def recorded_step(action):
        result = step(action)
        evaluation["obs"].append(cloned(result[0]))
        evaluation["dones"].append((result[2] | result[3]).cpu().clone())
        return result
    def recorded_vector_step(action):
        evaluation["actions"].append(action.detach().cpu().clone() if torch.is_tensor(action)
                                     else torch.as_tensor(np.array(action, copy=True)))
        return vector_step(action)
    envs.reset, envs.step, envs.env.step = recorded_reset, recorded_step, recorded_vector_step
    return envs
copy.make_envs = recording_make_envs
sys.argv[0] = path
status = copy.cli(argv)
torch.save(evaluation, record)
sys.exit(status)
"""


def run(argv: list[str], cwd: Path, fresh: bool = False) -> subprocess.CompletedProcess:
    """`python ARGV` in cwd: forked from a process that has imported what every trainer imports (3.5 s of a short
    run's 4-5 s), or in a fresh interpreter, with its own hash seed (the same_seed check's second run)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    if fresh or FORKS is None:
        return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)
    with tempfile.TemporaryDirectory() as directory:
        out, err = Path(directory, "out"), Path(directory, "err")
        process = FORKS.Process(target=run_forked, args=(argv, str(cwd), env, str(out), str(err)))
        process.start()
        process.join(900)
        if process.exitcode is None:
            process.kill()
            process.join()
            raise subprocess.TimeoutExpired([sys.executable, *argv], 900)
        return subprocess.CompletedProcess([sys.executable, *argv], process.exitcode,
                                           out.read_text(errors="replace"), err.read_text(errors="replace"))


def run_forked(argv: list[str], cwd: str, env: dict, out: str, err: str):
    """In a fork of run()'s server: what `python ARGV` does in a fresh interpreter (its exit status, a traceback
    and exit 1 on an exception, a signal's negative status)."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    for path, fd in ((out, 1), (err, 2)):
        os.dup2(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC), fd)
    # sys.path as Python sets it: the script's directory ("" for -c), PYTHONPATH, then the standard library and
    # site-packages (this process has verify_copy.py's: its directory and the repository first)
    pythonpath = [path for path in env["PYTHONPATH"].split(os.pathsep) if path]
    base = [path for path in sys.path if path and Path(path).resolve() not in (REPO, REPO / "scripts")]
    sys.argv = ["-c", *argv[2:]] if argv[0] == "-c" else list(argv)
    sys.path[:] = ["" if argv[0] == "-c" else os.path.dirname(os.path.abspath(argv[0])), *pythonpath, *base]
    if argv[0] == "-c":
        main = sys.modules["__main__"] = type(sys)("__main__")
        exec(compile(argv[1], "<string>", "exec"), main.__dict__)
    else:
        runpy.run_path(argv[0], run_name="__main__")


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def differences(a, b, exact: bool, where: str = "", tolerance: Optional[float] = None) -> list[str]:
    """Where two checkpoints' tensors (nested dicts and lists of them) differ: exactly, or beyond float rounding
    (tolerance: of each number's size, at least 1; else rtol 1e-4, atol 1e-5)."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where or 'the checkpoint'} holds {sorted(map(str, a.keys() ^ b.keys()))} in one run only"]
        return [d for key in a for d in differences(a[key], b[key], exact, f"{where}/{key}", tolerance)]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, exact, f"{where}/{i}", tolerance)]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        rtol, atol = (1e-4, 1e-5) if tolerance is None else (tolerance, tolerance)
        same = torch.equal(a, b) if exact or not a.is_floating_point() else a.shape == b.shape and torch.allclose(
            a.double(), b.double(), rtol=rtol, atol=atol, equal_nan=True)
        if same or exact or a.shape != b.shape or not a.is_floating_point():
            return [] if same else [where]
        return [f"{where} (by {float((a.double() - b.double()).abs().nan_to_num().max()):.1e})"]
    return [] if a == b or (a != a and b != b) else [where]  # NaN != NaN: equal here


def state(ckpt: dict) -> dict:
    """What a resumed run must restore: the Agent's state (a copy's own buffers with it), the optimizer's, the
    reward normalizer's."""
    return {key: ckpt.get(key) for key in ("model", "optimizer", "reward_normalizer")}


def logged(run_dir: Path) -> dict:
    return {tag: values for tag, values in scalars(run_dir).items() if tag not in TIMING_TAGS}


class Checks:
    def __init__(self):
        self.rows = []

    def add(self, name: str, how: str, failures: list[str], fix: str, skipped: str = ""):
        more = f" (and {len(failures) - 3} more)" if len(failures) > 3 else ""
        notes = skipped or how + (f": {'; '.join(failures[:3])}{more}. {fix}" if failures else "")
        self.rows.append((name, "skipped" if skipped else "fails" if failures else "holds", notes))

    def table(self) -> str:
        lines = ["| check | result | how it was checked; what to change |", "|---|---|---|"]
        return "\n".join(lines + [f"| {name} | {result} | {notes} |" for name, result, notes in self.rows])

    def failed(self) -> bool:
        return any(result == "fails" for _, result, _ in self.rows)


def reason_of(text: str) -> str:
    """The one line of a process's error output that says what went wrong: its error: line, else the last line
    (tyro's box drawn around its message taken off)."""
    lines = [line.strip(" |+-\u2502\u256d\u256e\u2570\u256f\u2500") for line in text.replace("\r", "\n").splitlines()]
    lines = [line for line in lines if line and not line.startswith("For full helptext")]
    errors = [line[line.index("error:"):] for line in lines if "error:" in line]
    return (errors or lines or [""])[-1]


def error_of(result: subprocess.CompletedProcess) -> str:
    return reason_of(result.stderr) or f"exit status {result.returncode}"


def import_copy(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    return module


def own_flags(argv: list[str], module) -> list[str]:
    """argv without the flags (and their values) that the copy's Args lacks: the runs' settings of a flag the copy
    removed (a recipe of n-step advantages has no --gae_lambda)."""
    fields, kept, keep = module.Args.__dataclass_fields__, [], True
    for token in argv:
        if token.startswith("--"):
            name = token[2:].split("=")[0]
            keep = name in fields or (name.startswith("no_") and name[3:] in fields)
        if keep:
            kept.append(token)
    return kept


def kind_of(module) -> str:
    fields = module.Args.__dataclass_fields__
    return next(kind for kind, (field, _, _) in KINDS.items() if field in fields or kind == "ppo")


def check_export(checks: Checks, copy: Path, module, kind: str, run_dir: Path, work: Path):
    fix = ("make the envs receive env_action()'s action and nothing else: an exported policy computes "
           "env_action(get_action(normalize_obs(obs), deterministic=True, action_mask=action_mask)), the mask "
           "where the env gives one")
    how = (f"the ONNX policy of ppo_eval.py --export against the actions the envs received in training's last "
           f"evaluation, its first {EXPORT_STEPS} steps")
    try:
        import onnxruntime
    except ImportError:
        checks.add("exports", "", [], "", skipped="pip install onnx onnxscript onnxruntime")
        return
    path = work / "policy.onnx"
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # the exporter's notes on its own internals
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        status = ppo_eval.cli([str(run_dir), "--export", str(path), "--trainer", str(copy)])
    if status != 0:
        checks.add("exports", how, [f"ppo_eval.py --export failed (exit status {status}; its error line above)"], fix)
        return
    if kind == "ippo":
        checks.add("exports", "ppo_eval.py --export and its own check", [], "")
        return
    evaluation = torch.load(work / "evaluation.pt", map_location="cpu", weights_only=True)
    if not evaluation.get("actions"):
        checks.add("exports", how, ["training's last evaluation took no step"], "keep evaluate() stepping the envs")
        return
    session = onnxruntime.InferenceSession(str(path))
    names = [spec.name for spec in session.get_inputs()]
    state, failures = None, []
    recurrent = "rnn_state" in names
    if recurrent:  # the policy's initial memory, as the copy's evaluation starts it
        ckpt = load(run_dir / "final_ckpt.pt")
        args = ppo_eval.run_args(module, ckpt, ppo_eval.EvalArgs(checkpoint="unused"))
        num_envs = evaluation["actions"][0].shape[0]
        envs = module.make_envs(args, False, torch.device("cpu"), evaluation=True, run_dir=work, num_eval_steps=16)
        try:
            state = module.make_agent(args, envs).initial_state(num_envs, torch.device("cpu"))
        finally:
            envs.close()
    episode_start = torch.ones(evaluation["actions"][0].shape[0], dtype=torch.bool)
    steps = list(zip(evaluation["obs"], evaluation["actions"], [episode_start, *evaluation["dones"]]))
    for step, (obs, env_action, episode_start) in enumerate(steps[:EXPORT_STEPS]):
        given = dict(obs) if isinstance(obs, dict) else {"obs": obs}
        if recurrent:
            given.update(rnn_state=state, episode_start=episode_start)
        feed = {name: (given[name][..., :session.get_inputs()[i].shape[-1]] if name == "obs" else given[name])
                for i, name in enumerate(names)}
        env_action = env_action.numpy()
        outputs = session.run(None, {name: np.asarray(value) for name, value in feed.items()})
        state = outputs[1] if recurrent else None
        if outputs[0].shape != env_action.shape or not np.allclose(outputs[0].astype(np.float64),
                                                                   env_action.astype(np.float64), atol=1e-5):
            failures.append(f"at step {step} the exported policy gives {np.ravel(outputs[0])[:4].tolist()}, the envs "
                            f"received {np.ravel(env_action)[:4].tolist()}")
            break
    checks.add("exports", how, failures, fix)


class OneLineParser(argparse.ArgumentParser):
    """argparse with its errors as one error line (not the usage before it)."""

    def error(self, message: str):
        self.exit(2, f"error: {message} (python scripts/verify_copy.py --help)\n")


def main(argv=None) -> int:
    parser = OneLineParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("copy", help="the copy of a trainer, e.g. my_idea.py")
    parser.add_argument("--env_id", help="the env of the runs (default: the trainer's PointMass, Box actions)")
    parser.add_argument("--flags", default="", help="the copy's own flags, added to every run (quoted)")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS), help="the checks to run")
    parser.add_argument("--cache", type=Path, help="a directory where the seeds check keeps the stock trainer's "
                        "rounding, for other copies checked with the same flags (the test suite's)")
    argv = list(sys.argv[1:] if argv is None else argv)
    for i in reversed(range(len(argv) - 1)):  # --flags "--norm_obs": argparse takes a value that starts with - so
        if argv[i] == "--flags":
            argv[i:i + 2] = [f"--flags={argv[i + 1]}"]
    args = parser.parse_args(argv)
    copy = Path(args.copy).resolve()
    if not copy.is_file() or copy.suffix != ".py" or not copy.stem.isidentifier():
        print(f"error: {args.copy} is not a Python file named like a module (my_idea.py)", file=sys.stderr)
        return 2
    try:
        module = import_copy(copy)
    except Exception as e:  # the copy's own code fails on import: that is the finding
        print(f"error: {copy.name} fails on import: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if not all(hasattr(module, name) for name in ("Args", "cli", "parse_args", "update")):
        print(f"error: {copy.name} is not a copy of a trainer: it has no Args, update() or cli() (cp ppo.py "
              "my_idea.py)", file=sys.stderr)
        return 2
    kind = kind_of(module)
    has_seeds = "num_seeds" in module.Args.__dataclass_fields__
    _, test_env, flags = KINDS[kind]
    env_id = args.env_id or test_env
    extra = shlex.split(args.flags)

    def argv_on(env: str, copys_flags: Optional[list[str]] = None):
        """The runs' flags on env, with the copy's --flags (or copys_flags)."""
        def argv_of(name: str, **overrides) -> list[str]:
            given = extra if copys_flags is None else copys_flags
            argv = own_flags(fast_args(env, name, num_envs=NUM_ENVS, **flags, **overrides), module) + given
            with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                try:  # a batch of the copy's --num_envs and --num_steps where --flags give them
                    parsed = module.parse_args(argv)
                    batch = parsed.num_envs * parsed.num_steps
                except (SystemExit, Exception):  # flags_refused() says why, in one line
                    batch = NUM_ENVS * 16
            # the checks read every iteration's checkpoint and evaluation: those flags last, over the copy's
            return argv + ["--total_timesteps", str(ITERATIONS * batch), "--eval_freq", "1", "--checkpoint_freq", "1",
                           "--keep_checkpoints", "None"]
        return argv_of

    refused = flags_refused(module, argv_on(env_id)("first"))
    if refused:
        print(f"error: --flags {args.flags!r}: {refused}", file=sys.stderr)
        return 2
    checks, wanted = Checks(), set(args.checks)
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        population = population_argv(module, argv_on(env_id)) if "population" in wanted else None
        results = run_jobs(jobs_of(str(copy), argv_on(env_id), wanted, has_seeds, work, population), work)
        runs = work / "runs"
        trained = (f"{ITERATIONS} iterations on {env_id}: the final checkpoint's numbers finite, the policy loss and "
                   "KL not 0 in every update, every trainable parameter moved after iteration 1"
                   + (", the return moved" if env_id == test_env else ""))
        first = results["first"]
        if first.returncode != 0:
            checks.add("trains", trained, [f"the run failed: {error_of(first)}"], "make a short run of the copy work")
            print(checks.table())
            return 1
        ckpt = load(runs / "first/final_ckpt.pt")
        checks.add("trains", trained, not_learned(module, runs / "first", work, returns_move=env_id == test_env),
                   "find where the loss or an update gives NaN or inf, or where the loss does not reach the "
                   "policy (a detach(), a parameter no optimizer steps)")

        if "same_seed" in wanted:
            check_same_seed(checks, results["again"], ckpt, runs)
        if "resume" in wanted:
            results.update(resume_runs(str(copy), argv_on(env_id), work))
        tolerance = None
        if "seeds" in wanted and has_seeds:
            stock_argv_of = argv_on(env_id, copys_flags=stock_flags(kind, changed_defaults(module, kind) + extra,
                                                                    argv_on, env_id))
            tolerance, rounding_how = seeds_tolerance(kind, stock_argv_of, work, args.cache)
        for check in ("resume", "seeds") if has_seeds else ("resume",):
            if check in wanted:
                failures = failures_of(check, copy, results, work, tolerance)
                how = HOW[check] + (f", within {rounding_how}" if check == "seeds" else
                                    f" (here after iterations {' and '.join(map(str, results['stopped']))})") + \
                    f", on {env_id}"
                like = test_env_like(kind, test_env, ckpt)
                if env_id != like and numeric(failures):
                    failures, how = second_opinion(check, copy, kind, env_id, like, argv_on, extra, work, failures,
                                                   how, tolerance)
                # a run that failed says in its error line what to change; the rule is for numbers that differ
                checks.add(check, how, failures, FIXES[check] if numeric(failures) or check == "resume" else "")
        if "seeds" in wanted and not has_seeds:
            checks.add("seeds", "", [], "", skipped=f"{kind}.py has no --num_seeds")
        if population is not None:
            checks.add("population", HOW["population"] + f", on {env_id}",
                       population_failures(results["population"], runs / "population"),
                       FIXES["population"])
        elif "population" in wanted:
            checks.add("population", "", [], "", skipped=f"{copy.name} has no --pbt_interval")
        if "evaluates" in wanted:
            evaluated = run([str(REPO / "ppo_eval.py"), str(runs / "first"), "--num_episodes", "2", "--trainer",
                             str(copy)], work)
            checks.add("evaluates", "ppo_eval.py, 2 episodes of the final checkpoint", [] if evaluated.returncode == 0
                       else [f"ppo_eval.py failed: {error_of(evaluated)}"],
                       "keep make_envs(), make_agent(), load_weights() and evaluate() as ppo_eval.py calls them")
        if "exports" in wanted:
            check_export(checks, copy, module, kind, runs / "first", work)
    print(f"{copy.name} ({kind}.py's copy) on {env_id}, {ITERATIONS} iterations a run:")
    print(checks.table())
    return 1 if checks.failed() else 0


HOW = {"resume": "stopped by SIGTERM after the first iteration that changed the copy's own state and halfway from "
                 "there, resumed, against the uninterrupted run to the bit; every optimizer's state in the checkpoint",
       "seeds": "--num_seeds 2 against each seed alone",
       "population": f"--num_seeds 4 as a population (--pbt_interval 2 of {POPULATION_ITERATIONS} iterations, "
                     "settings drawn from a space): its lineage and each member's settings and state"}
FIXES = {"resume": "keep state that changes training in the Agent (a buffer: self.register_buffer(...), persistent "
                   "as by default; a parameter, or an optimizer of its own made in Agent.__init__: "
                   "self.my_optimizer = torch.optim.Adam(...)), which checkpoints save and --resume restores; not in "
                   "a variable of train(), an attribute of another object or a Gymnasium wrapper of the copy's "
                   "(which a resumed run builds anew)",
         "seeds": "keep each seed's numbers its own (the trainer's docstring, 'A copy's contract'): reduce over rows "
                  "alone (the last dimension; ippo.py's: the second-to-last, masked_mean()), index parameters and "
                  "buffers from the end, compare statistics elementwise, keep what the Agent uses in its "
                  "parameters, buffers and modules, draw with the seed dimension first",
         "population": "read a searched setting (args.learning_rate, args.gamma, ...) in tensor arithmetic, where it "
                       "meets each member's part of the tensors, never as a Python number (the trainer's docstring, "
                       "'A copy's contract'); keep state in the Agent"}


def flags_refused(module, argv: list[str]) -> str:
    """Why the copy's parse_args() refuses argv (the --flags given to every run among them), or ''."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            module.parse_args(argv)
    except SystemExit:
        return reason_of(stderr.getvalue()) or "refused"
    except Exception as e:  # the copy's UserError
        return str(e)
    return ""


def jobs_of(script: str, argv_of, wanted: set, seeds: bool, work: Path,
            population: Optional[list[str]] = None) -> dict[str, list[str]]:
    """The runs of the checks wanted of script, by name: first, the uninterrupted run of seed 1 that every check
    compares with."""
    jobs = {"first": ["-c", RECORDED_RUN, script, str(work / "evaluation.pt"), *argv_of("first")]}
    if population is not None:
        jobs["population"] = [script, *population]
    if "same_seed" in wanted:
        jobs["again"] = [script, *argv_of("again")]
    if "seeds" in wanted and seeds:
        jobs.update({"alone2": [script, *argv_of("alone2", seed=2)], "batch": [script, *argv_of("batch", num_seeds=2)]})
    return jobs


def population_argv(module, argv_of) -> Optional[list[str]]:
    """The population check's run, of every setting the copy's population can search (None: it has no
    --pbt_interval)."""
    if "pbt_interval" not in module.Args.__dataclass_fields__:
        return None
    argv = argv_of("population", num_seeds=4, pbt_interval=2, pbt_start="space")
    last = len(argv) - argv[::-1].index("--total_timesteps")  # argv_of()'s, after fast_args()'
    argv[last] = str(POPULATION_ITERATIONS * int(argv[last]) // ITERATIONS)
    with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
        try:
            parsed = module.parse_args(argv)
        except (SystemExit, Exception):  # the run says why, in its error line
            return argv
    turned_off = {"target_kl": parsed.target_kl is None, "learning_rate": parsed.lr_schedule == "adaptive"}
    space = [f"{name}={POPULATION_SPACE[name]}" for name in getattr(module, "PBT_SETTINGS", POPULATION_SPACE)
             if name in POPULATION_SPACE and hasattr(parsed, name) and not turned_off.get(name)]
    return [*argv, "--pbt_space", *space]


def population_failures(result: subprocess.CompletedProcess, run_dir: Path) -> list[str]:
    """The population check's findings: its run's error, or a lineage, settings or state that do not add up (a
    member that took a donor's state at the first ranking holds it at the second's checkpoint)."""
    if result.returncode != 0:
        return [f"the run failed: {error_of(result)}"]
    lineage = (run_dir / "lineage.csv").read_text() if (run_dir / "lineage.csv").is_file() else ""
    rows, rankings = [row.split(",") for row in lineage.splitlines()[1:]], POPULATION_ITERATIONS // 2
    if len(rows) != 4 * rankings:
        return [f"lineage.csv holds {len(rows)} rows, not {4 * rankings} (4 members, {rankings} rankings)"]
    names, failures = lineage.splitlines()[0].split(",")[5:], []
    for row in rows[-4:]:
        saved = load(run_dir / f"population__seed{row[2]}/final_ckpt.pt")["args"]
        if any(saved[name] != float(value) for name, value in zip(names, row[5:])):
            failures.append(f"seed {row[2]}'s final checkpoint does not hold its settings of lineage.csv")
    for member, donor in [(row[2], row[4]) for row in rows[:4] if row[4]]:  # the first ranking's copies
        ranked = {seed: load(run_dir / f"population__seed{seed}/ckpt_2.pt") for seed in (member, donor)}
        failures += [f"seed {member} after taking seed {donor}'s state: {d}" for d in differences(
            state(ranked[member]), state(ranked[donor]), exact=True)
            if not d.startswith("/optimizer/param_groups")]  # its learning rate is explored
    return failures


def run_jobs(jobs: dict[str, list[str]], work: Path) -> dict[str, subprocess.CompletedProcess]:
    work.mkdir(exist_ok=True)
    with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time, one per core
        return dict(zip(jobs, pool.map(lambda name: run(jobs[name], work, fresh=name == "again"), jobs)))


def failures_of(check: str, script: Path, results: dict, work: Path, tolerance: Optional[float] = None) -> list[str]:
    if results["first"].returncode != 0:
        return [f"the uninterrupted run failed: {error_of(results['first'])}"]
    if check == "seeds":
        return seeds_failures(results, work / "runs", tolerance)
    return resume_failures(script, results, load(work / "runs/first/final_ckpt.pt"), work)


def second_opinion(check: str, copy: Path, kind: str, env_id: str, test_env: str, argv_on, extra: list[str],
                   work: Path, failures: list[str], how: str, tolerance: Optional[float]) -> tuple[list[str], str]:
    """A check that the copy's numbers failed on the user's env, where the stock trainer's numbers may fail it too (an
    env whose episodes do not restart alike after a resume, a discrete action that float rounding flips): then the env
    is the cause, and the copy is checked on the test env of the same action space instead. The stock trainer runs
    with those of the copy's flags that it has; where it fails otherwise than in its numbers, it gives no opinion.
    tolerance: the seeds check's on the user's env; on the test env, its own (seeds_tolerance())."""
    stock, stock_work = REPO / f"{kind}.py", work / f"stock_{check}"
    taken = stock_flags(kind, extra, argv_on, env_id)
    stock_results = run_jobs(jobs_of(str(stock), argv_on(env_id, copys_flags=taken), {check}, True, stock_work),
                             stock_work)
    if check == "resume":
        stock_results.update(resume_runs(str(stock), argv_on(env_id, copys_flags=taken), stock_work))
    stock_failures = failures_of(check, stock, stock_results, stock_work, tolerance)
    if not stock_failures:
        return failures, how + f" (the stock {kind}.py holds there)"
    if not numeric(stock_failures):
        return failures, how + f" (the stock {kind}.py fails there otherwise: {stock_failures[0]})"
    test_work = work / f"test_{check}"
    results = run_jobs(jobs_of(str(copy), argv_on(test_env), {check}, True, test_work), test_work)
    if check == "resume":
        results.update(resume_runs(str(copy), argv_on(test_env), test_work))
    if check == "seeds":
        tolerance, _ = seeds_tolerance(kind, argv_on(test_env, copys_flags=taken), test_work)
    return failures_of(check, copy, results, test_work, tolerance), (
        HOW[check] + f", on {test_env}: on {env_id} the stock {kind}.py's runs fail it too")


def stock_flags(kind: str, extra: list[str], argv_on, env_id: str) -> list[str]:
    """The copy's flags that the stock trainer has too: the env's, the run's."""
    stock_argv = argv_on(env_id, copys_flags=[])("first")
    return [word for flag in flags_of(extra) if not flags_refused(importlib.import_module(kind), stock_argv + flag)
            for word in flag]


def changed_defaults(module, kind: str) -> list[str]:
    """The copy's defaults that differ from the stock trainer's, as flags: the stock trainer's runs that measure the
    seeds' float rounding take them (a recipe's ReLU network rounds otherwise than the stock tanh one)."""
    stock, words = importlib.import_module(kind).Args.__dataclass_fields__, []
    for name, field in module.Args.__dataclass_fields__.items():
        value = field.default
        if name not in stock or value is dataclasses.MISSING or value == stock[name].default:
            continue
        if isinstance(value, bool):
            words.append(f"--{name}" if value else f"--no_{name}")
        else:
            words += [f"--{name}", *map(str, value if isinstance(value, tuple) else [value])]
    return words


def flags_of(words: list[str]) -> list[list[str]]:
    """Command-line words as flags, each with its values."""
    flags = []
    for word in words:
        if word.startswith("--") or not flags:
            flags.append([word])
        else:
            flags[-1].append(word)
    return flags


def numeric(failures: list[str]) -> bool:
    """Whether a check failed on numbers alone: checkpoints' tensors that differ (differences()), nothing that
    crashed or went missing."""
    return bool(failures) and all(re.match(r"(seed \d+: |stopped after iteration \d+: )?/", failure)
                                  and " in one run only" not in failure
                                  for failure in failures)


def test_env_like(kind: str, test_env: str, ckpt: dict) -> str:
    """The trainer's test env with the action space of the user's env (its checkpoint's)."""
    action = ckpt.get("action_space", {}).get("type", "Box")
    if kind == "ippo" or action == "Box":
        return test_env
    return test_env.replace("-v0", f"{action}-v0")


def lost_optimizers(work: Path) -> list[str]:
    report = work / "lost.json"
    return json.loads(report.read_text()) if report.is_file() else []


def check_same_seed(checks: Checks, again: subprocess.CompletedProcess, ckpt: dict, runs: Path):
    if again.returncode != 0:
        found = [f"the second run failed: {error_of(again)}"]
    else:
        first_logs, again_logs = logged(runs / "first"), logged(runs / "again")
        found = differences(state(ckpt), state(load(runs / "again/final_ckpt.pt")), exact=True) + [
            f"logged {tag}" for tag in sorted(first_logs.keys() | again_logs.keys())
            if first_logs.get(tag) != again_logs.get(tag)]
    checks.add("same_seed", "the same seed twice: weights, optimizer state and logs to the bit", found,
               "draw from torch's generators and the env's self.np_random, which the seed seeds; not from an "
               "unseeded generator (np.random.default_rng(), random.Random(), the clock)")


def resume_points(run_dir: Path) -> list[int]:
    """Where the resume check stops a run (from its uninterrupted run's checkpoints of every iteration): after the
    first iteration in which a tensor changed that does not change in every iteration (the copy's own state: a phase
    of its own, a counter; PPO's weights and Adam change every time), else after iteration 1; and halfway from there
    to the end."""
    ckpts = [state(load(run_dir / f"ckpt_{k}.pt")) for k in range(1, ITERATIONS + 1)]
    changed = [set(differences(before, after, exact=True)) for before, after in zip(ckpts, ckpts[1:])]
    every_time = set.intersection(*changed) if changed else set()
    first = next((k for k, keys in enumerate(changed, start=2) if keys - every_time and k < ITERATIONS), 1)
    return sorted({first, max(first + 1, first + (ITERATIONS - first) // 2)} - {ITERATIONS})


def resume_runs(script: str, argv_of, work: Path) -> dict[str, subprocess.CompletedProcess]:
    """The runs stopped at each of resume_points() (the first run must have ended), then each resumed."""
    points = resume_points(work / "runs/first") if (work / "runs/first/final_ckpt.pt").is_file() else []
    stopped = run_jobs({f"stopped{k}": ["-c", STOPPED_RUN, script, str(k), str(work / f"lost{k}.json"),
                                         str(work / f"runs/stopped{k}/ckpt_{k}.pt"), *argv_of(f"stopped{k}")]
                        for k in points}, work)
    resumed = run_jobs({f"resumed{k}": [script, "--resume", str(work / f"runs/stopped{k}")] for k in points
                        if stopped[f"stopped{k}"].returncode == 128 + 15}, work)
    return {**stopped, **resumed, "stopped": points}


def resume_failures(copy: Path, results: dict, ckpt: dict, work: Path) -> list[str]:
    failures = []
    for k in results["stopped"]:
        stopped, at = results[f"stopped{k}"], f"stopped after iteration {k}"
        if stopped.returncode != 128 + 15:
            failures.append(f"the run {at} exited with {stopped.returncode}: {error_of(stopped)}")
            continue
        report = work / f"lost{k}.json"
        failures += [f"the optimizer created at {where} holds state that the checkpoint does not"
                     for where in (json.loads(report.read_text()) if report.is_file() else [])]
        resumed = results[f"resumed{k}"]
        failures += ([f"--resume of the run {at} failed: {error_of(resumed)}"] if resumed.returncode != 0 else
                     [f"{at}: {d}" for d in differences(state(ckpt), state(load(
                         work / f"runs/stopped{k}/final_ckpt.pt")), exact=True)])
    return failures


def not_learned(module, run_dir: Path, work: Path, returns_move: bool) -> list[str]:
    """What says that a run of the copy did not learn: non-finite numbers, a policy loss or KL of 0 in every update,
    a trainable parameter that never moved after iteration 1 (but one that an own optimizer alone steps), and where
    returns_move (the test env's, whose return moves with any change of the policy; a user's env may hold it, as
    MountainCar's -200) an evaluation return that never moved."""
    ckpt = load(run_dir / "final_ckpt.pt")
    found = [f"non-finite {key}" for key, value in ckpt["model"].items()
             if value.is_floating_point() and not torch.isfinite(value).all()]
    if found:
        return found
    logs = logged(run_dir)
    for tag in ("losses/policy_loss", "losses/approx_kl"):  # a KL of float rounding (1e-14) is none
        if tag in logs and all(abs(value) < 1e-8 for _, value in logs[tag]):
            found.insert(0, f"{tag} is 0 (below 1e-8) in every update: PPO did not change the policy")
    args = ppo_eval.run_args(module, ckpt, ppo_eval.EvalArgs(checkpoint="unused"))
    maniskill, _ = module.find_env(args.env_id)  # imports the env's module, as the run did
    envs = module.make_envs(args, maniskill, torch.device("cpu"), evaluation=True, run_dir=work, num_eval_steps=16)
    try:
        agent = module.make_agent(args, envs)
    finally:
        envs.close()
    # an own optimizer's parameters that PPO's loss does not reach (PPG's auxiliary head) may move in a phase rarer
    # than the run's iterations
    ppo_stepped = set(ckpt["optimizer"]["state"])
    own_only = {id(p) for optimizer in module.own_optimizers(agent).values() for group in optimizer.param_groups
                for p in group["params"]} - {id(p) for i, p in enumerate(module.ppo_parameters(agent))
                                             if i in ppo_stepped}
    trainable = [name for name, p in agent.named_parameters() if p.requires_grad and id(p) not in own_only]
    after_first = load(run_dir / "ckpt_1.pt")["model"]
    found += [f"the parameter {name} never moved after iteration 1" for name in trainable
              if name in ckpt["model"] and torch.equal(ckpt["model"][name], after_first[name])]
    returns = [value for _, value in logs.get("eval/return", [])]
    if returns_move and len(set(returns)) == 1 and len(returns) > 1:
        found.append(f"the evaluation's return is {returns[0]:.4g} at every iteration")
    return found


def seeds_tolerance(kind: str, argv_of, work: Path, cache: Optional[Path] = None) -> tuple[Optional[float], str]:
    """How far a seed of --num_seeds may part from its run alone: SEEDS_ROUNDING_FACTOR times what the stock
    trainer's first seed parts by in the same runs (its float rounding), and how that was found; from cache where
    the same stock trainer's runs with the same flags found it before."""
    stock_work = work / "stock_seeds"
    stock = str(REPO / f"{kind}.py")
    key = hashlib.sha256(json.dumps([Path(stock).read_text(), argv_of("first")]).encode()).hexdigest()[:16]
    cached = None if cache is None else cache / f"seeds_{kind}_{key}.json"
    if cached is not None and cached.is_file():
        return tuple(json.loads(cached.read_text()))
    results = run_jobs({"first": [stock, *argv_of("first")], "batch": [stock, *argv_of("batch", num_seeds=2)]},
                       stock_work)
    if any(result.returncode != 0 for result in results.values()):
        return None, f"rtol 1e-4, atol 1e-5 (the stock {kind}.py's runs failed there)"
    runs = stock_work / "runs"
    rounding = max(float(((a.double() - b.double()).abs() / b.double().abs().clamp(min=1)).max()) if a.numel() else 0
                   for a, b in tensor_pairs(load(runs / "first/final_ckpt.pt")["model"],
                                            load(runs / "batch/batch__seed1/final_ckpt.pt")["model"]))
    tolerance = max(SEEDS_ROUNDING_FACTOR * rounding, SEEDS_ROUNDING_FLOOR)
    found = tolerance, (f"{tolerance:.1e} of each number's size, at least 1 ({SEEDS_ROUNDING_FACTOR} times the "
                        f"{rounding:.1e} by which the stock {kind}.py's first seed parts from its run alone there)")
    if cached is not None:
        cache.mkdir(parents=True, exist_ok=True)
        cached.with_suffix(f".{os.getpid()}").write_text(json.dumps(found))
        os.replace(cached.with_suffix(f".{os.getpid()}"), cached)  # whole, where two checks write it at once
    return found


def tensor_pairs(a: dict, b: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    return [(a[key], b[key]) for key in a if key in b and a[key].is_floating_point() and a[key].shape == b[key].shape]


def seeds_failures(results: dict, runs: Path, tolerance: Optional[float] = None) -> list[str]:
    batch, alone2 = results["batch"], results["alone2"]
    if batch.returncode != 0 or alone2.returncode != 0:
        return [f"--num_seeds 2 failed: {error_of(batch)}" if batch.returncode != 0 else
                f"seed 2 alone failed: {error_of(alone2)}"]
    return [f"seed {seed}: {d}" for seed, alone in ((1, "first"), (2, "alone2"))
            for d in differences(load(runs / alone / "final_ckpt.pt")["model"],
                                 load(runs / f"batch/batch__seed{seed}/final_ckpt.pt")["model"], exact=False,
                                 tolerance=tolerance)]


if __name__ == "__main__":
    sys.exit(main())
