"""Do the trainers of the working tree give the numbers of another revision? Same seed, same machine, CPU: each
trainer runs a short fixed-seed experiment as it stands now and as it stood at --base, and the two runs' final
weights, optimizer state and logged scalars (timings aside) must be equal to the bit. For refactors that promise to
change no numbers; a change that must change them says so in its commit.

    python benchmarks/same_numbers.py                        # against HEAD: what the uncommitted change does
    python benchmarks/same_numbers.py --base main~3          # against any revision
    python benchmarks/same_numbers.py --trainers ppo ippo    # some of the trainers
    python benchmarks/same_numbers.py --no_maniskill         # without the ManiSkill runs (a minute each)

Prints a markdown row per experiment and exits 1 if any differs.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.util import TIMING_TAGS, fast_args, scalars, script_env  # noqa: E402

# Small experiments that reach each trainer's update, evaluation and checkpoint: the tests' envs, 4 iterations.
EXPERIMENTS = {
    "ppo": [fast_args("tests.envs:PointMass-v0", "run", total_timesteps=32 * 4, norm_obs=True, norm_value=True)],
    "ppo_rnn": [fast_args("tests.envs:PointMassEnds-v0", "run", total_timesteps=32 * 4, seq_len=8,
                          rnn_hidden_size=16, norm_obs=True)],
    "ppo_rgb": [fast_args("tests.envs:PointMassPixels-v0", "run", total_timesteps=32 * 4, norm_obs=True)],
    "ippo": [fast_args("vmas:tests.vmas_scenarios:Clock", "run", total_timesteps=32 * 4, max_episode_steps=16),
             fast_args("pz:tests.pz_envs:meet", "run", total_timesteps=32 * 4, max_episode_steps=8,
                       centralized_critic=True) + ["--env_kwargs", "wide_b=True", "fast_b=True", "with_state=True"]],
}
# ManiSkill's CPU simulation through both paths: 2 training envs in worker processes, 1 evaluation env in-process.
MANISKILL = dict(num_envs=2, num_eval_envs=1, num_steps=8, total_timesteps=8 * 2 * 2, eval_freq=1,
                 max_episode_steps=10, num_eval_steps=10)
MANISKILL_EXPERIMENTS = {trainer: [fast_args(env_id, "run", **MANISKILL)] for trainer, env_id in
                         (("ppo", "PushCube-v1"), ("ppo_rnn", "PushCube-v1"), ("ppo_rgb", "PushCube-v1"),
                          ("ippo", "TwoRobotPickCube-v1"))}


def run(trainer_file: Path, argv: list[str], cwd: Path) -> Path:
    cwd.mkdir(parents=True)
    result = subprocess.run([sys.executable, str(trainer_file), *argv], cwd=cwd, env=script_env(),
                            capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        sys.exit(f"error: {trainer_file} {' '.join(argv)} failed:\n{result.stderr[-2000:]}")
    return cwd / "runs/run"


def differences(a: Path, b: Path) -> list[str]:
    """What differs between two runs: weights, optimizer state, scalars."""
    ckpt_a, ckpt_b = (torch.load(run / "final_ckpt.pt", weights_only=True) for run in (a, b))
    found = [f"model {key}" for key in ckpt_a["model"] if not torch.equal(ckpt_a["model"][key], ckpt_b["model"][key])]
    if str(ckpt_a["optimizer"]) != str(ckpt_b["optimizer"]):
        found.append("optimizer state")
    scalars_a, scalars_b = scalars(a), scalars(b)
    found += [f"scalar {tag}" for tag in sorted((set(scalars_a) | set(scalars_b)) - TIMING_TAGS)
              if scalars_a.get(tag) != scalars_b.get(tag)]
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--base", default="HEAD", help="the revision to compare with (default: HEAD)")
    parser.add_argument("--trainers", nargs="+", choices=list(EXPERIMENTS), default=list(EXPERIMENTS))
    parser.add_argument("--no_maniskill", action="store_true", help="leave out the ManiSkill runs")
    args = parser.parse_args()
    print(f"| trainer | experiment | same numbers as {args.base} |\n|---|---|---|")
    differ = 0
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        base_dir = tmp / "base"
        base_dir.mkdir()
        for trainer in args.trainers:
            shown = subprocess.run(["git", "-C", str(REPO), "show", f"{args.base}:{trainer}.py"], capture_output=True,
                                   text=True)
            if shown.returncode != 0:
                sys.exit(f"error: git show {args.base}:{trainer}.py: {shown.stderr.strip()}")
            (base_dir / f"{trainer}.py").write_text(shown.stdout)
            experiments = EXPERIMENTS[trainer] + ([] if args.no_maniskill else MANISKILL_EXPERIMENTS[trainer])
            for i, argv in enumerate(experiments):
                now = run(REPO / f"{trainer}.py", argv, tmp / f"{trainer}_{i}_now")
                then = run(base_dir / f"{trainer}.py", argv, tmp / f"{trainer}_{i}_base")
                found = differences(now, then)
                differ += bool(found)
                print(f"| {trainer} | {argv[argv.index('--env_id') + 1]} | "
                      f"{'yes' if not found else 'no: ' + ', '.join(found[:4])} |", flush=True)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
