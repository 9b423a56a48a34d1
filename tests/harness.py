"""Run a trainer with one part replaced, as a test's subprocess: `python -m tests.harness MODE TRAINER ARGS...`.

stall_checkpoint: the second checkpoint write stops half-way (half the bytes on disk, then a marker file
    `stalled` in the working directory) and waits there to be killed.
no_gradient_average: ranks step with their own gradients (run it under torchrun), which the trainer must notice.
full_logs: the disk fills up under TensorBoard's event file after a few writes.
kill_after TRAINER NAME ARGS: the process kills itself (SIGKILL) right after it writes the first checkpoint file
    named NAME, in whichever run directory (ppo.py --num_seeds writes the run's and each seed's).
rss: after every update, a line "ITERATION RSS_MIB" (the process with its worker processes) in ./rss.txt, so that
    memory is measured against the run's progress, not the clock.
"""

import errno
import importlib
import itertools
import os
import signal
import sys
import time
from pathlib import Path


def stall_second_checkpoint_write(trainer):
    checkpoint_files = []

    def open_stalling(path, mode="r", *args, **kwargs):
        f = open(path, mode, *args, **kwargs)
        if not str(path).endswith(".pt.tmp"):
            return f
        checkpoint_files.append(path)
        if len(checkpoint_files) < 2:
            return f

        class HalfWritten:
            def __enter__(self):
                return self

            def __exit__(self, *exc_info):
                f.close()

            def write(self, data):
                f.write(bytes(data)[:len(data) // 2])
                f.flush()
                Path("stalled").touch()
                time.sleep(600)

        return HalfWritten()

    trainer.open = open_stalling  # the trainer's save_checkpoint finds it before the builtin


def kill_after_first_checkpoint(trainer, name: str):
    save = trainer.save_checkpoint

    def save_then_die(path, state):
        save(path, state)
        if path.name == name:
            os.kill(os.getpid(), signal.SIGKILL)

    trainer.save_checkpoint = save_then_die


def fill_the_disk_under_the_logs():
    from tensorboard.compat.tensorflow_stub.io import gfile

    append, writes = gfile.LocalFileSystem.append, itertools.count()

    def append_until_full(self, *args, **kwargs):
        if next(writes) >= 5:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return append(self, *args, **kwargs)

    gfile.LocalFileSystem.append = append_until_full


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


def record_rss_after_each_update(trainer):
    update, log, iterations = trainer.update, open("rss.txt", "w", buffering=1), itertools.count(1)

    def update_and_record(*args, **kwargs):
        stats = update(*args, **kwargs)
        log.write(f"{next(iterations)} {tree_rss_mib(os.getpid()):.1f}\n")
        return stats

    trainer.update = update_and_record


if __name__ == "__main__":
    mode, trainer_name, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    trainer = importlib.import_module(trainer_name)
    if mode == "stall_checkpoint":
        stall_second_checkpoint_write(trainer)
    elif mode == "no_gradient_average":
        trainer.average_gradients = lambda agent, loss_finite: loss_finite
    elif mode == "kill_after":
        kill_after_first_checkpoint(trainer, argv.pop(0))
    elif mode == "full_logs":
        fill_the_disk_under_the_logs()
    elif mode == "rss":
        record_rss_after_each_update(trainer)
    else:
        sys.exit(f"unknown mode {mode}")
    sys.argv[0] = trainer.__file__
    sys.exit(trainer.cli(argv))
