"""Evaluate a checkpoint of ppo.py, ppo_rnn.py, ppo_rgb.py, ippo.py or a copy of one: success rates and returns
with their uncertainty; or export its policy for deployment.

    python ppo_eval.py runs/RUN                                      # the run's final checkpoint, 100 episodes
    python ppo_eval.py runs/RUN/ckpt_250.pt --num_episodes 1000 --num_envs 256
    python ppo_eval.py runs/RUN --capture_video --num_episodes 4     # videos next to the results
    python ppo_eval.py runs/RUN --output results.json --seed 0       # machine-readable, reproducible
    python ppo_eval.py runs/RUN --save_trajectory                    # ManiSkill trajectories (.h5 + .json)
    python ppo_eval.py runs/RUN --trainer ideas/my_idea.py           # a copy's run, the copy elsewhere
    python ppo_eval.py runs/RUN --run_trainer                        # with the trainer file the run kept
    python ppo_eval.py runs/RUN --export policy.pt2                  # the policy for deployment (torch.export)
    python ppo_eval.py runs/RUN --export policy.onnx                 # ONNX: pip install onnx onnxscript onnxruntime
    python ppo_eval.py runs/RUN --capture_video --track              # to the run's wandb run too: pip install wandb

The policy is rebuilt from the checkpoint alone, with the trainer's own code: its Agent, its envs (with the run's
evaluation settings) and its evaluation loop. Env i of N plays its first num_episodes // N episodes, one more for
i < num_episodes % N, so every requested episode is played to its end and counted once, and episodes that end
early weigh no more than those that last. See docs/evaluation.md.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import importlib.util
import itertools
import json
import logging
import math
import os
import random
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal, Optional

import numpy as np
import torch
import torch.nn as nn
import tyro

import ppo  # its checkpoint reading, which every trainer shares

# Per-episode 0/1 outcomes: a rate with a Wilson score interval. Every other metric: mean, std, median, bootstrap.
RATE_METRICS = ("success_once", "success_at_end", "fail_once", "fail_at_end")
Z_95 = 1.959963984540054  # the standard normal's 97.5% quantile


@dataclass
class EvalArgs:
    checkpoint: tyro.conf.Positional[Annotated[str, tyro.conf.arg(metavar="CHECKPOINT")]]
    """a checkpoint file, or a run directory (its final_ckpt.pt, else its newest ckpt_<iteration>.pt)"""
    trainer: Optional[str] = None
    """the checkpoint's trainer file (default: the file it names, beside ppo_eval.py or in the working directory)"""
    run_trainer: bool = False
    """evaluate with the trainer file that wrote the checkpoint, which its run directory keeps (source/), not today's
    file; this runs that file's code: ask for it only for a run you trust"""
    num_episodes: int = 100
    """episodes to evaluate, each played to its end and counted once"""
    num_envs: Optional[int] = None
    """parallel environments (default: the run's --num_eval_envs)"""
    seed: int = 0
    """seeds env resets (env i of a Gymnasium or ManiSkill CPU vector env: seed + i), sampled actions, the bootstrap"""
    stochastic: bool = False
    """sample actions from the policy instead of taking its mode"""
    capture_video: bool = False
    """record videos, as the trainer's evaluation does, under {output_dir}/videos"""
    save_trajectory: bool = False
    """ManiSkill: record every finished episode with RecordEpisode to {output_dir}/trajectory.h5 and .json"""
    output: Optional[str] = None
    """write the results, every episode's record and the checkpoint's identity to this JSON file"""
    output_dir: Optional[str] = None
    """where videos and trajectories go (default: {checkpoint's dir}/eval/{checkpoint name}__seed{seed}__{unix time})"""
    bootstrap_samples: int = 10_000
    """resamples for the bootstrap intervals of the means"""
    cuda: bool = True
    """if toggled, the policy and ManiSkill's simulation and rendering run on CUDA when it is available"""
    torch_threads: int = 1
    """CPU threads for torch (0: torch's default)"""
    track: bool = False
    """log the results and videos to Weights and Biases (needs `pip install wandb`): to the wandb run that trained the
    checkpoint where it was tracked (--track), else to a new run, {run_name}__eval, in the run's project"""
    export: Optional[str] = None
    """instead of evaluating, write the deterministic policy to this .onnx (ONNX) or .pt2 (torch.export) file, and
    what its inputs and outputs are to the file's name with .json added (policy.onnx.json)"""

    env_id: Optional[str] = None
    """evaluate on another task (default: the run's); its spaces must be the checkpoint's"""
    control_mode: Optional[str] = None
    """ManiSkill: another control mode (default: the run's); its action space must be the checkpoint's"""
    sim_backend: Optional[Literal["auto", "gpu", "cpu"]] = None
    """ManiSkill simulation backend (default: the run's)"""
    max_episode_steps: Optional[int] = None
    """the episodes' time limit (default: the run's)"""
    reconfiguration_freq: Optional[int] = None
    """ManiSkill: reconfigure the scenes every this many resets (default: the run's --eval_reconfiguration_freq)"""
    partial_reset: Optional[bool] = None
    """ManiSkill: reset an env on termination, else run to the time limit (default: the run's --eval_partial_reset)"""


# Copied from ppo.py
class UserError(Exception):
    """A mistake the user can fix: reported as one line and exit status 2."""


# What a trainer file holds and defines: import_trainer imports no other file a checkpoint names.
TRAINER_MARKERS = ("TRAINER = Path(__file__).stem", "CHECKPOINT_FORMAT = ", "def make_agent(", "def evaluate(")
TRAINER_API = ("TRAINER", "CHECKPOINT_FORMAT", "UserError", "Args", "find_env", "resolve_sim_backend", "make_envs",
               "make_agent", "load_weights", "evaluate", "CPU_WORKERS_PER_CORE")
