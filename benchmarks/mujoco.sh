#!/usr/bin/env bash
# ppo.py on MuJoCo v5 (HalfCheetah, Hopper, Walker2d) at CleanRL's MuJoCo settings, several seeds: a markdown table
# and learning curves in benchmarks/results/mujoco/.
#
#   bash benchmarks/mujoco.sh                          # 1M steps, seeds 1 2 3, 2 runs at a time (about 70 min on 2 cores)
#   bash benchmarks/mujoco.sh 1000000 "1 2 3 4 5" 4    # steps, seeds, runs at a time
#   OUT=/tmp/check bash benchmarks/mujoco.sh 4096 1 1  # a quick check of the script (the test suite runs this)
#
# Needs mujoco (requirements-dev.txt, or pip install "gymnasium[mujoco]") and matplotlib for the plots. The runs go to
# runs/mujoco__env_id=<task>__seed<S> of the working directory; run the script again after an interruption and it finishes what is missing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

steps=${1:-1000000}
seeds=${2:-"1 2 3"}
jobs=${3:-2}
out=${OUT:-$repo/benchmarks/results/mujoco}
python=${PYTHON:-$repo/.venv/bin/python}

# CleanRL's ppo_continuous_action.py settings (its 2x64 networks, observation and reward normalization, clipped value
# loss, linear learning-rate decay, no KL stop), with ppo.py's evaluation: 4 episodes of the deterministic policy
# every 25 iterations (51,200 steps) and at the end.
settings=(--hidden_sizes 64 64 --num_envs 1 --num_steps 2048 --num_minibatches 32 --update_epochs 10
          --gamma 0.99 --gae_lambda 0.95 --learning_rate 3e-4 --lr_schedule linear --target_kl None --ent_coef 0
          --norm_obs --norm_reward --clip_vloss --max_grad_norm 0.5
          --num_eval_envs 4 --eval_freq 25 --no_capture_video)

"$repo/scripts/sweep.sh" --seeds "$seeds" --jobs "$jobs" \
  --vary "--env_id=HalfCheetah-v5 --env_id=Hopper-v5 --env_id=Walker2d-v5" mujoco -- \
  "$python" "$repo/ppo.py" "${settings[@]}" --total_timesteps "$steps"

mkdir -p "$out"
all_runs=()
for task in HalfCheetah-v5 Hopper-v5 Walker2d-v5; do
  runs=()
  for seed in $seeds; do
    runs+=("runs/mujoco__env_id=${task}__seed${seed}")
  done
  all_runs+=("${runs[@]}")
  "$python" "$repo/scripts/plot.py" "${runs[@]}" --metrics eval/return --out "$out/$task" >/dev/null
done
{
  echo "ppo.py on MuJoCo v5, $(date -u +%Y-%m-%d), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $jobs runs at a time"
  echo "seeds: $seeds; command: ppo.py ${settings[*]} --total_timesteps $steps --env_id <task> --seed <seed>"
  echo "eval/return: the mean return of 4 episodes of the deterministic policy at the last evaluation"
  echo
  "$python" "$repo/scripts/summarize.py" "${all_runs[@]}" --metrics eval/return charts/SPS
} > "$out/table.md"
cat "$out/table.md"
