"""One torch thread or two: ppo.py's training speed with --torch_threads 1 and 2 on the settings the README and
docs run, one run at a time, the two thread counts alternating (issue 38's must-have 7).

    python benchmarks/threads.py                                 # every setting, two rounds (about 15 minutes)
    python benchmarks/threads.py --settings cartpole --rounds 1  # one setting
    python benchmarks/threads.py --settings cartpole_pair --rounds 1 --total_timesteps 512  # a check of the script

Prints a markdown table: each setting's training SPS (the run's final charts/SPS: steps over the wall time of the
training loop, evaluations included; of two runs at once, their mean) with 1 and 2 threads in each round, and
their ratio over the rounds.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.util import machine, scalars  # noqa: E402

CLEANRL_MUJOCO = ("--env_id HalfCheetah-v5 --num_envs 1 --num_steps 2048 --num_minibatches 32 --update_epochs 10 "
                  "--gamma 0.99 --gae_lambda 0.95 --norm_obs --norm_reward --clip_vloss --lr_schedule linear "
                  "--target_kl None --total_timesteps 20480")
SETTINGS = {  # name: (what it is, ppo.py's flags)
    "mujoco_2x64": ("HalfCheetah-v5, CleanRL's settings, 2x64, one env in-process",
                    CLEANRL_MUJOCO + " --hidden_sizes 64 64"),
    "mujoco_3x256": ("HalfCheetah-v5, CleanRL's settings, ppo.py's 3x256, one env in-process", CLEANRL_MUJOCO),
    "mujoco_async": ("HalfCheetah-v5, 2x64, 2 envs in --async_envs workers (benchmarks/README.md)",
                     "--env_id HalfCheetah-v5 --num_envs 2 --async_envs --num_steps 1024 --num_minibatches 32 "
                     "--update_epochs 10 --hidden_sizes 64 64 --norm_obs --norm_reward --total_timesteps 10240"),
    "cartpole": ("CartPole-v1, the README's command, 4 envs in-process",
                 "--env_id CartPole-v1 --num_envs 4 --num_steps 128 --num_minibatches 4 --update_epochs 4 --gamma 0.99 "
                 "--gae_lambda 0.95 --learning_rate 2e-3 --lr_schedule linear --target_kl None "
                 "--total_timesteps 15360"),
    "cartpole_pair": ("CartPole-v1, the README's command, two runs side by side (scripts/sweep.sh --jobs 2)", None),
    "pushcube_workers": ("PushCube-v1 on the CPU simulation, the README's command, 4 worker envs",
                         "--env_id PushCube-v1 --sim_backend cpu --num_envs 4 --num_eval_envs 2 --num_steps 50 "
                         "--num_minibatches 4 --update_epochs 8 --lr_schedule linear --norm_obs "
                         "--total_timesteps 6000"),
}


def training_sps(flags: str, threads: int, side_by_side: int) -> float:
    """The runs' mean training SPS, side_by_side runs of seeds 1, 2, ... at once (as scripts/sweep.sh --jobs runs)."""
    with tempfile.TemporaryDirectory() as tmp:
        runs = [subprocess.Popen([sys.executable, str(REPO / "ppo.py"), *flags.split(), "--torch_threads", str(threads),
                                  "--seed", str(seed), "--exp_name", f"threads{seed}", "--no_capture_video",
                                  "--no_save_model", "--eval_freq", "1000000", "--num_eval_steps", "10"],
                                 cwd=tmp, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for seed in range(1, side_by_side + 1)]
        if any(run.wait() != 0 for run in runs):
            raise SystemExit(f"error: a run of {flags} failed")
        return sum(scalars(Path(tmp) / "runs" / f"threads{seed}")["charts/SPS"][-1][1]
                   for seed in range(1, side_by_side + 1)) / side_by_side


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--total_timesteps", type=int, help="each run's steps (default: the setting's own)")
    options = parser.parse_args()
    print(f"benchmarks/threads.py, {machine()}; training SPS with --torch_threads 1 and 2, alternating\n")
    print("| setting | " + " | ".join(f"round {r + 1}: 1 thread | 2 threads" for r in range(options.rounds))
          + " | 2 threads / 1 |")
    print("|---|" + "---:|---:|" * options.rounds + "---:|")
    for name in options.settings:
        description, flags = SETTINGS[name]
        side_by_side = 2 if name.endswith("_pair") else 1
        flags = flags or SETTINGS[name.removesuffix("_pair")][1]
        if options.total_timesteps is not None:  # the last of a repeated flag counts
            flags += f" --total_timesteps {options.total_timesteps}"
        rounds = []
        for r in range(options.rounds):  # 1 thread first in odd rounds, 2 threads first in even ones
            sps = {threads: training_sps(flags, threads, side_by_side) for threads in ((1, 2), (2, 1))[r % 2]}
            rounds.append((sps[1], sps[2]))
        ratio = sum(two for _, two in rounds) / sum(one for one, _ in rounds)
        cells = " | ".join(f"{one:.0f} | {two:.0f}" for one, two in rounds)
        print(f"| {description} | {cells} | {ratio:.2f} |", flush=True)


if __name__ == "__main__":
    main()
