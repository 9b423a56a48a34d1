"""Throughput: ppo.py's rollout and training steps per second against random-action stepping of the same vector env,
measured in one run.

    python benchmarks/throughput.py                                  # PushCube-v1 with 1 and 4 envs, Pendulum-v1 with 8
    python benchmarks/throughput.py --runs PushCube-v1:2 CartPole-v1:4 --steps 200 --iterations 4

Random stepping goes through ppo.py's own env interface (TorchVecEnv, the same vector env as training), so what sets
rollout apart from it is the policy's inference, the observation and reward bookkeeping and the bootstrapping, and
what sets training apart is the update besides. Rollout is ppo.py's time/rollout_fps and training its charts/SPS, both
at the last iteration (no evaluation in between). PushCube-v1 trains with ManiSkill's defaults on the CPU simulation
(1 env: ManiSkillVectorEnv in-process; more: worker processes); Pendulum-v1 with docs/ppo.md's command. Prints a
markdown table.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import ppo  # noqa: E402
from tests.util import scalars  # noqa: E402

NUM_STEPS = {"PushCube-v1": 50, "Pendulum-v1": 256}  # per env and iteration; others: 128
TRAINING_FLAGS = {
    "PushCube-v1": ["--num_minibatches", "5"],
    "Pendulum-v1": ["--num_minibatches", "8", "--update_epochs", "10", "--gamma", "0.95", "--gae_lambda", "0.95",
                    "--learning_rate", "1e-3", "--lr_schedule", "linear", "--target_kl", "None", "--norm_obs",
                    "--reward_scale", "0.1"],
}


def random_stepping_sps(env_id: str, num_envs: int, steps: int) -> float:
    torch.set_num_threads(1)
    maniskill, _ = ppo.find_env(env_id)
    args = ppo.Args(env_id=env_id, num_envs=num_envs, capture_video=False)
    with tempfile.TemporaryDirectory() as tmp:
        envs = ppo.make_envs(args, maniskill, torch.device("cpu"), evaluation=False, run_dir=Path(tmp),
                             num_eval_steps=50)
        try:
            envs.reset(seed=0)
            if hasattr(envs, "action_low"):
                def random_action():
                    return (envs.action_low
                            + torch.rand(num_envs, envs.action_low.shape[0]) * (envs.action_high - envs.action_low))
            else:
                def random_action():
                    return torch.randint(envs.single_action_space.n, (num_envs,))
            for _ in range(20):  # warm-up
                envs.step(random_action())
            start = time.perf_counter()
            for _ in range(steps):
                envs.step(random_action())
            return steps * num_envs / (time.perf_counter() - start)
        finally:
            envs.close()


def training_sps(env_id: str, num_envs: int, iterations: int) -> tuple[float, float]:
    """(training SPS, rollout steps/s) at the last iteration."""
    num_steps = NUM_STEPS.get(env_id, 128)
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--env_id", env_id, "--exp_name", "bench", "--num_envs", str(num_envs), "--num_steps", str(num_steps),
                "--total_timesteps", str(num_envs * num_steps * iterations), "--eval_freq", str(iterations + 1),
                "--num_eval_envs", "1", "--no_capture_video", "--no_save_model", *TRAINING_FLAGS.get(env_id, [])]
        subprocess.run([sys.executable, str(REPO / "ppo.py"), *argv], cwd=tmp, check=True, capture_output=True)
        tags = scalars(Path(tmp) / "runs" / "bench")
        return tags["charts/SPS"][-1][1], tags["time/rollout_fps"][-1][1]


def env_and_count(text: str) -> tuple[str, int]:
    env_id, _, num_envs = text.rpartition(":")
    if not env_id or not num_envs.isdigit() or int(num_envs) < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not ENV_ID:NUM_ENVS, e.g. PushCube-v1:4")
    return env_id, int(num_envs)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=env_and_count, nargs="+", metavar="ENV_ID:NUM_ENVS",
                        default=[("PushCube-v1", 1), ("PushCube-v1", 4), ("Pendulum-v1", 8)])
    parser.add_argument("--steps", type=int, default=500, help="random-action steps of the vector env")
    parser.add_argument("--iterations", type=int, default=10, help="training iterations")
    options = parser.parse_args()
    print("| env | num_envs | random actions (steps/s) | ppo.py rollout (steps/s, ÷ random) | "
          "ppo.py training SPS (÷ random) |")
    print("|---|---:|---:|---:|---:|")
    for env_id, num_envs in options.runs:
        random_sps = random_stepping_sps(env_id, num_envs, options.steps)
        train_sps, rollout_fps = training_sps(env_id, num_envs, options.iterations)
        print(f"| {env_id} | {num_envs} | {random_sps:.0f} | {rollout_fps:.0f} ({rollout_fps / random_sps:.2f}) | "
              f"{train_sps:.0f} ({train_sps / random_sps:.2f}) |", flush=True)


if __name__ == "__main__":
    main()
