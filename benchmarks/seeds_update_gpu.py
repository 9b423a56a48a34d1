"""benchmarks/seeds_update.py on a GPU: its networks, optimizers and minibatches on the device (drawn by its own CPU
generator, the same numbers as on the CPU, then moved), each timing waiting for the device to finish its work.

    python benchmarks/seeds_update_gpu.py --seeds 1 2 4 8 16 32 64 --steps 16   # CUDA where torch sees a GPU
    python benchmarks/seeds_update_gpu.py --device cpu --seeds 1 2 --steps 2      # a check of this file

Prints the device, then seeds_update.py's tables; its other flags are seeds_update.py's.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import seeds_update  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", help="default: cuda where torch sees a GPU, else cpu")
    options, rest = parser.parse_known_args()
    device = torch.device(options.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"error: --device {options.device}, but torch sees no GPU here (torch.cuda.is_available() is False)")
    # read before they are replaced: a renamed part of seeds_update.py fails here, not silently on the GPU alone
    host_minibatches, host_timed = seeds_update.minibatches, seeds_update.timed

    def minibatches(num_seeds: int, steps: int):
        with torch.device("cpu"):  # the benchmark's generator is a CPU one
            batches = host_minibatches(num_seeds, steps)
        return [tuple(x.to(device) for x in batch) for batch in batches]

    def timed(fn, repeats: int = 3) -> float:
        return host_timed(lambda: (fn(), torch.cuda.synchronize(device) if device.type == "cuda" else None), repeats)

    seeds_update.minibatches, seeds_update.timed = minibatches, timed
    torch.set_default_device(device)  # every tensor and network that seeds_update.py makes
    sys.argv = [sys.argv[0], *rest]
    print(f"device: {device}{f' ({torch.cuda.get_device_name(device)})' if device.type == 'cuda' else ''}\n")
    seeds_update.main()


if __name__ == "__main__":
    main()