# The trainers' own mistakes are the user's too; import_trainer adds each trainer's.
USER_ERRORS = [UserError, ppo.UserError]


# ---------------------------------------------------------------------------------------------
# Statistics
# ---------------------------------------------------------------------------------------------

def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a binomial proportion: unlike the normal approximation, it stays inside [0, 1]
    and does not collapse to a point at 0 or n successes."""
    p = successes / n
    denominator = 1.0 + z**2 / n
    center = (p + z**2 / (2 * n)) / denominator
    half_width = z / denominator * math.sqrt(p * (1.0 - p) / n + z**2 / (4 * n**2))
    return max(0.0, center - half_width), min(1.0, center + half_width)


def bootstrap_interval(values: np.ndarray, samples: int, rng: np.random.Generator) -> tuple[float, float]:
    """The 95% percentile bootstrap interval of the mean."""
    n = len(values)
    means = []
    chunk = max(1, 10_000_000 // n)  # resamples at a time, so that memory stays bounded for many episodes
    for start in range(0, samples, chunk):
        index = rng.integers(0, n, size=(min(chunk, samples - start), n))
        means.append(values[index].mean(axis=1))
    low, high = np.quantile(np.concatenate(means), [0.025, 0.975])
    return float(low), float(high)


def summarize(metrics: dict[str, np.ndarray], bootstrap_samples: int, seed: int) -> dict[str, dict]:
    rng = np.random.default_rng(seed)
    summary = {}
    for key, values in metrics.items():
        values = values[~np.isnan(values)]  # NaN: ippo.py's agent absent from an episode
        if not (n := len(values)):
            continue
        if key in RATE_METRICS:
            successes = int(values.sum())
            summary[key] = {"episodes": n, "successes": successes, "rate": successes / n,
                            "ci95": list(wilson_interval(successes, n)), "interval": "wilson"}
        else:
            summary[key] = {"episodes": n, "mean": float(values.mean()),
                            "std": float(values.std(ddof=1)) if n > 1 else 0.0, "median": float(np.median(values)),
                            "ci95": list(bootstrap_interval(values, bootstrap_samples, rng)), "interval": "bootstrap"}
    return summary


def format_table(summary: dict[str, dict]) -> str:
    lines = [f"{'metric':<24}{'episodes':>9}{'mean':>11}{'std':>11}{'median':>11}   95% interval"]
    for key, row in summary.items():
        low, high = row["ci95"]
        if row["interval"] == "wilson":
            lines.append(f"{key:<24}{row['episodes']:>9}{row['rate']:>11.3f}{'':>22}   [{low:.3f}, {high:.3f}] Wilson")
        else:
            lines.append(f"{key:<24}{row['episodes']:>9}{row['mean']:>11.3f}{row['std']:>11.3f}{row['median']:>11.3f}"
                         f"   [{low:.3f}, {high:.3f}] bootstrap")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# The checkpoint and the run it came from
# ---------------------------------------------------------------------------------------------

def find_checkpoint(path: str) -> Path:
    """A checkpoint file as given; a run directory's final_ckpt.pt, else its newest ckpt_<iteration>.pt."""
    path = Path(path)
    if not path.is_dir():
        return path
    if (path / "final_ckpt.pt").is_file():
        return path / "final_ckpt.pt"
    numbered = ppo.numbered_checkpoints(path)
    if not numbered:
        raise UserError(f"{path} holds no checkpoint (final_ckpt.pt or ckpt_<iteration>.pt)")
    return numbered[max(numbered)]


def load(path: Path, trainer_file: Optional[str], run_trainer: bool = False):
    """The trainer module that wrote the checkpoint (run_trainer: the file its run kept, imported under a name of its
    own, beside today's), and the checkpoint."""
    ckpt = ppo.read_checkpoint(path)
    name, sha256 = ckpt.get("trainer"), ckpt.get("source_sha256")
    if run_trainer:
        if trainer_file is not None:
            raise UserError("--run_trainer evaluates with the file the run kept, --trainer with another: give one")
        if sha256 is None:
            raise UserError(f"{path} names no trainer file of its run (it was written before runs kept theirs); "
                            "evaluate it without --run_trainer")
        kept = ppo.kept_source(path.parent, name, sha256)
        if not kept.is_file():
            raise UserError(f"{kept}, the trainer file that wrote {path}, is missing")
        trainer = import_trainer(name, path, str(kept), module_name=f"{name}__run_{sha256[:12]}")
    else:
        trainer = import_trainer(name, path, trainer_file)
        if sha256 is not None and getattr(trainer, "SOURCE_SHA256", sha256) != sha256:
            print(f"note: {trainer.__file__} differs from the file that wrote {path}; --run_trainer evaluates with "
                  "that one, which its run directory keeps", file=sys.stderr)
    if ckpt["format"] != trainer.CHECKPOINT_FORMAT:
        raise UserError(f"{path} has checkpoint format {ckpt['format']}; {trainer.TRAINER}.py writes format "
                        f"{trainer.CHECKPOINT_FORMAT}")
    return trainer, ckpt


