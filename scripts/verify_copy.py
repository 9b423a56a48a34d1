"""Does a copy of a trainer keep the copy contract (ppo.py's docstring)? Short runs of the copy on a small env of the
tests (tests/envs.py's PointMass, whose episodes restart alike whatever their seed, so a resumed run can equal an
uninterrupted one), then a table of what holds, each failure with what to change.

    python scripts/verify_copy.py my_idea.py                                   # PointMass, Box actions
    python scripts/verify_copy.py my_idea.py --env_id tests.envs:PointMassDiscrete-v0   # or MultiDiscrete, MultiBinary
    python scripts/verify_copy.py my_idea.py --flags "--ent_coef 0.01"         # the copy's own flags, for every run
    python scripts/verify_copy.py my_idea.py --checks resume exports           # some of the checks

The checks, each run of the copy a process of its own in a temporary directory, two at a time:
  trains      4 iterations end with a final checkpoint whose numbers are all finite
  same_seed   the same seed twice: the same weights, optimizer state and logged numbers, to the bit
  resume      stopped by SIGTERM after iteration 2 and resumed, the run ends as the uninterrupted one: the same
              weights and buffers (the Agent's state, a copy's own buffers included), optimizer state, reward
              normalizer, to the bit
  seeds       (a copy of ppo.py) --num_seeds 2 ends with each seed as its run alone, to float rounding
  evaluates   ppo_eval.py evaluates the final checkpoint
  exports     the ONNX policy of ppo_eval.py --export gives the actions the envs received from the copy in training
              (where TorchVecEnv hands them to the Gymnasium vector env), on 10 steps of 2 envs; ippo.py's copies:
              the export and its own check. Needs pip install onnx onnxscript onnxruntime
Exits 1 if a check fails. Not scripts/check_copies.py, which keeps the project's own trainers' marked copies equal.
"""

import argparse
import contextlib
import importlib.util
import logging
import os
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ppo_eval  # noqa: E402
from tests.util import TIMING_TAGS, fast_args, scalars  # noqa: E402

# Which trainer a copy is of, by a field of its Args; its default env and flags.
KINDS = {"ippo": ("agent_obs", "vmas:tests.vmas_scenarios:Clock", dict(max_episode_steps=16)),
         "ppo_rnn": ("rnn_hidden_size", "tests.envs:PointMass-v0", dict(seq_len=8, rnn_hidden_size=16)),
         "ppo_rgb": ("obs_mode", "tests.envs:PointMassPixels-v0", {}),
         "ppo": ("num_seeds", "tests.envs:PointMass-v0", {})}
CHECKS = ("trains", "same_seed", "resume", "seeds", "evaluates", "exports")
ITERATIONS, STOP_AFTER = 4, 2
NUM_ENVS = 3  # not the number of seeds of the seeds check: a buffer broadcast against the wrong dimension fails
# Runs the copy with its update() wrapped to send this process SIGTERM after iteration STOP_AFTER's: the trainer
# saves at the end of that iteration and exits, as a run stopped by a scheduler does.
STOPPED_RUN = """
import importlib.util, os, signal, sys
path, stop_after, argv = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
copy = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = copy
sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
spec.loader.exec_module(copy)
update, calls = copy.update, []
def update_then_stop(*args, **kwargs):
    stats = update(*args, **kwargs)
    calls.append(1)
    if len(calls) == stop_after:
        os.kill(os.getpid(), signal.SIGTERM)
    return stats
copy.update = update_then_stop
sys.argv[0] = path
sys.exit(copy.cli(argv))
"""


def run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def load(path: Path) -> dict:
    return torch.load(path, map_location="cpu", weights_only=True)


def differences(a, b, exact: bool, where: str = "") -> list[str]:
    """Where two checkpoints' tensors (nested dicts and lists of them) differ."""
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{where or 'the checkpoint'} holds {sorted(map(str, a.keys() ^ b.keys()))} in one run only"]
        return [d for key in a for d in differences(a[key], b[key], exact, f"{where}/{key}")]
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, exact, f"{where}/{i}")]
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        same = torch.equal(a, b) if exact else a.shape == b.shape and torch.allclose(
            a.double(), b.double(), rtol=1e-4, atol=1e-5, equal_nan=True)
        return [] if same else [where]
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

    def add(self, name: str, failures: list[str], fix: str, skipped: str = ""):
        self.rows.append((name, "skipped" if skipped else "fails" if failures else "holds",
                          skipped or ("; ".join(failures[:3]) + (f" (and {len(failures) - 3} more)" if len(failures) > 3
                                                                  else "") + f". {fix}" if failures else "")))

    def table(self) -> str:
        lines = ["| check | result | what to change |", "|---|---|---|"]
        return "\n".join(lines + [f"| {name} | {result} | {why} |" for name, result, why in self.rows])

    def failed(self) -> bool:
        return any(result == "fails" for _, result, _ in self.rows)


