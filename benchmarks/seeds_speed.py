"""Many seeds in one process against a process a seed (issue 38's must-have 4): a trainer's --num_seeds N against the
same N seeds as runs of their own, two at a time (scripts/sweep.sh --jobs 2, on 2 cores), one measurement at a time.

    python benchmarks/seeds_speed.py                          # every setting, N = 1, 2, 4, 8, 16
    python benchmarks/seeds_speed.py --settings cartpolenovel_rnn --num_seeds 1 8   # ppo_rnn.py's row
    python benchmarks/seeds_speed.py --settings pixelsidecue_rgb --num_seeds 1 8    # ppo_rgb.py's row
    python benchmarks/seeds_speed.py --settings navigation_ippo --num_seeds 1 8     # ippo.py's row
    python benchmarks/seeds_speed.py --threads 1 2            # the one process also with --torch_threads 2
    python benchmarks/seeds_speed.py --settings cartpole --num_seeds 1 2 --total_timesteps 1024  # a check of it
    python benchmarks/seeds_speed.py --num_seeds 8 --pbt_interval 2   # also a population ranked every 2 iterations

Prints a markdown table per setting: for each N, the wall time of all N seeds (process start-up included, as a user
waits for it) in one process and as separate processes, seeds per hour of each, the ratio of the two, the one
process's time over one seed's alone, and the peak resident memory of a process (ru_maxrss; the separate runs'
largest, two of which run at once). --pbt_interval K adds, after each one-process row of 4 seeds or more, the same
process as a population (--pbt_interval K, the default --pbt_space) and its time over the row above: PBT's own cost.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.util import machine  # noqa: E402

# Short runs: evaluation (one env, 10 steps) and checkpoints kept out of the way of the training loop.
COMMON = "--no_capture_video --no_save_model --eval_freq 1000000 --num_eval_envs 1 --num_eval_steps 10"
SETTINGS = {  # name: (what it is, the trainer's flags; ppo.py's unless they name another)
    "halfcheetah": ("HalfCheetah-v4, CleanRL's MuJoCo settings (one env in-process, 2x64 networks)",
                    "--env_id HalfCheetah-v4 --num_envs 1 --num_steps 2048 --num_minibatches 32 --update_epochs 10 "
                    "--hidden_sizes 64 64 --log_std_init 0 --gamma 0.99 --gae_lambda 0.95 --norm_obs --norm_reward "
                    "--clip_vloss --lr_schedule linear --target_kl None --total_timesteps 20480"),
    "cartpole": ("CartPole-v1, the README's command (4 envs in-process)",
                 "--env_id CartPole-v1 --num_envs 4 --num_steps 128 --num_minibatches 4 --update_epochs 4 --gamma 0.99 "
                 "--gae_lambda 0.95 --learning_rate 2e-3 --lr_schedule linear --target_kl None "
                 "--total_timesteps 30720"),
    "cartpolenovel_rnn": ("ppo_rnn.py on pomdp:CartPoleNoVel-v1, docs/recurrent.md's command (8 envs in-process, "
                          "LSTM 64)",
                          "ppo_rnn.py --env_id pomdp:CartPoleNoVel-v1 --num_envs 8 --num_steps 64 --num_minibatches 4 "
                          "--update_epochs 4 --gamma 0.99 --gae_lambda 0.95 --learning_rate 5e-4 --lr_schedule linear "
                          "--target_kl None --clip_coef 0.1 --norm_obs --reward_scale 0.1 --rnn_hidden_size 64 "
                          "--total_timesteps 20480"),
    "pixelsidecue_rgb": ("ppo_rgb.py on tests.envs:PixelSideCue-v0, the README's command (8 envs in-process, a 36x36 "
                         "image and a vector, NatureCNN)",
                         "ppo_rgb.py --env_id tests.envs:PixelSideCue-v0 --num_envs 8 --num_steps 32 "
                         "--num_minibatches 4 --gamma 0.5 --total_timesteps 8192 --torch_threads 1"),
    "navigation_ippo": ("ippo.py on vmas:navigation, docs/multi_agent.md's command (60 envs on the learner's device, "
                        "3 agents, 2x64 networks, 30 epochs)",
                        "ippo.py --env_id vmas:navigation --env_kwargs n_agents=3 --num_envs 60 --num_steps 50 "
                        "--hidden_sizes 64 64 --num_minibatches 15 --update_epochs 30 --learning_rate 1e-3 --gamma 0.9 "
                        "--total_timesteps 30000"),
}


def run(flags: list[str], cwd: str) -> subprocess.Popen:
    log = Path(cwd) / f"{flags[-1]}.log"  # flags end with the run's name
    trainer, flags = (flags[0], flags[1:]) if flags[0].endswith(".py") else ("ppo.py", flags)
    with open(log, "w") as stderr:
        process = subprocess.Popen([sys.executable, str(REPO / trainer), *COMMON.split(), *flags], cwd=cwd,
                                   stdout=subprocess.DEVNULL, stderr=stderr)
    process.log = log
    return process


def finish(process: subprocess.Popen) -> int:
    """Wait for process; its peak resident memory in MiB."""
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    if process.returncode != 0:
        raise SystemExit(f"error: {' '.join(process.args)} failed:\n{process.log.read_text()[-2000:]}")
    return usage.ru_maxrss // 1024


def one_process(flags: list[str], num_seeds: int, threads: int, pbt_interval: int | None = None
                ) -> tuple[float, int]:
    population = [] if pbt_interval is None else ["--pbt_interval", str(pbt_interval)]
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        memory = finish(run([*flags, "--num_seeds", str(num_seeds), "--torch_threads", str(threads), *population,
                             "--exp_name", "batch"], tmp))
        return time.perf_counter() - start, memory


def separate_processes(flags: list[str], num_seeds: int) -> tuple[float, int]:
    """Seeds 1..num_seeds, two at a time: a new one starts as soon as one ends."""
    with tempfile.TemporaryDirectory() as tmp:
        start, memory, running, waiting = time.perf_counter(), 0, [], list(range(1, num_seeds + 1))
        while waiting or running:
            while waiting and len(running) < 2:
                seed = waiting.pop(0)
                running.append(run([*flags, "--seed", str(seed), "--exp_name", f"seed{seed}"], tmp))
            pid = os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOWAIT).si_pid  # the first to end; finish() reaps it
            ended = next(process for process in running if process.pid == pid)
            running.remove(ended)
            memory = max(memory, finish(ended))
        return time.perf_counter() - start, memory


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--num_seeds", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--threads", nargs="+", type=int, default=[1], help="the one process's --torch_threads")
    parser.add_argument("--total_timesteps", type=int, help="each seed's steps (default: the setting's own)")
    parser.add_argument("--pbt_interval", type=int, help="also each one process as a population ranked this often")
    options = parser.parse_args()
    print(f"benchmarks/seeds_speed.py, {machine()}\n")
    for name in options.settings:
        description, flags = SETTINGS[name]
        flags = flags.split() + ([] if options.total_timesteps is None else
                                 ["--total_timesteps", str(options.total_timesteps)])
        print(f"**{description}**, {flags[flags.index('--total_timesteps') + 1]} steps a seed\n")
        print("| seeds | way | wall time (s) | seeds per hour | separate / this | this / one seed alone | "
              "peak RSS of a process (MiB) |")
        print("|---:|---|---:|---:|---:|---:|---:|")
        alone = None
        for num_seeds in options.num_seeds:
            separate, separate_memory = separate_processes(flags, num_seeds)
            alone = alone or (separate if num_seeds == 1 else None)
            rows = [(f"{'separate processes, 2 at a time' if num_seeds > 1 else 'one run'}", separate,
                     separate_memory, "")]
            for threads in options.threads if num_seeds > 1 else [t for t in options.threads if t != 1]:
                seconds, memory = one_process(flags, num_seeds, threads)
                way = f"--num_seeds {num_seeds}" + (f", {threads} threads" if threads != 1 else "")
                rows.append((way, seconds, memory, ""))
                if options.pbt_interval is not None and num_seeds >= 4:
                    pbt_seconds, memory = one_process(flags, num_seeds, threads, options.pbt_interval)
                    rows.append((f"{way}, --pbt_interval {options.pbt_interval}", pbt_seconds, memory,
                                 f" ({pbt_seconds / seconds:.3f} of the row above)"))
            for i, (way, seconds, memory, cost) in enumerate(rows):
                versus_separate = f"{separate / seconds:.2f}" if i > 0 else "-"
                versus_alone = f"{seconds / alone:.2f}" if alone else "-"
                print(f"| {num_seeds} | {way} | {seconds:.1f}{cost} | {3600 * num_seeds / seconds:.0f} | "
                      f"{versus_separate} | {versus_alone} | {memory} |")
        print()


if __name__ == "__main__":
    main()
