"""ppo.py's training speed at CleanRL's MuJoCo settings, with the raw speed of the same env measured in the same run.

    python benchmarks/speed_cleanrl_settings.py                          # HalfCheetah-v4, 100k steps per variant
    python benchmarks/speed_cleanrl_settings.py --cleanrl ~/cleanrl/cleanrl/ppo_continuous_action.py   # and CleanRL's
    python benchmarks/speed_cleanrl_settings.py --total_timesteps 4096 --variants small   # a quick check

CleanRL's settings: 1 env, 2048 steps per rollout, 32 minibatches, 10 epochs, gamma 0.99, lambda 0.95, observation and
reward normalization, clipped value loss, linear learning-rate decay, no KL stop. Variants: CleanRL's network size
(--hidden_sizes 64 64) and ppo.py's default (256 256 256), each eager and with --compile, and the default with torch's
2 threads (ppo.py's default is 1, CleanRL's torch's own: the machine's cores). Training SPS is ppo.py's
charts/SPS at the last iteration (steps / seconds since the first rollout, compiling included); the rollout and
update columns are means over the iterations after the first. The raw rate steps the bare Gymnasium env with random
actions. Prints a markdown table.
"""

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import gymnasium as gym
import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.util import scalars  # noqa: E402

NUM_STEPS = 2048  # per rollout, of the one env
CLEANRL_SETTINGS = ["--num_envs", "1", "--num_steps", str(NUM_STEPS), "--num_minibatches", "32",
                    "--update_epochs", "10",
                    "--gamma", "0.99", "--gae_lambda", "0.95", "--norm_obs", "--norm_reward", "--clip_vloss",
                    "--lr_schedule", "linear", "--target_kl", "None", "--ent_coef", "0"]
NETWORKS = {"64 64": ["--hidden_sizes", "64", "64"], "256 256 256": []}
VARIANTS = {  # name: (networks, ppo.py's flags besides them)
    "small": ("64 64", []),
    "small+compile": ("64 64", ["--compile"]),
    "default": ("256 256 256", []),
    "default+compile": ("256 256 256", ["--compile"]),
    "default+2threads": ("256 256 256", ["--torch_threads", "2"]),
}


def raw_rate(env_id: str, steps: int) -> float:
    env = gym.make(env_id)
    env.reset(seed=0)
    env.action_space.seed(0)
    actions = [env.action_space.sample() for _ in range(steps)]
    start = time.perf_counter()
    for action in actions:
        _, _, terminated, truncated, _ = env.step(action)
        if terminated or truncated:
            env.reset()
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def ppo_speed(env_id: str, total_timesteps: int, flags: list[str]) -> tuple[float, float, float]:
    """(training SPS, rollout steps/s, update seconds per iteration)."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--env_id", env_id, "--exp_name", "speed", "--total_timesteps", str(total_timesteps),
                "--eval_freq", "1000000", "--num_eval_envs", "1", "--num_eval_steps", "10", "--no_capture_video",
                "--no_save_model", *CLEANRL_SETTINGS, *flags]
        subprocess.run([sys.executable, str(REPO / "ppo.py"), *argv], cwd=tmp, check=True, capture_output=True)
        tags = scalars(Path(tmp) / "runs" / "speed")
    later = slice(1, None) if len(tags["time/rollout_time"]) > 1 else slice(None)
    rollout = [v for _, v in tags["time/rollout_time"]][later]
    update = [v for _, v in tags["time/update_time"]][later]
    return tags["charts/SPS"][-1][1], NUM_STEPS * len(rollout) / sum(rollout), float(np.mean(update))


def cleanrl_speed(script: Path, env_id: str, total_timesteps: int) -> float:
    """CleanRL's own printout of its SPS after the last iteration."""
    with tempfile.TemporaryDirectory() as tmp:
        result = subprocess.run([sys.executable, str(script), "--env_id", env_id, "--total_timesteps",
                                 str(total_timesteps)], cwd=tmp, check=True, capture_output=True, text=True)
    return float(re.findall(r"SPS: (\d+)", result.stdout)[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--env_id", default="HalfCheetah-v4")
    parser.add_argument("--total_timesteps", type=int, default=100_000)
    parser.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--raw_steps", type=int, default=20_000, help="random-action steps for the raw rate")
    parser.add_argument("--cleanrl", type=Path, help="path of CleanRL's ppo_continuous_action.py, to run it alike")
    options = parser.parse_args()
    rate = raw_rate(options.env_id, options.raw_steps)
    print(f"{options.env_id}, {options.total_timesteps} steps; raw env, random actions: {rate:.0f} steps/s\n")
    print("| trainer | networks | training SPS | rollout steps/s (÷ raw) | update s/iteration |")
    print("|---|---|---:|---:|---:|")
    if options.cleanrl is not None:
        sps = cleanrl_speed(options.cleanrl, options.env_id, options.total_timesteps)
        print(f"| CleanRL ppo_continuous_action.py | 64 64 | {sps:.0f} | - | - |", flush=True)
    for variant in options.variants:
        networks, flags = VARIANTS[variant]
        sps, rollout_rate, update_time = ppo_speed(options.env_id, options.total_timesteps, NETWORKS[networks] + flags)
        print(f"| {' '.join(['ppo.py', *flags])} | {networks} | {sps:.0f} | {rollout_rate:.0f} "
              f"({rollout_rate / rate:.2f}) | {update_time:.2f} |", flush=True)


if __name__ == "__main__":
    main()
