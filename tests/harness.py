"""Run a trainer with one part replaced, as a test's subprocess: `python -m tests.harness MODE TRAINER ARGS...`.

stall_checkpoint: the second checkpoint write stops half-way (half the bytes on disk, then a marker file
    `stalled` in the working directory) and waits there to be killed.
no_gradient_average: ranks step with their own gradients (run it under torchrun), which the trainer must notice.
"""

import importlib
import io
import sys
import time
from pathlib import Path

import torch


def stall_second_checkpoint_write():
    real_save = torch.save
    writes = []

    def save(obj, f, *args, **kwargs):
        writes.append(f)
        if len(writes) < 2:
            return real_save(obj, f, *args, **kwargs)
        buffer = io.BytesIO()
        real_save(obj, buffer, *args, **kwargs)
        f.write(buffer.getvalue()[:buffer.tell() // 2])
        f.flush()
        Path("stalled").touch()
        time.sleep(600)

    torch.save = save


if __name__ == "__main__":
    mode, trainer_name, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    trainer = importlib.import_module(trainer_name)
    if mode == "stall_checkpoint":
        stall_second_checkpoint_write()
    elif mode == "no_gradient_average":
        trainer.average_gradients = lambda agent, loss_finite: loss_finite
    else:
        sys.exit(f"unknown mode {mode}")
    sys.argv[0] = trainer.__file__
    sys.exit(trainer.cli(argv))
