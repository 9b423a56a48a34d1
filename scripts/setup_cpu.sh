#!/usr/bin/env bash
# Set up a CPU-only Debian/Ubuntu machine: the Vulkan software driver SAPIEN needs (apt), then a virtual
# environment ./.venv with CPU PyTorch and the requirements (pip).
#   bash scripts/setup_cpu.sh          # runtime requirements
#   bash scripts/setup_cpu.sh --dev    # and the test requirements
set -euo pipefail
cd "$(dirname "$0")/.."
requirements=requirements.txt
[ "${1:-}" = "--dev" ] && requirements=requirements-dev.txt

bash scripts/install_cpu_vulkan.sh

python=${PYTHON:-python3}
if ! "$python" -m venv --help >/dev/null 2>&1 || ! "$python" -c "import ensurepip" >/dev/null 2>&1; then
  sudo_cmd=""; [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get install -y -qq python3-venv
fi
[ -x .venv/bin/python ] || "$python" -m venv .venv
# torch first, alone: where pip's index serves a CPU build (as a CPU-only index does), that is what it takes; PyPI's
# Linux wheel is the CUDA build of several GB, which runs on a CPU too (README.md, Set-up).
.venv/bin/python -m pip install -q torch==2.13.0
.venv/bin/python -m pip install -q -r "$requirements"
.venv/bin/python -c "import torch, mani_skill, gymnasium; print('ready: torch', torch.__version__, '| mani_skill', mani_skill.__version__, '| gymnasium', gymnasium.__version__)"