def import_trainer(name, checkpoint: Path, trainer_file: Optional[str], module_name: Optional[str] = None):
    """The module of the file that wrote the checkpoint: --trainer, else {name}.py beside ppo_eval.py or in the working
    directory, and only a file that reads as a trainer. A checkpoint supplies a file name, never a path, so one from
    elsewhere cannot make this import a file from anywhere else, nor one that is not a trainer. module_name: import
    it under another name than its own (a run's kept file beside today's), its functions pickled by value into the
    envs' worker processes, which could not import it by that name."""
    if not isinstance(name, str) or not name.isidentifier():
        raise UserError(f"{checkpoint} names its trainer {name!r}, not a Python file name; ppo_eval.py can import only "
                        "trainers named like Python modules (rename the file, e.g. my_idea.py, and train again)")
    if trainer_file is not None:
        if Path(trainer_file).name != f"{name}.py":
            raise UserError(f"{checkpoint} was written by {name}.py, not by --trainer {trainer_file}")
        if not Path(trainer_file).is_file():
            raise UserError(f"--trainer {trainer_file} does not exist")
        paths = {Path(trainer_file).resolve()}
    else:
        folders = (Path(__file__).parent, Path.cwd())
        paths = {path.resolve() for folder in folders if (path := folder / f"{name}.py").is_file()}
        if not paths:
            raise UserError(f"{checkpoint} was written by {name}.py, which is neither beside ppo_eval.py nor in the "
                            f"working directory; name it with --trainer PATH/{name}.py")
        if len(paths) > 1:
            raise UserError(f"{name}.py is both beside ppo_eval.py and in the working directory, and they are "
                            f"different files; name the one that wrote {checkpoint} with --trainer")
    (path,) = paths
    module_name = module_name or name
    module = sys.modules.get(module_name)
    if module is None:
        # Whatever file the name finds runs when imported: only one that reads as a trainer is imported at all.
        if not all(marker in path.read_text(errors="replace") for marker in TRAINER_MARKERS):
            raise UserError(f"{checkpoint} names {name}.py, and {path} is not a trainer file (it lacks "
                            f"{', '.join(TRAINER_MARKERS)}): not imported")
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module  # CPU simulator workers unpickle the trainer's env builders by module name
        if module_name != name:
            import cloudpickle  # gymnasium's, which pickles AsyncVectorEnv's env builders with it

            cloudpickle.register_pickle_by_value(module)
        added_path = str(path.parent) not in sys.path
        if added_path:
            sys.path.append(str(path.parent))
        try:
            spec.loader.exec_module(module)
        except BaseException:  # leave no half-imported module behind
            del sys.modules[module_name]
            if added_path:
                sys.path.remove(str(path.parent))
            raise
    elif Path(getattr(module, "__file__", None) or "").resolve() != path:
        raise UserError(f"{checkpoint} was written by {name}.py, but a module {name} from elsewhere is already "
                        f"imported ({getattr(module, '__file__', None)}): rename the trainer file and train again")
    if getattr(module, "TRAINER", None) != name or not all(hasattr(module, attr) for attr in TRAINER_API):
        raise UserError(f"{path} is not a trainer that wrote {checkpoint}: its TRAINER is "
                        f"{getattr(module, 'TRAINER', None)!r}, not {name!r}, or it lacks one of "
                        f"{', '.join(TRAINER_API)}")
    if module.UserError not in USER_ERRORS:
        USER_ERRORS.append(module.UserError)
    return module


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def run_args(trainer, ckpt: dict, args: EvalArgs):
    """The trainer's Args of the run, with the evaluation's settings and overrides."""
    saved = ckpt["args"]
    if saved.get("num_seeds", 1) > 1:
        run_dir, name, count = find_checkpoint(args.checkpoint).parent, ckpt["run_name"], saved["num_seeds"]
        first, last = (run_dir / f"{name}__seed{saved['seed'] + i}" for i in (0, count - 1))
        scores = (ckpt.get("pbt") or {}).get("scores")  # a population's (--pbt_interval), at its last ranking
        best = "" if scores is None or scores.isnan().all() else (
            f"; the population's best at its last ranking: {name}__seed"
            f"{saved['seed'] + int(scores.nan_to_num(-math.inf).argmax())}")
        raise UserError(f"{run_dir} is a run of {count} seeds trained together (--num_seeds), whose checkpoints hold "
                        f"no weights: evaluate a seed's run, {first} to {last}{best}")
    run = trainer.Args(**{f.name: saved[f.name] for f in dataclasses.fields(trainer.Args) if f.name in saved})
    overrides = {"num_eval_envs": args.num_envs, "env_id": args.env_id, "control_mode": args.control_mode,
                 "sim_backend": args.sim_backend, "eval_reconfiguration_freq": args.reconfiguration_freq,
                 "eval_partial_reset": args.partial_reset}
    run = dataclasses.replace(run, **{name: value for name, value in overrides.items() if value is not None},
                              capture_video=args.capture_video, cuda=args.cuda, torch_threads=args.torch_threads)
    if not args.cuda:
        if args.sim_backend == "gpu":
            raise UserError("--sim_backend gpu runs ManiSkill on CUDA, which --no_cuda turns off; give one of them")
        run.sim_backend = "cpu"  # the run's "auto" would pick the GPU simulation where CUDA is available
    if run.env_id != saved["env_id"]:
        run.max_episode_steps = None  # the run's time limit was its own task's
    if args.max_episode_steps is not None:
        run.max_episode_steps = args.max_episode_steps
    return run


