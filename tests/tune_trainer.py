"""A stand-in trainer for tests/test_tune.py: it takes the trainers' flags that scripts/tune.py gives, and logs, for
each of its --num_seeds seeds, eval/return = -(x - 3)^2 + seed / 100 at steps 1 to --steps, one every --step_seconds,
in the run directories a trainer writes (runs/NAME, runs/NAME/NAME__seed{S}). SIGTERM stops it after the step it is
on; --fail makes it exit at once with an error line."""

import dataclasses
import signal
import sys
import time
from pathlib import Path

import tyro
from torch.utils.tensorboard import SummaryWriter


@dataclasses.dataclass
class Args:
    env_id: str = "Tune-v0"
    x: float = 0.0
    steps: int = 4
    step_seconds: float = 0.0
    num_seeds: int = 1
    seed: int = 1
    exp_name: str = "run"
    torch_threads: int = 0
    capture_video: bool = True
    fail: bool = False
    resume: str | None = None  # as the trainers', which tune.py refuses


def main():
    args = tyro.cli(Args, use_underscores=True)
    if args.fail:
        print("error: told to fail", file=sys.stderr)
        return 2
    stopped = []
    signal.signal(signal.SIGTERM, lambda *_: stopped.append(True))
    run_dir = Path("runs") / args.exp_name
    seeds = range(args.seed, args.seed + args.num_seeds)
    dirs = [run_dir / f"{args.exp_name}__seed{s}" for s in seeds] if args.num_seeds > 1 else [run_dir]
    writers = [SummaryWriter(str(d)) for d in dirs]
    for step in range(1, args.steps + 1):
        for s, writer in zip(seeds, writers):
            writer.add_scalar("eval/return", -(args.x - 3) ** 2 + s / 100, step)
            writer.flush()
        if stopped:
            break
        time.sleep(args.step_seconds)
    for writer in writers:
        writer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