def error_of(result: subprocess.CompletedProcess) -> str:
    lines = [line for line in result.stderr.replace("\r", "\n").splitlines() if line.strip()]
    errors = [line[line.index("error:"):] for line in lines if "error:" in line]
    return (errors or lines or [f"exit status {result.returncode}"])[-1]


def import_copy(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = module
    sys.path.insert(0, str(path.parent))
    spec.loader.exec_module(module)
    return module


def kind_of(module) -> str:
    fields = module.Args.__dataclass_fields__
    return next(kind for kind, (field, _, _) in KINDS.items() if field in fields or kind == "ppo")


def recorded_actions(module, ckpt: dict, work: Path):
    """10 steps of 2 eval envs acting with the checkpoint's deterministic policy through the copy's own code: the
    observations (and recurrent inputs) the policy saw, and the actions the Gymnasium vector env received."""
    args = ppo_eval.run_args(module, ckpt, ppo_eval.EvalArgs(checkpoint="unused", num_envs=2))
    envs = module.make_envs(args, False, torch.device("cpu"), evaluation=True, run_dir=work, num_eval_steps=16)
    agent = module.make_agent(args, envs)
    module.load_weights(agent, ckpt, args, envs)
    agent.eval()
    received, inputs, vector_step = [], [], envs.env.step
    envs.env.step = lambda action: received.append(np.array(action, copy=True)) or vector_step(action)
    recurrent = hasattr(agent, "initial_state")
    obs, rnn_state = envs.reset(seed=0), agent.initial_state(2, torch.device("cpu")) if recurrent else None
    episode_start = torch.ones(2, dtype=torch.bool)
    try:
        for _ in range(10):
            with torch.no_grad():
                if recurrent:
                    inputs.append({"obs": obs, "rnn_state": rnn_state, "episode_start": episode_start})
                    action, rnn_state = agent.get_action(agent.normalize_obs(obs)[None], rnn_state,
                                                         episode_start[None], deterministic=True)
                    action = action[0]
                else:
                    inputs.append(dict(obs) if isinstance(obs, dict) else {"obs": obs})
                    action = agent.get_action(agent.normalize_obs(obs), deterministic=True)
            obs, _, terminated, truncated, _, _ = envs.step(action)
            episode_start = terminated | truncated
    finally:
        envs.close()
    return inputs, received, recurrent


def check_export(checks: Checks, copy: Path, module, kind: str, run_dir: Path, work: Path):
    fix = ("make the envs receive env_action()'s action and nothing else: an exported policy computes "
           "env_action(get_action(normalize_obs(obs), deterministic=True))")
    try:
        import onnxruntime
    except ImportError:
        checks.add("exports", [], "", skipped="pip install onnx onnxscript onnxruntime")
        return
    path = work / "policy.onnx"
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # the exporter's notes on its own internals
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        status = ppo_eval.cli([str(run_dir), "--export", str(path), "--trainer", str(copy)])
    if status != 0:
        checks.add("exports", [f"ppo_eval.py --export failed (exit status {status}; its error line above)"], fix)
        return
    if kind == "ippo":
        checks.add("exports", [], "")
        return
    ckpt = load(run_dir / "final_ckpt.pt")
    inputs, received, recurrent = recorded_actions(module, ckpt, work)
    session = onnxruntime.InferenceSession(str(path))
    names = [spec.name for spec in session.get_inputs()]
    state, failures = None, []
    for step, (given, env_action) in enumerate(zip(inputs, received)):
        if recurrent and state is not None:
            given = {**given, "rnn_state": state}
        feed = {name: (given[name][..., :session.get_inputs()[i].shape[-1]] if name == "obs" else given[name])
                for i, name in enumerate(names)}
        outputs = session.run(None, {name: np.asarray(value) for name, value in feed.items()})
        state = outputs[1] if recurrent else None
        if outputs[0].shape != env_action.shape or not np.allclose(outputs[0].astype(np.float64),
                                                                   env_action.astype(np.float64), atol=1e-5):
            failures.append(f"at step {step} the exported policy gives {np.ravel(outputs[0])[:4].tolist()}, the envs "
                            f"received {np.ravel(env_action)[:4].tolist()}")
            break
    checks.add("exports", failures, fix)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("copy", help="the copy of a trainer, e.g. my_idea.py")
    parser.add_argument("--env_id", help="the env of the runs (default: the trainer's PointMass, Box actions)")
    parser.add_argument("--flags", default="", help="the copy's own flags, added to every run (quoted)")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS), help="the checks to run")
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
    kind = kind_of(module)
    _, env_id, flags = KINDS[kind]
    env_id = args.env_id or env_id
    extra = shlex.split(args.flags)

    def argv_of(name: str, **overrides) -> list[str]:
        return fast_args(env_id, name, num_envs=NUM_ENVS, total_timesteps=16 * NUM_ENVS * ITERATIONS,
                         eval_freq=ITERATIONS, **flags, **overrides) + extra

    checks, wanted = Checks(), set(args.checks)
    with tempfile.TemporaryDirectory() as directory:
        work = Path(directory)
        jobs = {"first": [str(copy), *argv_of("first")]}
        if "same_seed" in wanted:
            jobs["again"] = [str(copy), *argv_of("again")]
        if "resume" in wanted:
            jobs["stopped"] = ["-c", STOPPED_RUN, str(copy), str(STOP_AFTER), *argv_of("stopped")]
        if "seeds" in wanted and kind == "ppo":
            jobs.update({"alone2": [str(copy), *argv_of("alone2", seed=2)],
                         "batch": [str(copy), *argv_of("batch", num_seeds=2)]})
        with ThreadPoolExecutor(max_workers=2) as pool:  # two at a time, one per core
            results = dict(zip(jobs, pool.map(lambda job: run(job, work), jobs.values())))
        runs = work / "runs"

        first = results["first"]
        if first.returncode != 0:
            checks.add("trains", [f"the run failed: {error_of(first)}"], "make a short run of the copy work first")
            print(checks.table())
            return 1
        ckpt = load(runs / "first/final_ckpt.pt")
        nonfinite = [key for key, value in ckpt["model"].items()
                     if value.is_floating_point() and not torch.isfinite(value).all()]
        checks.add("trains", [f"non-finite {key}" for key in nonfinite],
                   "find where the loss or an update gives NaN or inf")

        if "same_seed" in wanted:
            check_same_seed(checks, results["again"], ckpt, runs)
        if "resume" in wanted:
            check_resume(checks, copy, results["stopped"], ckpt, work)
        if "seeds" in wanted:
            check_seeds(checks, kind, results, runs)
        if "evaluates" in wanted:
            evaluated = run([str(REPO / "ppo_eval.py"), str(runs / "first"), "--num_episodes", "2", "--trainer",
                             str(copy)], work)
            checks.add("evaluates", [] if evaluated.returncode == 0 else
                       [f"ppo_eval.py failed: {error_of(evaluated)}"],
                       "keep make_envs(), make_agent(), load_weights() and evaluate() as ppo_eval.py calls them")
        if "exports" in wanted:
            check_export(checks, copy, module, kind, runs / "first", work)
    print(f"{copy.name} ({kind}.py's copy) on {env_id}, {ITERATIONS} iterations a run:")
    print(checks.table())
    return 1 if checks.failed() else 0


