"""Training speed at CleanRL's settings, with the raw speed of the same env measured in the same run.

    python benchmarks/speed_cleanrl_settings.py                          # HalfCheetah-v4, 100k steps per variant
    python benchmarks/speed_cleanrl_settings.py --cleanrl ~/cleanrl/cleanrl/ppo_continuous_action.py   # and CleanRL's
    python benchmarks/speed_cleanrl_settings.py --suite atari --cleanrl ~/cleanrl/cleanrl/ppo_atari.py  # ppo_rgb.py
    python benchmarks/speed_cleanrl_settings.py --total_timesteps 4096 --variants small   # a quick check

mujoco (ppo.py, CleanRL's ppo_continuous_action.py): 1 env, 2048 steps per rollout, 32 minibatches, 10 epochs, gamma
0.99, lambda 0.95, observation and reward normalization, clipped value loss, linear learning-rate decay, no KL stop.
Variants: CleanRL's network size (--hidden_sizes 64 64) and ppo.py's default (256 256 256), each eager and with
--compile, and the default with torch's 2 threads (ppo.py's default is 1, CleanRL's torch's own: the machine's cores).
atari (ppo_rgb.py, CleanRL's ppo_atari.py): 8 envs, 128 steps per rollout, 4 minibatches, 4 epochs, learning rate
2.5e-4 decaying linearly, clip 0.1, clipped value loss, entropy 0.01, rewards clipped to +-1; variants: ppo_rgb.py's
default (torch's threads, as many as the cores, like CleanRL's), one thread, and the envs in worker processes.
CleanRL's script runs from a copy beside it (its cleanrl_utils stay importable) with Gymnasium 1.x's names patched in
(GYMNASIUM_1). Training SPS is each trainer's charts/SPS at the last iteration (steps / seconds since the first
rollout, compiling included); the rollout and update columns are means over the iterations after the first. The raw
rate steps the env the trainer builds (ppo_rgb.py: with its Atari preprocessing) with random actions. Prints a
markdown table.
"""

import argparse
import importlib
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.util import scalars  # noqa: E402

SUITES = {  # trainer, CleanRL's default env, steps per rollout (all envs), CleanRL's settings as flags, variants
    "mujoco": dict(
        trainer="ppo", env_id="HalfCheetah-v4", batch=2048,
        settings=["--num_envs", "1", "--num_steps", "2048", "--num_minibatches", "32", "--update_epochs", "10",
                  "--gamma", "0.99", "--gae_lambda", "0.95", "--norm_obs", "--norm_reward", "--clip_vloss",
                  "--lr_schedule", "linear", "--target_kl", "None", "--ent_coef", "0"],
        variants={"small": ["--hidden_sizes", "64", "64"], "small+compile": ["--hidden_sizes", "64", "64", "--compile"],
                  "default": [], "default+compile": ["--compile"], "default+2threads": ["--torch_threads", "2"]}),
    "atari": dict(
        trainer="ppo_rgb", env_id="BreakoutNoFrameskip-v4", batch=1024,
        settings=["--num_envs", "8", "--num_steps", "128", "--num_minibatches", "4", "--update_epochs", "4",
                  "--gamma", "0.99", "--gae_lambda", "0.95", "--learning_rate", "2.5e-4", "--lr_schedule", "linear",
                  "--clip_coef", "0.1", "--clip_vloss", "--ent_coef", "0.01", "--target_kl", "None",
                  "--clip_reward", "1"],
        variants={"default": [], "1thread": ["--torch_threads", "1"], "async": ["--async_envs"]}),
}
GYMNASIUM_1 = {  # CleanRL's Gymnasium 0.29 calls -> their Gymnasium 1.x names
    "lambda obs: np.clip(obs, -10, 10))": "lambda obs: np.clip(obs, -10, 10), env.observation_space)",
    "gym.wrappers.GrayScaleObservation(": "gym.wrappers.GrayscaleObservation(",
    "gym.wrappers.FrameStack(": "gym.wrappers.FrameStackObservation(",
    "from cleanrl_utils.atari_wrappers import": "import ale_py  # noqa: F401  (registers the games)\n"
                                               "from cleanrl_utils.atari_wrappers import",
}