def validate(args: EvalArgs):
    def require(ok: bool, flag: str, rule: str):
        if not ok:
            raise UserError(f"--{flag} must be {rule}, got {getattr(args, flag)}")

    for flag in ("num_episodes", "bootstrap_samples"):
        require(getattr(args, flag) >= 1, flag, "positive")
    for flag in ("num_envs", "max_episode_steps"):
        require(getattr(args, flag) is None or getattr(args, flag) >= 1, flag, "positive (or None: the run's)")
    require(args.reconfiguration_freq is None or args.reconfiguration_freq >= 0, "reconfiguration_freq",
            "0 (never) or positive (or None: the run's)")
    cores = ppo.usable_cores()
    require(0 <= args.torch_threads <= cores, "torch_threads", f"0 (torch's default) to {cores}, this machine's cores")
    require(bool(args.checkpoint), "checkpoint", "a checkpoint file or a run directory")
    require(args.export is None or Path(args.export).suffix in EXPORT_FORMATS, "export",
            f"a file name ending in {' or '.join(EXPORT_FORMATS)}")
    if args.track and args.export is not None:
        raise UserError("--track logs an evaluation's results, and --export evaluates nothing: give one")
    if args.track and importlib.util.find_spec("wandb") is None:
        raise UserError("--track logs to Weights and Biases, which is not installed: pip install wandb")


def validate_run(run, trainer, maniskill: bool, args: EvalArgs):
    """The checks of the trainer's validate() that concern evaluation envs."""
    num_envs = run.num_eval_envs
    if not 0 <= args.seed <= 2**32 - 1 - num_envs:
        raise UserError(f"--seed must be in [0, {2**32 - 1 - num_envs}] with {num_envs} envs (numpy seeds are below "
                        f"2**32), got {args.seed}")
    if args.save_trajectory and not maniskill:
        raise UserError(f"--save_trajectory records ManiSkill's RecordEpisode trajectories; {run.env_id} is not a "
                        "ManiSkill task")
    if not maniskill and hasattr(trainer, "torch_native_id") and trainer.torch_native_id(run.env_id):
        trainer.refuse_torch_native_flags(run)  # --capture_video
    sim_backend = trainer.resolve_sim_backend(run.sim_backend) if maniskill else None
    if sim_backend == "gpu" and num_envs > 1 and run.eval_partial_reset and run.eval_reconfiguration_freq:
        raise UserError(f"partial resets with reconfiguration every {run.eval_reconfiguration_freq} resets: ManiSkill "
                        "cannot reconfigure a GPU simulation while it resets only some of its envs; pass "
                        "--reconfiguration_freq 0 or --partial_reset False")
    if sim_backend == "cpu" and num_envs > 1:
        cores = ppo.usable_cores()
        if num_envs > trainer.CPU_WORKERS_PER_CORE * cores:
            raise UserError(f"--num_envs={num_envs} would start {num_envs} CPU simulator processes on {cores} cores "
                            f"(at most {trainer.CPU_WORKERS_PER_CORE} per core); try --num_envs={2 * cores}, or a "
                            "machine with CUDA")
        if args.save_trajectory:
            raise UserError("--save_trajectory records through one ManiSkill vector env: on the CPU simulation pass "
                            "--num_envs 1")
    return sim_backend


def prepare_output_dir(args: EvalArgs, checkpoint: Path) -> Optional[Path]:
    if not (args.capture_video or args.save_trajectory):
        return None
    if args.output_dir is not None:
        output_dir = Path(args.output_dir)
    else:
        first = checkpoint.parent / "eval" / f"{checkpoint.stem}__seed{args.seed}__{int(time.time())}"
        names = itertools.chain([first], (first.with_name(f"{first.name}_{k}") for k in itertools.count(2)))
        output_dir = next(path for path in names if not path.exists())  # another evaluation's of this second
    if output_dir.exists() and (not output_dir.is_dir() or any(output_dir.iterdir())):
        raise UserError(f"{output_dir} already exists and is not an empty directory; its files stay as they are: "
                        "pass another --output_dir")
    return output_dir


# ---------------------------------------------------------------------------------------------
# Evaluation
# ---------------------------------------------------------------------------------------------

