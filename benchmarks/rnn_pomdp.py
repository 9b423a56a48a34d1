"""ppo_rnn.py on the partially observed tasks of pomdp.py: learning per seed, and where the time goes.

    python benchmarks/rnn_pomdp.py                       # CartPoleNoVel-v1 (seeds 1-5) and PendulumNoVel-v1 (seeds 1-3)
    python benchmarks/rnn_pomdp.py --tasks cartpole --seeds 1 2 --total_timesteps 4096 --out /tmp/check
    python benchmarks/rnn_pomdp.py --flags=--critic_obs --out benchmarks/results/rnn_pomdp_critic  # privileged critic

Runs each command of TASKS (docs/recurrent.md's) one seed at a time into runs/ of the working directory, then writes to
--out (default benchmarks/results/rnn_pomdp/) table.md, one markdown row per seed (the final evaluation return, the
first step at which the evaluation reached the task's threshold, wall time, training steps per second (charts/SPS)
and the share of rollout and update in it), and each task's learning curves, <task>/eval_return.png.
"""

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from tests.util import machine, scalars  # noqa: E402

TASKS = {
    "cartpole": dict(threshold=475, seeds=[1, 2, 3, 4, 5], command=(
        "--env_id pomdp:CartPoleNoVel-v1 --num_envs 8 --num_steps 64 --num_minibatches 4 --update_epochs 4 "
        "--gamma 0.99 --gae_lambda 0.95 --learning_rate 5e-4 --lr_schedule linear --target_kl None --clip_coef 0.1 "
        "--norm_obs --reward_scale 0.1 --rnn_hidden_size 64 --total_timesteps 51200 --eval_freq 5 --no_capture_video")),
    "pendulum": dict(threshold=-250, seeds=[1, 2, 3], command=(
        "--env_id pomdp:PendulumNoVel-v1 --num_envs 8 --num_steps 256 --seq_len 32 --num_minibatches 8 "
        "--update_epochs 10 --gamma 0.9 --gae_lambda 0.9 --learning_rate 1e-3 --lr_schedule linear --target_kl None "
        "--norm_obs --reward_scale 0.1 --rnn_hidden_size 64 --total_timesteps 102400 --eval_freq 5 "
        "--no_capture_video")),
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", nargs="+", choices=sorted(TASKS), default=sorted(TASKS))
    parser.add_argument("--seeds", nargs="+", type=int, help="default: each task's own seeds")
    parser.add_argument("--total_timesteps", type=int, help="default: each command's own")
    parser.add_argument("--flags", default="", help="more ppo_rnn.py flags for every run, e.g. --flags=--critic_obs")
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "rnn_pomdp")
    options = parser.parse_args()
    commands, rows = [], []
    for task in options.tasks:
        spec = TASKS[task]
        argv = shlex.split(spec["command"]) + shlex.split(options.flags)
        if options.total_timesteps is not None:
            argv[argv.index("--total_timesteps") + 1] = str(options.total_timesteps)
        commands.append(f"python ppo_rnn.py {shlex.join(argv)} --seed SEED")
        print(commands[-1], flush=True)
        run_dirs = []
        for seed in options.seeds or spec["seeds"]:
            name = f"{task}_s{seed}_{int(time.time())}"
            start = time.perf_counter()
            result = subprocess.run([sys.executable, str(REPO / "ppo_rnn.py"), *argv, "--seed", str(seed),
                                     "--exp_name", name], capture_output=True, text=True)
            wall = time.perf_counter() - start
            if result.returncode != 0:
                sys.exit(f"{task} seed {seed} failed:\n{result.stderr}")
            run_dirs.append(Path("runs") / name)
            tags = scalars(run_dirs[-1])
            evals = tags["eval/return"]
            reached = next((step for step, value in evals if value >= spec["threshold"]), None)
            rollout = sum(v for _, v in tags["time/rollout_time"])
            update = sum(v for _, v in tags["time/update_time"])
            rows.append(f"| {task} | {seed} | {evals[-1][1]:.1f} | {reached if reached is not None else '-'} | "
                        f"{wall:.0f} s | {tags['charts/SPS'][-1][1]:.0f} | {rollout / (rollout + update):.0%} / "
                        f"{update / (rollout + update):.0%} |")
            print(rows[-1], flush=True)
        subprocess.run([sys.executable, str(REPO / "scripts" / "plot.py"), *map(str, run_dirs), "--metrics",
                        "eval/return", "--group", r"^([a-z]+)_s\d+_\d+$", "--out", str(options.out / task)], check=True,
                       stdout=subprocess.DEVNULL)
    table = [f"ppo_rnn.py on pomdp.py's tasks, {time.strftime('%Y-%m-%d')}, {machine()}, one run at a time",
             *(f"command: {command}" for command in commands), "",
             "| task | seed | final eval return | first step at threshold | wall time | SPS | rollout / update |",
             "|---|---:|---:|---:|---:|---:|---|", *rows]
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "table.md").write_text("\n".join(table) + "\n")
    print("\n" + "\n".join(table))


if __name__ == "__main__":
    main()
