"""ippo.py on VMAS navigation (3 agents, continuous actions, 100-step episodes, gamma 0.9): IPPO, IPPO with shared
parameters, and MAPPO (a centralized critic), learning against frames and against time.

    python benchmarks/vmas_navigation.py                       # the three variants, seeds 1-3, 60,000 frames each
    python benchmarks/vmas_navigation.py --variants ippo --seeds 1 --frames 30000 --out /tmp/check

Runs COMMAND with each variant's flag, one run at a time into runs/ of the working directory, evaluating every
iteration (3,000 frames) on 20 envs with deterministic actions. Writes to --out (default
benchmarks/results/vmas_navigation/) table.md: the mean agent return of the evaluation (eval/return) at every 6,000
frames by run, and one row per run: the return at 30k and at the end, the first frames and training seconds at which
it reached 2.8, the training time (rollout + update, evaluations left out) up to 30k frames and the wall time; and
eval_return.png, the learning curves of the variants.
"""

import argparse
import shlex
import subprocess
import sys
import time
from itertools import accumulate
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.util import machine, scalars  # noqa: E402

COMMAND = ("--env_id vmas:navigation --env_kwargs n_agents=3 --max_episode_steps 100 --num_envs 60 --num_steps 50 "
           "--hidden_sizes 64 64 --num_minibatches 15 --update_epochs 30 --learning_rate 1e-3 --gamma 0.9 "
           "--num_eval_envs 20 --eval_freq 1 --no_capture_video")
VARIANTS = {"ippo": "", "shared": "--share_parameters", "mappo": "--centralized_critic"}
THRESHOLD = 2.8


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=60_000)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "vmas_navigation")
    options = parser.parse_args()
    command = f"python ippo.py {COMMAND} --total_timesteps {options.frames} [variant flag] --seed SEED"
    print(command, flush=True)
    curves, rows, run_dirs = [], [], []
    for variant in options.variants:
        for seed in options.seeds:
            name = f"navigation_{variant}_s{seed}_{int(time.time())}"
            argv = shlex.split(COMMAND) + shlex.split(VARIANTS[variant]) + [
                "--total_timesteps", str(options.frames), "--seed", str(seed), "--exp_name", name]
            start = time.perf_counter()
            result = subprocess.run([sys.executable, str(REPO / "ippo.py"), *argv], capture_output=True, text=True)
            wall = time.perf_counter() - start
            if result.returncode != 0:
                sys.exit(f"{variant} seed {seed} failed:\n{result.stderr}")
            run_dirs.append(Path("runs") / name)
            tags = scalars(run_dirs[-1])
            evals = dict(tags["eval/return"])
            train_time = dict(zip((step for step, _ in tags["time/rollout_time"]),
                                  accumulate(r + u for (_, r), (_, u) in zip(tags["time/rollout_time"],
                                                                             tags["time/update_time"]))))
            reached = next((step for step, value in sorted(evals.items()) if value >= THRESHOLD), None)
            at_30k = max(step for step in evals if step <= 30_000)
            curves.append(f"| {variant} | {seed} | " + " | ".join(
                f"{evals[step]:.2f}" for step in sorted(evals) if step % 6000 == 0) + " |")
            rows.append(f"| {variant} | {seed} | {evals[at_30k]:.2f} | {evals[max(evals)]:.2f} | "
                        + (f"{reached:,} / {train_time[reached]:.0f} s" if reached else "-")
                        + f" | {train_time[at_30k]:.0f} s | {wall:.0f} s |")
            print(rows[-1], flush=True)
    steps = list(range(6000, options.frames + 1, 6000))
    table = [f"ippo.py on VMAS navigation, {time.strftime('%Y-%m-%d')}, {machine()}, one run at a time",
             f"command: {command}; variant flags: " + ", ".join(f"{v}: {f or 'none'}" for v, f in VARIANTS.items()), "",
             "| variant | seed | " + " | ".join(f"{s // 1000}k" for s in steps) + " |",
             "|---|---:|" + "---:|" * len(steps), *curves, "",
             f"| variant | seed | eval return at 30k | at {options.frames // 1000}k | first at {THRESHOLD} "
             "(frames / training time) | training time to 30k | wall time |",
             "|---|---:|---:|---:|---:|---:|---:|", *rows]
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "table.md").write_text("\n".join(table) + "\n")
    subprocess.run([sys.executable, str(REPO / "scripts" / "plot.py"), *map(str, run_dirs), "--metrics", "eval/return",
                    "--group", r"^navigation_([a-z]+)_s\d+_\d+$", "--out", str(options.out)], check=True,
                   stdout=subprocess.DEVNULL)
    print("\n" + "\n".join(table))


if __name__ == "__main__":
    main()
