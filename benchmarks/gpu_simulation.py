"""Whether ManiSkill's GPU simulation can start here without a download: SAPIEN loads PhysX's GPU library from
~/.sapien/physx/VERSION/ and, where it is missing, downloads it from GitHub at the first GPU simulation, which on a
machine without network fails or hangs. This looks for the file only; it downloads nothing.

    python benchmarks/gpu_simulation.py      # nothing and exit 0 where the library is there; else why not, exit 1

benchmarks/gpu.sh's set-up check; tests/test_gpu.py skips its tests of the GPU simulation where this says why not.
"""

import argparse
import sys
from pathlib import Path
from typing import Optional


def missing() -> Optional[str]:
    """Why ManiSkill's GPU simulation cannot start, in one line; None where it can (as far as files tell)."""
    try:
        import sapien
    except Exception as e:  # a broken install fails in many ways; all of them mean no simulation
        return f"SAPIEN does not import ({type(e).__name__}: {e})"
    version = sapien.physx.version()
    home = Path.home() / ".sapien" / "physx" / version  # where sapien.physx.enable_gpu() looks, and downloads to
    if (home / "libPhysXGpu_64.so").exists():
        return None
    return (f"PhysX's GPU library is not in {home} (SAPIEN would download it from GitHub: linux-so.zip of release "
            f"{version} of sapien-sim/physx-precompiled, unzipped there)")


if __name__ == "__main__":
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()
    why = missing()
    if why:
        print(why)
    sys.exit(1 if why else 0)
