"""Resident memory over a long run: a trainer's RSS (with its simulator worker processes) sampled every second
(--interval).

    python benchmarks/rss.py                                  # ppo.py, PushCube-v1 on one CPU env, 5,000 iterations
    python benchmarks/rss.py --trainer ippo -- --env_id vmas:navigation --num_envs 60 --total_timesteps 3000000

Everything after `--` replaces the default training flags. Prints the highest RSS of the process tree in each tenth
of the run, and the growth of the last tenth's over the first's (start-up and warm-up); benchmarks/README.md has
the results.
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


def tree_rss_mib(pid: int) -> float | None:
    """RSS of pid and its descendants (e.g. simulator workers), None once pid has exited."""
    total, pending = 0, [pid]
    while pending:
        current = pending.pop()
        try:
            with open(f"/proc/{current}/status") as f:
                total += next((int(line.split()[1]) for line in f if line.startswith("VmRSS:")), 0)
            with open(f"/proc/{current}/task/{current}/children") as f:
                pending += [int(child) for child in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            if current == pid:
                return None
    return total / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trainer", default="ppo", choices=["ppo", "ppo_rnn", "ippo"])
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between samples (at least 10 are needed)")
    parser.add_argument("flags", nargs=argparse.REMAINDER, help="-- then the trainer's flags")
    args = parser.parse_args()
    flags = args.flags[1:] if args.flags[:1] == ["--"] else args.flags
    flags = flags or DEFAULT_FLAGS.split()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, str(REPO / f"{args.trainer}.py"), *flags, "--exp_name", "rss"]
        # A file, not a pipe: a long run's progress would fill a pipe that no one reads until the end, and stall it.
        with open(Path(tmp) / "stderr.txt", "w+") as log:
            proc = subprocess.Popen(command, cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=log, text=True)
            start, samples = time.time(), []
            while proc.poll() is None:
                rss = tree_rss_mib(proc.pid)
                if rss is not None:
                    samples.append((time.time() - start, rss))
                time.sleep(args.interval)
            log.seek(0)
            stderr = log.read()
    if proc.returncode != 0 or len(samples) < 10:
        sys.exit(f"the run failed or was too short to measure:\n{stderr[-2000:]}")
    print(f"`python {args.trainer}.py {' '.join(flags)}`: {samples[-1][0]:.0f} s")
    print("| tenth of the run | until (s) | highest RSS (MiB) |\n|---:|---:|---:|")
    peaks = []
    for k in range(10):
        tenth = samples[len(samples) * k // 10:len(samples) * (k + 1) // 10]
        peaks.append(max(rss for _, rss in tenth))
        print(f"| {k + 1} | {tenth[-1][0]:.0f} | {peaks[-1]:.0f} |")
    print(f"last tenth over first: {100 * (peaks[-1] / peaks[0] - 1):+.1f}%")


if __name__ == "__main__":
    main()
