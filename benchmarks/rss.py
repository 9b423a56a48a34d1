"""Resident memory over a long run: a trainer's RSS (with its simulator worker processes) after every update.

    python benchmarks/rss.py                                  # ppo.py, PushCube-v1 on one CPU env, 5,000 iterations
    python benchmarks/rss.py --trainer ippo -- --env_id vmas:navigation --num_envs 60 --total_timesteps 3000000

Everything after `--` replaces the default training flags. The trainer runs under tests/harness.py's rss mode, which
samples after each update: the run's tenths are tenths of its iterations, whatever the machine's speed. Prints the
highest RSS in each tenth, and the growth of the last tenth's over the first's (start-up and warm-up);
benchmarks/README.md has the results.
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# One ManiSkill env in-process (the ManiSkillVectorEnv path), short rollouts, an evaluation with video every 50
# iterations: the parts users report growing (RecordEpisode buffers, logging) all run thousands of times.
DEFAULT_FLAGS = ("--env_id PushCube-v1 --num_envs 1 --num_eval_envs 1 --num_steps 16 --num_minibatches 1 "
                 "--update_epochs 1 --total_timesteps 80000 --eval_freq 50 --checkpoint_freq 500 --keep_checkpoints 2")


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", default="ppo", choices=["ppo", "ppo_rnn", "ippo"])
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the trainer's flags")
    args = parser.parse_args()
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    flags = flags or DEFAULT_FLAGS.split()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "tests.harness", "rss", args.trainer, *flags, "--exp_name", "rss"]
        start = time.time()
        result = subprocess.run(command, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        seconds = time.time() - start
        rss_file = Path(tmp) / "rss.txt"
        samples = [float(line.split()[1]) for line in rss_file.read_text().splitlines()] if rss_file.exists() else []
    if result.returncode != 0 or len(samples) < 10:
        sys.exit(f"the run failed or had fewer than 10 iterations to measure:\n{result.stderr[-2000:]}")
    print(f"`python {args.trainer}.py {' '.join(flags)}`: {len(samples)} iterations, {seconds:.0f} s")
    print("| tenth of the run | until iteration | highest RSS (MiB) |\n|---:|---:|---:|")
    peaks = []
    for k in range(10):
        end = len(samples) * (k + 1) // 10
        peaks.append(max(samples[len(samples) * k // 10:end]))
        print(f"| {k + 1} | {end} | {peaks[-1]:.0f} |")
    print(f"last tenth over first: {100 * (peaks[-1] / peaks[0] - 1):+.1f}%")


if __name__ == "__main__":
    main()
