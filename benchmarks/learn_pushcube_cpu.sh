#!/usr/bin/env bash
# ManiSkill learns on a CPU-only machine: PushCube-v1, 4 CPU worker envs, 300k steps (about 8 minutes on 2 cores).
# Prints the evaluation success rate over training; results are in README.md (Benchmarks).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
seed=${1:-1}
"$python" "$repo/ppo.py" --env_id=PushCube-v1 --exp_name="push_cpu_s$seed" --seed="$seed" --num_envs=4 --num_eval_envs=4 \
  --num_steps=50 --num_minibatches=4 --update_epochs=8 --total_timesteps=300000 --eval_freq=50 --no_capture_video
PYTHONPATH="$repo" "$python" -c "
from tests.util import scalars
tags = scalars('runs/push_cpu_s$seed')
print('step  eval/success_once  eval/return')
for (step, success), (_, ret) in zip(tags['eval/success_once'], tags['eval/return']):
    print(f'{step:>6}  {success:>17.2f}  {ret:>11.2f}')
"
