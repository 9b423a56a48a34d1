"""ippo.py on PettingZoo's MPE simple_spread_v3 (3 agents, 3 landmarks, 25-step episodes; `pip install mpe2`): IPPO
and MAPPO (a critic of the env's state()), with discrete and continuous actions, at the MAPPO paper's MPE settings
(128 envs x 25 steps a batch, one minibatch, 10 epochs, lr 7e-4, 64-unit layers, one network shared by the agents,
clipped value loss, entropy 0.01, gradient norm 10) but without value normalization: with the time limit's
bootstrapping, --norm_value's well-fitted critic made every early run collapse for a while (benchmarks/README.md).

    python benchmarks/mpe_spread.py                                    # 4 variants, seeds 1-3, 1M frames each
    python benchmarks/mpe_spread.py --variants mappo_discrete --seeds 1 --frames 200000 --out /tmp/check

Runs each variant one run at a time into runs/ of the working directory, evaluating every 10 iterations (32,000
frames) on 32 envs with deterministic actions. Writes to --out (default benchmarks/results/mpe_spread/) table.md: the
mean agent return of the evaluation (eval/return: each agent's episode return, averaged over the agents) at every
200,000 frames by run, and one row per run: the final evaluation, the mean training return over the last 100,000
frames, the steps per second and the wall time; and eval_return.png, the learning curves of the variants.
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

COMMAND = ("--env_id pz:mpe2.simple_spread_v3 --max_episode_steps 25 --num_envs 128 --num_steps 25 --async_envs "
           "--num_minibatches 1 --update_epochs 10 --learning_rate 7e-4 --hidden_sizes 64 64 --gamma 0.99 "
           "--gae_lambda 0.95 --ent_coef 0.01 --max_grad_norm 10 --clip_vloss --norm_obs "
           "--share_parameters --num_eval_envs 32 --eval_freq 10 --no_capture_video")
VARIANTS = {"ippo_discrete": "", "mappo_discrete": "--centralized_critic",
            "ippo_continuous": "--env_kwargs continuous_actions=True",
            "mappo_continuous": "--centralized_critic --env_kwargs continuous_actions=True"}
EVERY = 200_000


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", choices=sorted(VARIANTS), default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[1, 2, 3])
    parser.add_argument("--frames", type=int, default=1_000_000)
    parser.add_argument("--out", type=Path, default=REPO / "benchmarks" / "results" / "mpe_spread")
    options = parser.parse_args()
    command = f"python ippo.py {COMMAND} --total_timesteps {options.frames} [variant flags] --seed SEED"
    print(command, flush=True)
    curves, rows, run_dirs = [], [], []
    for variant in options.variants:
        for seed in options.seeds:
            name = f"spread_{variant}_s{seed}_{int(time.time())}"
            argv = shlex.split(COMMAND) + shlex.split(VARIANTS[variant]) + [
                "--total_timesteps", str(options.frames), "--seed", str(seed), "--exp_name", name]
            start = time.perf_counter()
            result = subprocess.run([sys.executable, str(REPO / "ippo.py"), *argv], capture_output=True, text=True)
            wall = time.perf_counter() - start
            if result.returncode != 0:
                sys.exit(f"{variant} seed {seed} failed:\n{result.stderr[-3000:]}")
            run_dirs.append(Path("runs") / name)
            tags = scalars(run_dirs[-1])
            evals = dict(tags["eval/return"])
            last = max(evals)
            late_train = [value for step, value in tags["train/return"] if step > last - 100_000]
            marks = [max(step for step in evals if step <= mark) for mark in range(EVERY, last + 1, EVERY)]
            curves.append(f"| {variant} | {seed} | {evals[min(evals)]:.2f} | "
                          + " | ".join(f"{evals[step]:.2f}" for step in marks) + " |")
            rows.append(f"| {variant} | {seed} | {evals[last]:.2f} | {sum(late_train) / len(late_train):.2f} | "
                        f"{tags['charts/SPS'][-1][1]:,.0f} | {wall / 60:.1f} min |")
            print(rows[-1], flush=True)
    marks = range(EVERY, options.frames // 3200 * 3200 + 1, EVERY)  # the last evaluation's step at most
    table = [f"ippo.py on PettingZoo MPE simple_spread_v3, {time.strftime('%Y-%m-%d')}, {machine()}, one run at a time",
             f"command: {command}; variant flags: " + ", ".join(f"{v}: {f or 'none'}" for v, f in VARIANTS.items()), "",
             "Evaluation return (mean over the 3 agents of each agent's 25-step return, 32 episodes, deterministic) "
             "at the first evaluation (32k frames) and at every 200k frames:", "",
             "| variant | seed | 32k | " + " | ".join(f"{m // 1000}k" for m in marks) + " |",
             "|---|---:|---:|" + "---:|" * len(marks), *curves, "",
             "| variant | seed | final eval return | train return, last 100k frames | steps/s | wall time |",
             "|---|---:|---:|---:|---:|---:|", *rows]
    options.out.mkdir(parents=True, exist_ok=True)
    (options.out / "table.md").write_text("\n".join(table) + "\n")
    subprocess.run([sys.executable, str(REPO / "scripts" / "plot.py"), *map(str, run_dirs), "--metrics", "eval/return",
                    "--group", r"^spread_([a-z_]+)_s\d+_\d+$", "--out", str(options.out)], check=True,
                   stdout=subprocess.DEVNULL)
    print("\n" + "\n".join(table))


if __name__ == "__main__":
    main()
