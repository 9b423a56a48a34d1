#!/usr/bin/env bash
# The GPU acceptance run: what the CPU-only suite cannot reach, in one command on a machine with CUDA.
#   bash benchmarks/gpu.sh [MINUTES] [PATH/TO/ManiSkill/examples/baselines/ppo/ppo.py]
# Within MINUTES (default 60): (a) pytest -m gpu (tests/test_gpu.py); (b) ppo.py with ManiSkill's baseline commands for
# PushCube-v1 and PickCube-v1, and PushCube-v1 with 4 seeds in one simulation (--num_seeds); (c) ppo_rnn.py on
# PushCube-v1, ippo.py on TwoRobotPickCube-v1 and ppo_rgb.py on PushCube-v1's camera (ManiSkill's ppo_rgb.py command),
# a few minutes each; (d) given ManiSkill's own ppo.py, its PushCube-v1 command beside ours; (e) ppo_rnn.py's update
# replay on the GPU.
# A run that reaches its share of the time is stopped with SIGTERM (the trainers save a checkpoint).
# The runs go to ./runs/gpu_*; the results to benchmarks/results/gpu/DATE/ (OUT=... elsewhere): gpu.txt,
# pytest_gpu.txt, rnn_replay.md, table.md (final SPS, eval success and return, steps and wall time of each run) and
# PNG curves against steps and wall time. Without CUDA it says so and exits 0. REPORT_ONLY=1 writes table.md and the
# curves from the ./runs/gpu_* there are.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$repo/.venv/bin/python}
budget=$(( ${1:-60} * 60 ))
maniskill_ppo=${2:-}
out=${OUT:-$repo/benchmarks/results/gpu/$(date +%F)}

report() {
  mkdir -p "$out"
  shopt -s nullglob
  local runs=(runs/gpu_*/ runs/gpu_*/gpu_*__seed*/)  # the seeds' runs of a --num_seeds run too
  shopt -u nullglob
  "$PYTHON" "$repo/scripts/summarize.py" "${runs[@]}" --group '^(.*)$' \
    --metrics eval/success_once eval/return charts/SPS > "$out/table.md" || return 1
  "$PYTHON" "$repo/scripts/plot.py" "${runs[@]}" --group '^(.*)$' --metrics eval/success_once eval/return --out "$out"
}
if [ "${REPORT_ONLY:-0}" = 1 ]; then
  report
  exit
fi
if ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
  echo "no GPU here (torch.cuda.is_available() is False): benchmarks/gpu.sh measures on a machine with CUDA"
  exit 0
fi
mkdir -p "$out" runs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt"

share() { echo $(( budget * $1 / 100 )); }  # seconds of the budget's percent $1
train() {  # NAME PERCENT COMMAND...: runs/gpu_NAME, its output in runs/gpu_NAME.log
  local name=$1 seconds; seconds=$(share "$2"); shift 2
  echo "$(date +%T) gpu_$name (at most ${seconds}s): $*"
  timeout --signal=TERM --kill-after=120 "$seconds" "$@" > "runs/gpu_$name.log" 2>&1
  echo "$(date +%T) gpu_$name: exit $?"
}

parallel=()  # the GPU tests side by side where pytest-xdist is installed: a GPU machine has the cores
"$PYTHON" -c 'import xdist' 2>/dev/null && parallel=(-n 8)
timeout --kill-after=60 "$(share 20)" "$PYTHON" -m pytest -m gpu -q -rs "${parallel[@]}" "$repo/tests/test_gpu.py" \
  > "$out/pytest_gpu.txt" 2>&1
echo "pytest -m gpu: $(tail -n 1 "$out/pytest_gpu.txt")"
"$PYTHON" "$repo/benchmarks/rnn_replay.py" --device cuda > "$out/rnn_replay.md"
"$PYTHON" "$repo/benchmarks/rnn_replay.py" --device cuda --packed | tail -n 1 >> "$out/rnn_replay.md"
pushcube=(--env_id=PushCube-v1 --num_envs=2048 --update_epochs=8 --num_minibatches=32 --total_timesteps=2_000_000
          --eval_freq=10 --num_steps=20)
train ppo_PushCube 10 "$PYTHON" "$repo/ppo.py" "${pushcube[@]}" --exp_name=gpu_ppo_PushCube
train ppo_PickCube 20 "$PYTHON" "$repo/ppo.py" --env_id=PickCube-v1 --num_envs=1024 --update_epochs=8 \
  --num_minibatches=32 --total_timesteps=10_000_000 --exp_name=gpu_ppo_PickCube
train ppo_rnn_PushCube 10 "$PYTHON" "$repo/ppo_rnn.py" "${pushcube[@]}" --exp_name=gpu_ppo_rnn_PushCube
train ippo_TwoRobotPickCube 10 "$PYTHON" "$repo/ippo.py" --env_id=TwoRobotPickCube-v1 \
  --exp_name=gpu_ippo_TwoRobotPickCube
train ppo_rgb_PushCube 15 "$PYTHON" "$repo/ppo_rgb.py" --env_id=PushCube-v1 --num_envs=256 --update_epochs=8 \
  --num_minibatches=8 --total_timesteps=1_000_000 --eval_freq=10 --num_steps=20 --exp_name=gpu_ppo_rgb_PushCube
# 4 seeds of PushCube in one simulation of 4 x 512 envs, beside the 2048 envs of one seed above
train ppo_PushCube_seeds4 5 "$PYTHON" "$repo/ppo.py" "${pushcube[@]}" --num_envs=512 --num_seeds=4 \
  --total_timesteps=500_000 --exp_name=gpu_ppo_PushCube_seeds4
if [ -n "$maniskill_ppo" ]; then
  train maniskill_ppo_PushCube 10 "$PYTHON" "$maniskill_ppo" "${pushcube[@]}" --exp-name=gpu_maniskill_ppo_PushCube
fi
report && cat "$out/table.md"
echo "results: $out"
