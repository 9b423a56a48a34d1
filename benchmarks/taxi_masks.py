"""ppo.py on Gymnasium's Taxi-v4 with and without its action masks, at the same budget, seeds in one process
(--num_seeds). Taxi gives info["action_mask"] at reset and every step: which of its 6 actions (4 moves, pick up, drop
off) change the state. A pick-up or drop-off where none can happen costs -10 (and a step); with the masks the policy
never takes one. The unmasked variant is the same env with info["action_mask"] removed.

    python benchmarks/taxi_masks.py                                          # both variants, 5 seeds, 300k steps
    python benchmarks/taxi_masks.py --variants masked --seeds 2 --steps 20000 --out /tmp/check

Both variants run this file's envs (benchmarks.taxi_masks:TaxiCounted-v4 and TaxiCountedUnmasked-v4): Taxi-v4 whose
episodes report, in the metrics the trainers log, whether they took an illegal action (fail_once: a -10 reward) and
whether the passenger was delivered (success_once). Writes to --out (default benchmarks/results/taxi_masks/)
table.md: by variant and seed, the evaluation return (deterministic, 8 episodes) at every 50,000 steps, and the
final evaluation, the share of training episodes with an illegal action over the whole run and over its last 50,000
steps, the final evaluation's, and the wall time of the batch of seeds.
"""

import argparse
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import gymnasium as gym
from gymnasium.envs.toy_text.taxi import TaxiEnv

REPO = Path(__file__).resolve().parent.parent
ILLEGAL_ACTION_REWARD = -10
COMMAND = ("--num_envs 8 --num_steps 128 --num_minibatches 4 --update_epochs 4 --learning_rate 2.5e-4 --ent_coef 0.01 "
           "--gamma 0.99 --gae_lambda 0.95 --num_eval_envs 8 --eval_freq 20 --no_capture_video")
VARIANTS = {"masked": "benchmarks.taxi_masks:TaxiCounted-v4",
            "unmasked": "benchmarks.taxi_masks:TaxiCountedUnmasked-v4"}
EVERY = 50_000


class IllegalActions(gym.Wrapper):
    """Taxi whose info["episode"] says whether the episode so far took an illegal action (fail_once) and delivered
    its passenger (success_once); unmasked: without info["action_mask"]."""

    def __init__(self, env: gym.Env, masked: bool):
        super().__init__(env)
        self.masked = masked

    def reset(self, **kwargs):
        obs, info = self.env.reset(**kwargs)
        self.illegal = False
        return obs, self.reported(info, delivered=False)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.illegal |= reward == ILLEGAL_ACTION_REWARD
        return obs, reward, terminated, truncated, self.reported(info, delivered=terminated)

    def reported(self, info: dict, delivered: bool) -> dict:
        info = {**info, "episode": {"fail_once": self.illegal, "success_once": delivered}}
        if not self.masked:
            del info["action_mask"]
        return info


gym.register("TaxiCounted-v4", entry_point=lambda **kwargs: IllegalActions(TaxiEnv(**kwargs), masked=True),
             max_episode_steps=200)
gym.register("TaxiCountedUnmasked-v4", entry_point=lambda **kwargs: IllegalActions(TaxiEnv(**kwargs), masked=False),
             max_episode_steps=200)


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


def main():
    sys.path.insert(0, str(REPO))
    from tests.util import machine, scalars

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", type=int, default=5, help="seeds 1..SEEDS, in one process (--num_seeds)")
    parser.add_argument("--steps", type=int, default=300_000, help="each seed's")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "taxi_masks")
    options = parser.parse_args()
    commands = {variant: f"python ppo.py --env_id {VARIANTS[variant]} {COMMAND} --total_timesteps {options.steps} "
                         f"--num_seeds {options.seeds} --seed 1" for variant in options.variants}
    curves, rows, last = [], [], 0
    for variant in options.variants:
        name = f"taxi_{variant}_{int(time.time())}"
        print(commands[variant], flush=True)
        argv = [*shlex.split(commands[variant])[2:], "--exp_name", name]
        start = time.perf_counter()
        result = subprocess.run([sys.executable, str(REPO / "ppo.py"), *argv], capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": str(REPO)})
        wall = time.perf_counter() - start
        if result.returncode != 0:
            sys.exit(f"{variant} failed:\n{result.stderr[-3000:]}")
        for seed in range(1, options.seeds + 1):
            tags = scalars(Path("runs") / name / f"{name}__seed{seed}")
            evals = dict(tags["eval/return"])
            last = max(evals)
            marks = [max(step for step in evals if step <= mark) for mark in range(EVERY, last + 1, EVERY)]
            curves.append(f"| {variant} | {seed} | " + " | ".join(f"{evals[step]:.2f}" for step in marks) + " |")
            illegal = tags["train/fail_once"]
            late = [value for step, value in illegal if step > last - EVERY]
            rows.append(f"| {variant} | {seed} | {evals[last]:.2f} | {dict(tags['eval/success_once'])[last]:.2f} | "
                        f"{mean([value for _, value in illegal]):.3f} | {mean(late):.3f} | "
                        f"{dict(tags['eval/fail_once'])[last]:.2f} | {wall / 60:.1f} min |")
            print(rows[-1], flush=True)
    marks = range(EVERY, last + 1, EVERY)  # the last evaluation's step: the last whole iteration's
    table = [f"ppo.py on Taxi-v4 with and without action masks, {time.strftime('%Y-%m-%d')}, {machine()}; the seeds "
             "of a variant in one process (--num_seeds), one variant at a time, beside other work on the machine",
             *(f"command: {command}; the {variant} variant" for variant, command in commands.items()), "",
             f"Evaluation return (8 episodes, deterministic) at every {EVERY // 1000}k steps:", "",
             "| variant | seed | " + " | ".join(f"{m // 1000}k" for m in marks) + " |",
             "|---|---:|" + "---:|" * len(marks), *curves, "",
             "Illegal actions: the share of episodes with at least one (a -10 pick-up or drop-off), in training (the "
             "whole run, its last 50k steps) and in the final evaluation; delivered: the final evaluation's share of "
             "episodes that delivered the passenger.", "",
             "| variant | seed | final eval return | delivered | illegal, training | illegal, last 50k | illegal, "
             "final eval | wall time (all seeds) |",
             "|---|---:|---:|---:|---:|---:|---:|---:|", *rows]
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "table.md").write_text("\n".join(table) + "\n")
    print(f"wrote {options.out / 'table.md'}")


if __name__ == "__main__":
    main()
