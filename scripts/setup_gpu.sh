#!/usr/bin/env bash
# Set up a machine with an NVIDIA GPU: a virtual environment ./.venv with PyTorch's CUDA build and the requirements,
# then a check that torch sees the GPU and that ManiSkill can simulate and render on it (Vulkan).
#   bash scripts/setup_gpu.sh          # runtime requirements
#   bash scripts/setup_gpu.sh --dev    # and the test requirements (then: bash benchmarks/gpu.sh)
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=requirements.txt
[ "${1:-}" = "--dev" ] && requirements=requirements-dev.txt

if ! nvidia-smi >/dev/null 2>&1; then
  echo "error: no NVIDIA GPU (nvidia-smi is missing or fails); on a CPU-only machine: bash scripts/setup_cpu.sh" >&2
  exit 1
fi
python=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install -q torch==2.13.0  # on Linux, PyPI's torch wheel is the CUDA build
.venv/bin/python -m pip install -q -r "$requirements"
.venv/bin/python - <<'PY'
import sys

import torch

if not torch.cuda.is_available():
    sys.exit(f"error: torch {torch.__version__} cannot use the GPU (torch.cuda.is_available() is False): the NVIDIA "
             "driver may be older than this torch build needs; see nvidia-smi's CUDA version")
import gymnasium as gym
import mani_skill.envs  # noqa: F401
import sapien

try:  # SAPIEN downloads PhysX's GPU library from GitHub at its first GPU simulation: here, not in a training run
    sapien.physx.enable_gpu()
except Exception as e:
    home = f"~/.sapien/physx/{sapien.physx.version()}"
    sys.exit(f"error: SAPIEN could not fetch PhysX's GPU library into {home} ({type(e).__name__}); without access to "
             f"GitHub, download linux-so.zip of release {sapien.physx.version()} of sapien-sim/physx-precompiled "
             f"elsewhere and unzip it into {home}")
try:
    env = gym.make("PushCube-v1", num_envs=2, sim_backend="physx_cuda", render_backend="gpu", render_mode="rgb_array")
    env.reset(seed=0)
    frame = env.render()
    env.close()
except Exception as e:
    sys.exit(f"error: ManiSkill cannot simulate and render on the GPU ({type(e).__name__}: {e}); it needs the NVIDIA "
             "driver's Vulkan ICD (nvidia_icd.json, e.g. from the libnvidia-gl package): see ManiSkill's installation "
             "docs, troubleshooting")
print(f"ready: torch {torch.__version__} on {torch.cuda.get_device_name()}, ManiSkill renders {tuple(frame.shape)}")
PY