def main(args: EvalArgs) -> int:
    validate(args)
    checkpoint = find_checkpoint(args.checkpoint)
    trainer, ckpt = load(checkpoint, args.trainer, args.run_trainer)
    run = run_args(trainer, ckpt, args)
    maniskill, time_limit = trainer.find_env(run.env_id)
    sim_backend = validate_run(run, trainer, maniskill, args)
    run.max_episode_steps = run.max_episode_steps or time_limit
    if run.max_episode_steps is None:
        raise UserError(f"{run.env_id} has no time limit, so its episodes might never end; give --max_episode_steps")
    num_envs = run.num_eval_envs
    episodes_per_env = torch.tensor([args.num_episodes // num_envs + (i < args.num_episodes % num_envs)
                                     for i in range(num_envs)])
    # Every episode ends within the time limit, and the next one starts at once.
    max_steps = int(episodes_per_env.max()) * run.max_episode_steps
    output_dir = None if args.export else prepare_output_dir(args, checkpoint)
    for flag, given in (("--output", args.output), ("--export", args.export)):
        if given is not None:
            check_output(Path(given), flag)

    random.seed(args.seed)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    if args.torch_threads > 0:
        torch.set_num_threads(args.torch_threads)
    device = torch.device("cuda" if torch.cuda.is_available() and args.cuda else "cpu")
    trajectory_path = output_dir / "trajectory" if args.save_trajectory else None
    new_dirs = [] if output_dir is None else [path for path in (output_dir, *output_dir.parents) if not path.exists()]
    try:
        envs = trainer.make_envs(run, maniskill, device, evaluation=True, run_dir=output_dir or checkpoint.parent,
                                 num_eval_steps=run.max_episode_steps, trajectory_path=trajectory_path)
        try:
            agent = trainer.make_agent(run, envs).to(device)
            trainer.load_weights(agent, ckpt, run, envs)
            agent.eval()
            if args.export is not None:
                return export(trainer, agent, envs, ckpt, checkpoint, Path(args.export))
            start = time.perf_counter()
            metrics = trainer.evaluate(agent, envs, max_steps, args.seed, episodes_per_env,
                                       deterministic=not args.stochastic)
            seconds = time.perf_counter() - start
            if trajectory_path is not None:
                envs.video_recorder.flush_trajectory(save=False)  # the episodes still running are not evaluated
        finally:
            envs.close()
    except BaseException:
        remove_empty_dirs(output_dir, new_dirs)
        raise
    episodes = int(metrics.pop("episodes").item())
    if episodes != args.num_episodes:
        raise UserError(f"only {episodes} of {args.num_episodes} episodes ended within {max_steps} steps, though "
                        f"{run.env_id}'s time limit is {run.max_episode_steps} steps")
    metrics = {key: values.double().cpu().numpy() for key, values in metrics.items()}
    summary = summarize(metrics, args.bootstrap_samples, args.seed)

    print(f"checkpoint  {checkpoint}  ({trainer.TRAINER}.py, {ckpt['args']['env_id']}, iteration {ckpt['iteration']}, "
          f"global step {ckpt['global_step']})")
    print(f"evaluation  {run.env_id}: {args.num_episodes} episodes on {num_envs} envs, seed {args.seed}, "
          f"{'sampled' if args.stochastic else 'deterministic'} actions, {run.max_episode_steps}-step time limit, "
          f"{seconds:.1f} s")
    print(format_table(summary))
    if output_dir is not None:
        print(f"videos and trajectories: {output_dir}")
    if args.output is not None:
        results = {
            "checkpoint": {"path": str(checkpoint.resolve()), "sha256": sha256(checkpoint), "trainer": trainer.TRAINER,
                           "format": ckpt["format"], "run_name": ckpt["run_name"], "env_id": ckpt["args"]["env_id"],
                           "global_step": ckpt["global_step"], "iteration": ckpt["iteration"]},
            "evaluation": {"env_id": run.env_id, "num_episodes": args.num_episodes, "num_envs": num_envs,
                           "episodes_per_env": episodes_per_env.tolist(), "deterministic": not args.stochastic,
                           "max_episode_steps": run.max_episode_steps,
                           "control_mode": run.control_mode if maniskill else None,
                           "sim_backend": sim_backend, "partial_reset": run.eval_partial_reset if maniskill else None,
                           "reconfiguration_freq": run.eval_reconfiguration_freq if maniskill else None,
                           "device": str(device), "bootstrap_samples": args.bootstrap_samples, "seconds": seconds,
                           "output_dir": None if output_dir is None else str(output_dir)},
            "seeds": {"env_reset": args.seed, "torch": args.seed, "numpy": args.seed, "python": args.seed,
                      "bootstrap": args.seed},
            "metrics": summary,
            "episodes": [{key: episode_value(key, values[i]) for key, values in metrics.items()}
                         for i in range(episodes)],
        }
        if "agents" in ckpt:  # ippo.py's
            results["checkpoint"]["agents"] = ckpt["agents"]
        write_json(Path(args.output), results)
        print(f"results: {args.output}")
    if args.track:
        track(trainer, ckpt, checkpoint, summary, output_dir)
    return 0


def track(trainer, ckpt: dict, checkpoint: Path, summary: dict[str, dict], output_dir: Optional[Path]):
    """--track: the evaluation's means and rates, and its videos, logged to the wandb run that trained the checkpoint
    where it was tracked and has ended, else to a new one. wandb keeps a run's own steps increasing, so they are
    logged against the checkpoint's global step as a metric of their own (ppo_eval/global_step)."""
    import wandb

    saved = ckpt["args"]
    tracked = bool(saved.get("track")) and ckpt.get("run_id") is not None
    if tracked and still_training(checkpoint.parent):  # wandb takes one process's writes to a run
        print(f"note: {checkpoint.parent} is still training, so the evaluation goes to a wandb run of its own, "
              f"{ckpt['run_name']}__eval", file=sys.stderr)
        tracked = False
    run_id = ppo.wandb_run_id(ckpt["run_id"], saved["seed"]) if tracked else None
    project = ppo.wandb_project(saved.get("wandb_project_name"), trainer.find_env(saved["env_id"])[0])
    try:
        run = wandb.init(project=project, entity=saved.get("wandb_entity"),
                         group=saved.get("wandb_group"), tags=list(saved.get("wandb_tags") or []),
                         name=ckpt["run_name"] if tracked else f"{ckpt['run_name']}__eval", id=run_id,
                         resume="allow" if tracked else None, config=None if tracked else saved,
                         dir=os.environ.get("WANDB_DIR", checkpoint.parent), reinit="create_new")
    except (wandb.errors.Error, ValueError) as e:  # ValueError: settings wandb refuses (WANDB_MODE=...)
        raise UserError(ppo.wandb_start_failed(e)) from e
    run.define_metric("ppo_eval/*", step_metric="ppo_eval/global_step")
    values = {f"ppo_eval/{key}": row["rate"] if row["interval"] == "wilson" else row["mean"]
              for key, row in summary.items()}
    videos = [] if output_dir is None else sorted((output_dir / "videos").glob("*.mp4"))
    if videos:
        values["ppo_eval/video"] = [wandb.Video(str(path), format="mp4") for path in videos]
    run.log({"ppo_eval/global_step": ckpt["global_step"], **values})
    run.finish()


