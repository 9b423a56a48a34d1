"""Steps per second on ManiSkill PushCube-v1 with the CPU simulation: random actions vs. ppo.py training.

    python benchmarks/sps_pushcube.py                     # num_envs 1 and 4, writes a markdown table to stdout
    python benchmarks/sps_pushcube.py --num_envs 1 2 4

Random stepping goes through ppo.py's own env interface (TorchVecEnv), so the difference to training is
the policy, the bootstrapping and the update. Training SPS is ppo.py's charts/SPS at the last iteration.
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


def random_stepping_sps(num_envs: int, steps: int) -> float:
    torch.set_num_threads(1)
    args = ppo.Args(env_id="PushCube-v1", num_envs=num_envs, capture_video=False)
    with tempfile.TemporaryDirectory() as tmp:
        envs = ppo.make_envs(args, True, torch.device("cpu"), evaluation=False, run_dir=Path(tmp), num_eval_steps=50)
        try:
            envs.reset(seed=0)
            for _ in range(20):  # warm-up
                envs.step(torch.rand(num_envs, 8) * 2 - 1)
            start = time.perf_counter()
            for _ in range(steps):
                envs.step(torch.rand(num_envs, 8) * 2 - 1)
            return steps * num_envs / (time.perf_counter() - start)
        finally:
            envs.close()


def training_sps(num_envs: int, iterations: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp:
        argv = ["--env_id", "PushCube-v1", "--exp_name", "bench", "--num_envs", str(num_envs), "--num_steps", "50",
                "--num_minibatches", "5", "--total_timesteps", str(num_envs * 50 * iterations),
                "--eval_freq", str(iterations + 1), "--num_eval_envs", "1", "--no_capture_video"]
        subprocess.run([sys.executable, str(REPO / "ppo.py"), *argv], cwd=tmp, check=True, capture_output=True)
        tags = scalars(Path(tmp) / "runs" / "bench")
        return tags["charts/SPS"][-1][1], tags["time/rollout_fps"][-1][1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--num_envs", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--steps", type=int, default=500, help="random-action steps per env")
    parser.add_argument("--iterations", type=int, default=10, help="training iterations of 50 steps per env")
    options = parser.parse_args()
    print("| num_envs | random actions (steps/s) | ppo.py rollout (steps/s) | ppo.py training SPS |")
    print("|---:|---:|---:|---:|")
    for num_envs in options.num_envs:
        random_sps = random_stepping_sps(num_envs, options.steps)
        train_sps, rollout_fps = training_sps(num_envs, options.iterations)
        print(f"| {num_envs} | {random_sps:.0f} | {rollout_fps:.0f} | {train_sps:.0f} |", flush=True)


if __name__ == "__main__":
    main()