def raw_rate(trainer: str, env_id: str, steps: int) -> float:
    env = importlib.import_module(trainer).build_gym_env(env_id, None, None, None, None, "raw")
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


def ppo_speed(suite: dict, env_id: str, total_timesteps: int, flags: list[str]) -> tuple[float, float, float]:
    """(training SPS, rollout steps/s, update seconds per iteration)."""
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--env_id", env_id, "--exp_name", "speed", "--total_timesteps", str(total_timesteps),
                "--eval_freq", "1000000", "--num_eval_envs", "1", "--num_eval_steps", "10", "--no_capture_video",
                "--no_save_model", *suite["settings"], *flags]
        subprocess.run([sys.executable, str(REPO / f"{suite['trainer']}.py"), *argv], cwd=tmp, check=True,
                       capture_output=True)
        tags = scalars(Path(tmp) / "runs" / "speed")
    later = slice(1, None) if len(tags["time/rollout_time"]) > 1 else slice(None)
    rollout = [v for _, v in tags["time/rollout_time"]][later]
    update = [v for _, v in tags["time/update_time"]][later]
    return tags["charts/SPS"][-1][1], suite["batch"] * len(rollout) / sum(rollout), float(np.mean(update))


def cleanrl_speed(script: Path, env_id: str, total_timesteps: int) -> float:
    """CleanRL's own printout of its SPS after the last iteration."""
    source = script.read_text()
    for old, new in GYMNASIUM_1.items():
        source = source.replace(old, new)
    with tempfile.TemporaryDirectory() as tmp, tempfile.NamedTemporaryFile(
            "w", suffix=".py", prefix="gymnasium1_", dir=script.parent) as patched:
        patched.write(source)
        patched.flush()
        result = subprocess.run([sys.executable, patched.name, "--env_id", env_id, "--total_timesteps",
                                 str(total_timesteps)], cwd=tmp, check=True, capture_output=True, text=True,
                                env={**os.environ, "PYTHONPATH": str(script.parent.parent)})
    return float(re.findall(r"SPS: (\d+)", result.stdout)[-1])


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", choices=list(SUITES), default="mujoco")
    parser.add_argument("--env_id", help="default: CleanRL's (HalfCheetah-v4, BreakoutNoFrameskip-v4)")
    parser.add_argument("--total_timesteps", type=int, default=100_000)
    parser.add_argument("--variants", nargs="+", help="default: all of the suite's")
    parser.add_argument("--raw_steps", type=int, default=20_000, help="random-action steps for the raw rate")
    parser.add_argument("--cleanrl", type=Path, help="CleanRL's script: ppo_continuous_action.py, ppo_atari.py")
    options = parser.parse_args()
    suite = SUITES[options.suite]
    env_id = options.env_id or suite["env_id"]
    variants = options.variants or list(suite["variants"])
    if set(variants) - set(suite["variants"]):
        parser.error(f"the {options.suite} suite's variants are {', '.join(suite['variants'])}")
    rate = raw_rate(suite["trainer"], env_id, options.raw_steps)
    print(f"{env_id}, {options.total_timesteps} steps; raw env, random actions: {rate:.0f} steps/s\n")
    print("| trainer | training SPS | rollout steps/s (÷ raw) | update s/iteration |")
    print("|---|---:|---:|---:|")
    if options.cleanrl is not None:
        sps = cleanrl_speed(options.cleanrl, env_id, options.total_timesteps)
        print(f"| CleanRL {options.cleanrl.name} | {sps:.0f} | - | - |", flush=True)
    for variant in variants:
        flags = suite["variants"][variant]
        sps, rollout_rate, update_time = ppo_speed(suite, env_id, options.total_timesteps, flags)
        print(f"| {' '.join([suite['trainer'] + '.py', *flags])} | {sps:.0f} | {rollout_rate:.0f} "
              f"({rollout_rate / rate:.2f}) | {update_time:.2f} |", flush=True)


if __name__ == "__main__":
    main()