# ---------------------------------------------------------------------------------------------
# Export
# ---------------------------------------------------------------------------------------------

EXPORT_FORMATS = (".onnx", ".pt2")


class DeployedPolicy(nn.Module):
    """A checkpoint's deterministic policy, taking what its env gives and returning what its env takes: the
    observation normalization inside, then the trainer's own env_action() (ppo.py's clamps Box actions to their
    bounds and counts discrete ones from the space's start; a copy's may squash, scale or map), in the action
    space's dtype. Inputs: ppo.py's observation; ppo_rgb.py's observation dict as one input a key, in input_names'
    order; ppo_rnn.py's observation, recurrent state and episode start, with the next state as a second output; the
    observation of ippo.py's agent agent_index, and its own action (agents of different spaces share padded ones in
    training). A --critic_obs policy takes the actor's observation alone: the observation without the critic's
    privileged part. Where the env gives action masks, the mask follows the observation as an input (True where an
    action is allowed), and the policy's mode is over the actions it allows. env_action() gets this module in place
    of the envs: it holds their action spaces and bounds (ENV_ACTION_READS), on the CPU."""

    ENV_ACTION_READS = ("single_action_space", "action_spaces", "action_low", "action_high", "action_start")

    def __init__(self, trainer, agent: nn.Module, envs, agent_index: Optional[int] = None):
        super().__init__()
        self.env_action = trainer.env_action
        self.agent = agent
        self.agent_index = agent_index
        self.recurrent = hasattr(agent, "initial_state")
        # ppo_rnn.py's sequences are (batch, time, ...) (SEQUENCES_BATCH_FIRST); those of its earlier copies, which
        # have no such line, (time, batch, ...)
        self.time_dim = 1 if getattr(trainer, "SEQUENCES_BATCH_FIRST", False) else 0
        self.keys = [key for key in envs.obs_layout if key != "critic"] if hasattr(envs, "obs_layout") else None
        self.masked = getattr(envs, "action_mask", None) is not None
        self.obs_dim = getattr(agent, "obs_dim", None)  # the actor's first dims of ppo.py's and ppo_rnn.py's
        self.box = hasattr(envs, "action_low")
        self.action_size = None  # ippo.py's agent's own entries of the joint action (all of a Discrete one's)
        self.action_space = space = envs.single_action_space if agent_index is None else envs.action_spaces[agent_index]
        self.action_dtype = torch.from_numpy(np.zeros(0, space.dtype)).dtype  # MultiBinary's int8, say
        if agent_index is not None:
            self.obs_dim, self.row_dim = envs.agent_obs_dims[agent_index], envs.obs_dim
            self.mask_width = envs.action_mask.shape[-1] if self.masked else None
            self.action_size = space.shape[0] if space.shape else None
        for name in self.ENV_ACTION_READS:
            value = getattr(envs, name, None)
            if isinstance(value, torch.Tensor):
                self.register_buffer(name, value.cpu())
            elif value is not None:
                setattr(self, name, value)
        self.input_names = ((self.keys or ["obs"]) + (["action_mask"] if self.masked else [])
                            + (["rnn_state", "episode_start"] if self.recurrent else []))
        self.output_names = ["action"] + (["next_rnn_state"] if self.recurrent else [])

    def forward(self, *inputs: torch.Tensor):
        action, *state = self.policy_action(*inputs)
        action = self.to_env(self.env_action(self, action))
        return (action, *state) if self.recurrent else action

    def policy_action(self, *inputs: torch.Tensor) -> tuple:
        """The agent's deterministic action before env_action() (ippo.py's: every agent's, each given this
        observation), and ppo_rnn.py's next state."""
        agent = self.agent
        num_obs = len(self.keys or ["obs"])
        obs = dict(zip(self.keys, inputs)) if self.keys else inputs[0]
        action_mask = inputs[num_obs] if self.masked else None
        if self.recurrent:
            state, episode_start = inputs[-2:]
            masked = {} if action_mask is None else {"action_mask": action_mask.unsqueeze(self.time_dim)}
            action, state = agent.get_action(agent.normalize_obs(obs).unsqueeze(self.time_dim), state,
                                             episode_start.unsqueeze(self.time_dim), deterministic=True, **masked)
            return action.select(self.time_dim, 0), state
        if self.agent_index is not None:  # every agent's actor sees only its own row: give each this observation
            obs = nn.functional.pad(obs, (0, self.row_dim - self.obs_dim))[:, None].expand(-1, agent.num_agents, -1)
            if action_mask is not None:  # and this mask, its own logits' of the joint action space's
                action_mask = nn.functional.pad(action_mask, (0, self.mask_width - action_mask.shape[-1]))
                action_mask = action_mask[:, None].expand(-1, agent.num_agents, -1)
        masked = {} if action_mask is None else {"action_mask": action_mask}  # a trainer older than masks takes none
        return (agent.get_action(agent.normalize_obs(obs), deterministic=True, **masked),)

    def to_env(self, action: torch.Tensor) -> torch.Tensor:
        """ippo.py's agent's own action out of the joint one; in the action space's dtype."""
        if self.agent_index is not None:
            action = action[:, self.agent_index]
            action = action if self.action_size is None else action[:, :self.action_size]
        return action.to(self.action_dtype)