def check_same_seed(checks: Checks, again: subprocess.CompletedProcess, ckpt: dict, runs: Path):
    if again.returncode != 0:
        found = [f"the second run failed: {error_of(again)}"]
    else:
        first_logs, again_logs = logged(runs / "first"), logged(runs / "again")
        found = differences(state(ckpt), state(load(runs / "again/final_ckpt.pt")), exact=True) + [
            f"logged {tag}" for tag in sorted(first_logs.keys() | again_logs.keys())
            if first_logs.get(tag) != again_logs.get(tag)]
    checks.add("same_seed", found, "draw from torch's generators and the env's self.np_random, which the seed "
               "seeds; not from an unseeded generator (np.random.default_rng(), random.Random(), the clock)")


def check_resume(checks: Checks, copy: Path, stopped: subprocess.CompletedProcess, ckpt: dict, work: Path):
    runs = work / "runs"
    if stopped.returncode != 128 + 15:
        found = [f"the run stopped by SIGTERM after iteration {STOP_AFTER} exited with {stopped.returncode}: "
                 f"{error_of(stopped)}"]
    else:
        resumed = run([str(copy), "--resume", str(runs / "stopped")], work)
        found = ([f"--resume failed: {error_of(resumed)}"] if resumed.returncode != 0 else
                 differences(state(ckpt), state(load(runs / "stopped/final_ckpt.pt")), exact=True))
    checks.add("resume", found, "keep state that changes training in the Agent (self.register_buffer(...)), which "
               "checkpoints save and --resume restores, not in a Python attribute or a variable of train()")


def check_seeds(checks: Checks, kind: str, results: dict, runs: Path):
    if kind != "ppo":
        checks.add("seeds", [], "", skipped=f"{kind}.py has no --num_seeds")
        return
    batch, alone2 = results["batch"], results["alone2"]
    if batch.returncode != 0 or alone2.returncode != 0:
        found = [f"--num_seeds 2 failed: {error_of(batch)}" if batch.returncode != 0 else
                 f"seed 2 alone failed: {error_of(alone2)}"]
    else:
        found = [f"seed {seed}: {d}" for seed, alone in ((1, "first"), (2, "alone2"))
                 for d in differences(load(runs / alone / "final_ckpt.pt")["model"],
                                      load(runs / f"batch/batch__seed{seed}/final_ckpt.pt")["model"], exact=False)]
    checks.add("seeds", found, "follow 'Shapes' of the contract (ppo.py's docstring): reduce over the last dimension, "
               "index parameters and buffers from the end, compare statistics elementwise")


if __name__ == "__main__":
    sys.exit(main())
