"""What the first iteration's check of --num_seeds costs (first_call_checked(): the first policy step and the first
update also run for each seed alone): a trainer's logged rollout and update times of its first iteration against the
mean of its next ones, with N seeds and with one seed (no check: what a first iteration costs anyway, warm-up).

    python benchmarks/seeds_check_cost.py                                   # every setting of seeds_speed.py
    python benchmarks/seeds_check_cost.py --settings cartpole --num_seeds 1 4   # a check of it

Prints a markdown table per setting: for each N, the first iteration's rollout and update seconds, the later
iterations' mean, and the first's extra seconds over them; one measurement at a time.
"""

import argparse
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
from benchmarks.seeds_speed import SETTINGS, finish, run  # noqa: E402
from tests.util import machine, scalars  # noqa: E402

ITERATIONS = 4


def iteration_times(flags: list[str], num_seeds: int) -> dict[str, list[float]]:
    """The first seed's logged time/rollout_time and time/update_time, an entry per iteration."""
    batch = int(flags[flags.index("--num_envs") + 1]) * int(flags[flags.index("--num_steps") + 1])
    at = flags.index("--total_timesteps")
    flags = flags[:at] + flags[at + 2:]
    with tempfile.TemporaryDirectory() as tmp:
        finish(run([*flags, "--total_timesteps", str(ITERATIONS * batch), "--num_seeds", str(num_seeds),
                    "--exp_name", "check"], tmp))
        logs = sorted(Path(tmp, "runs", "check").glob("**/events.out.tfevents.*"))[0].parent
        found = scalars(logs)
        return {tag: [value for _, value in found[f"time/{tag}_time"]] for tag in ("rollout", "update")}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", nargs="+", choices=list(SETTINGS), default=list(SETTINGS))
    parser.add_argument("--num_seeds", nargs="+", type=int, default=[1, 4, 16])
    options = parser.parse_args()
    print(f"benchmarks/seeds_check_cost.py, {machine()}, {ITERATIONS} iterations a run\n")
    for name in options.settings:
        description, flags = SETTINGS[name]
        print(f"**{description}**\n")
        print("| seeds | first rollout (s) | later rollouts (s) | first update (s) | later updates (s) | "
              "first iteration's extra (s) |")
        print("|---:|---:|---:|---:|---:|---:|")
        for num_seeds in options.num_seeds:
            times = iteration_times(flags.split(), num_seeds)
            first = {tag: values[0] for tag, values in times.items()}
            later = {tag: sum(values[1:]) / len(values[1:]) for tag, values in times.items()}
            extra = sum(first.values()) - sum(later.values())
            print(f"| {num_seeds} | {first['rollout']:.3f} | {later['rollout']:.3f} | {first['update']:.3f} | "
                  f"{later['update']:.3f} | {extra:.2f} |")
        print()


if __name__ == "__main__":
    main()