def export(trainer, agent: nn.Module, envs, ckpt: dict, checkpoint: Path, path: Path) -> int:
    """Write the policy (ippo.py's: one file per agent, path's stem and the agent's name), traced on the env's first
    observations."""
    first = envs.reset(seed=0)
    if "agents" not in ckpt:
        export_policy(DeployedPolicy(trainer, agent, envs), first, envs, ckpt, checkpoint, path)
    for i, name in enumerate(ckpt.get("agents", [])):
        agent_path = path.with_name(f"{path.stem}_{name}{path.suffix}")
        export_policy(DeployedPolicy(trainer, agent, envs, i), first[:, i], envs, ckpt, checkpoint, agent_path,
                      agent=name, observation_space=ckpt["observation_spaces"][i],
                      action_space=ckpt["action_spaces"][i])
    return 0


def export_policy(policy: DeployedPolicy, first, envs, ckpt: dict, checkpoint: Path, path: Path, **about):
    """Write the policy, traced on first (two rows at least: a batch of one would fix the batch size), and check
    what the file computes on those inputs against the action the envs receive in training: the agent's action
    through the trainer's env_action() with the envs themselves. Describe it in a JSON file beside it."""
    policy = policy.cpu()
    observations = [first[key] for key in policy.keys] if policy.keys else [first[..., :policy.obs_dim]]
    if policy.masked:  # ippo.py's agent: its own mask, of its own logits
        own_logits = int(logits_per_dimension(policy.action_space).sum())
        observations.append(envs.action_mask if policy.agent_index is None else
                            envs.action_mask[:, policy.agent_index, :own_logits])
    inputs = [(x if len(x) > 1 else torch.cat([x, x])).cpu() for x in observations]
    batch = torch.export.Dim("batch")
    dynamic_shapes = [{0: batch} for _ in inputs]
    if policy.recurrent:
        inputs += [policy.agent.initial_state(len(inputs[0]), torch.device("cpu")),
                   torch.ones(len(inputs[0]), dtype=torch.bool)]
        dynamic_shapes += [{1: batch}, {0: batch}]
    inputs = tuple(inputs)
    with torch.no_grad():
        action, *state = policy.policy_action(*inputs)
        try:
            policy(*inputs)
        except AttributeError as e:
            raise UserError(f"{ckpt['trainer']}.py's env_action() reads what an exported policy does not carry "
                            f"({e}); it may read the envs' {', '.join(policy.ENV_ACTION_READS)}") from e
        received = policy.to_env(policy.env_action(envs, action.to(envs.device)).cpu())
        if policy.masked and not honours_masks(policy, inputs, len(observations) - 1):
            raise UserError(f"{ckpt['trainer']}.py's get_action() takes actions that its action_mask forbids: it must "
                            "give the mask to the distribution (DiscreteActions.mode(logits, action_mask))")
    expected = (received, *state)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's exporters warn of their own internals
            outputs = write_policy(policy, inputs, (tuple(dynamic_shapes),), path)
    except OSError as e:
        raise UserError(f"the policy could not be written to {path}: {e.strerror}") from e
    error = max(float(np.abs(out.astype(np.float64) - x.numpy()).max()) for out, x in zip(outputs, expected))
    description = {
        "format": path.suffix[1:], "file": path.name, "checkpoint": str(checkpoint.resolve()),
        "sha256": sha256(checkpoint), "trainer": ckpt["trainer"], "env_id": ckpt["args"]["env_id"],
        "inputs": [tensor_spec(name, x) for name, x in zip(policy.input_names, inputs)],
        "outputs": [tensor_spec(name, x) for name, x in zip(policy.output_names, expected)],
        "observation_space": ckpt["observation_space"], "action_space": ckpt["action_space"], **about,
        "actions": f"what the envs receive in training: the policy's mode through {ckpt['trainer']}.py's env_action()",
        "observation_normalization": "inside", "deterministic": True,
    }
    if policy.recurrent:
        description["initial_rnn_state"] = ("zeros; episode_start is True at an episode's first observation, which "
                                            "also resets the rnn_state it is given to zeros")
    if policy.masked:
        description["action_mask"] = ("True where the env allows an action (info['action_mask']), a MultiDiscrete's "
                                      "dimensions one after another; the action is the mode of those allowed")
    if ckpt["args"].get("critic_obs"):
        description["critic_obs"] = "the critic's privileged observation (--critic_obs) is not an input"
    if policy.keys and envs.vectors:
        description["state"] = "the observation's vectors, concatenated: " + ", ".join(
            f"{key} ({size})" for key, size in envs.vectors)
    described = path.with_name(path.name + ".json")  # its own: policy.onnx and policy.pt2 both may be written
    write_json(described, description)
    print(f"policy      {path} ({path.suffix[1:]}), described in {described}; on the env's first "
          f"observations its actions differ from what the envs receive in training by {error:.1e} at most")


def write_policy(policy: DeployedPolicy, inputs: tuple, dynamic_shapes: tuple, path: Path) -> list[np.ndarray]:
    """Write the policy as ONNX or torch.export's program; return what the written file computes from inputs."""
    if path.suffix == ".pt2":
        torch.export.save(torch.export.export(PolicyReads(policy, inputs, dynamic_shapes), inputs,
                                              dynamic_shapes=dynamic_shapes), str(path))
        with torch.no_grad():
            return [x.numpy() for x in as_tuple(torch.export.load(str(path)).module()(*inputs))]
    try:
        import onnxruntime
        import onnxscript  # noqa: F401  (torch.onnx.export's dynamo exporter needs it)
    except ImportError as e:
        raise UserError(f"--export to ONNX needs onnx, onnxscript and onnxruntime: pip install onnx onnxscript "
                        f"onnxruntime ({e})") from e
    # the exporter logs a warning for each of torchvision's operators when torchvision is not installed: not ours
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)
    torch.onnx.export(policy, inputs, str(path), dynamo=True, verbose=False, external_data=False,
                      input_names=policy.input_names, output_names=policy.output_names, dynamic_shapes=dynamic_shapes)
    session = onnxruntime.InferenceSession(str(path))
    return session.run(None, {name: x.numpy() for name, x in zip(policy.input_names, inputs)})


class PolicyReads(nn.Module):
    """The policy holding only the tensors its action reads (the ONNX exporter drops the others itself): a program
    exported from the whole DeployedPolicy would carry the critic, and a copy's auxiliary heads and buffers."""

    def __init__(self, policy: DeployedPolicy, inputs: tuple, dynamic_shapes: tuple):
        super().__init__()
        object.__setattr__(self, "policy", policy)  # not a submodule: its tensors are exported only as read below
        program = torch.export.export(policy, inputs, dynamic_shapes=dynamic_shapes)
        read = {node.name for node in program.graph.nodes if node.op == "placeholder" and node.users}
        signature = program.graph_signature
        self.names = [name for placeholder, name in {**signature.inputs_to_parameters,
                                                     **signature.inputs_to_buffers}.items() if placeholder in read]
        tensors = {**dict(policy.named_parameters()), **dict(policy.named_buffers())}
        for name in self.names:
            self.register_buffer(name.replace(".", "__"), tensors[name].detach())

    def forward(self, *inputs: torch.Tensor):
        read = {name: getattr(self, name.replace(".", "__")) for name in self.names}
        return torch.func.functional_call(self.policy, read, inputs)


def logits_per_dimension(space) -> torch.Tensor:
    """A discrete action space's logits (its action mask's entries) in each dimension."""
    return torch.as_tensor(getattr(space, "nvec", [getattr(space, "n", 0)])).reshape(-1)


def honours_masks(policy: DeployedPolicy, inputs: tuple, mask_index: int) -> bool:
    """Whether the policy, on the env's first observations, takes the one action (of each dimension) that a mask
    allows, where that is not the action it takes when everything is allowed."""
    def agent_action(action_mask: torch.Tensor) -> torch.Tensor:
        action = policy.policy_action(*inputs[:mask_index], action_mask, *inputs[mask_index + 1:])[0]
        return policy.to_env(action).reshape(len(action_mask), -1).long()  # the agent's own, counted from 0
    nvec = logits_per_dimension(policy.action_space)
    other = (agent_action(torch.ones_like(inputs[mask_index])) + 1) % nvec
    only_other = torch.zeros_like(inputs[mask_index]).scatter_(1, other + torch.cumsum(nvec, 0) - nvec, True)
    return torch.equal(agent_action(only_other), other)


def as_tuple(x) -> tuple:
    return x if isinstance(x, (tuple, list)) else (x,)


def tensor_spec(name: str, x: torch.Tensor) -> dict:
    batch_dim = 1 if name.endswith("rnn_state") else 0  # (num_layers, batch, state_size)
    shape = ["batch" if i == batch_dim else size for i, size in enumerate(x.shape)]
    return {"name": name, "shape": shape, "dtype": str(x.dtype).removeprefix("torch.")}


def episode_value(key: str, value: float):
    if np.isnan(value):  # ippo.py's agent absent from this episode
        return None
    if key in RATE_METRICS:
        return bool(value)
    return int(value) if key == "episode_len" else float(value)


def still_training(run_dir: Path) -> bool:
    """Whether a trainer holds the run directory's lock (RunDirLock's)."""
    try:
        with open(run_dir / ".lock") as lock:
            fcntl.flock(lock, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except FileNotFoundError:
        return False
    except BlockingIOError:
        return True
    return False


def remove_empty_dirs(output_dir: Optional[Path], new_dirs: list[Path]):
    """A failed evaluation leaves no empty directory behind that it created, and never removes a file."""
    if output_dir is None or not output_dir.is_dir():
        return
    for directory in sorted((p for p in output_dir.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(directory.iterdir()):
            directory.rmdir()
    for directory in new_dirs:
        if not directory.is_dir() or any(directory.iterdir()):
            break
        directory.rmdir()


def check_output(path: Path, flag: str):
    """Try a write where --output or --export goes before any work, so that a path that cannot be written fails at
    once."""
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory; give a file name, e.g. "
                        f"{path / ('results.json' if flag == '--output' else 'policy.onnx')}")
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.touch()
        tmp.unlink()
    except OSError as e:
        raise UserError(f"{flag} {path} cannot be written ({e.strerror}); give a file in a writable directory") from e


def strict_json(x):
    """x with its infinite and NaN floats (a Box's unbounded side) as null: JSON has no Infinity."""
    if isinstance(x, dict):
        return {key: strict_json(value) for key, value in x.items()}
    if isinstance(x, (list, tuple)):
        return [strict_json(value) for value in x]
    return None if isinstance(x, float) and not math.isfinite(x) else x


def write_json(path: Path, results: dict):
    """Write to a temporary file, then rename: an interrupted write never leaves half a file."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(json.dumps(strict_json(results), indent=2, allow_nan=False) + "\n")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UserError(f"the results (above) could not be written to {path}: {e.strerror}") from e


def cli(argv: Optional[list[str]] = None) -> int:
    try:
        args = tyro.cli(EvalArgs, args=sys.argv[1:] if argv is None else argv, use_underscores=True,
                        description=__doc__)
        return main(args)
    except tuple(USER_ERRORS) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # videos or trajectories that cannot be written, a full disk
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(cli())
