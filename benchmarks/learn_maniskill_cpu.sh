#!/usr/bin/env bash
# ppo.py (or TRAINER) learns a ManiSkill task on a CPU-only machine: 4 CPU worker envs, several seeds one after
# another; a markdown table, ppo_eval.py's results of each final checkpoint over 100 episodes, and learning curves
# (success rate against steps and against wall time) in benchmarks/results/<task>_cpu/ (e.g. pushcube_cpu).
#
#   bash benchmarks/learn_maniskill_cpu.sh                        # PushCube-v1, 300k steps (about 13 minutes a run on 2 cores), seeds 1 2 3
#   bash benchmarks/learn_maniskill_cpu.sh PickCube-v1 800000 1   # task, steps, seeds
#   NAME=pickcube_cpu_steps100 bash benchmarks/learn_maniskill_cpu.sh PickCube-v1 800000 1 --num_steps=100   # flags after the seeds override the settings below
#   OUT=/tmp/check EVAL_EPISODES=4 bash benchmarks/learn_maniskill_cpu.sh PushCube-v1 400 2   # a quick check
#   TRAINER=ppo_rgb NAME=pushcube_rgb_cpu EVAL_EPISODES=20 bash benchmarks/learn_maniskill_cpu.sh PushCube-v1 30000 1   # the camera
#
# The runs go to runs/<NAME>__seed<S> of the working directory (NAME: <task>_cpu unless set), one at a time (each
# keeps both cores busy); run the script again after an interruption and it finishes what is missing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

env_id=${1:-PushCube-v1}
steps=${2:-300000}
seeds=${3:-"1 2 3"}
task=${env_id##*:}  # my_tasks:MyPushCube-v1 is MyPushCube-v1 of module my_tasks
name=${NAME:-$(echo "${task%-v*}" | tr '[:upper:]' '[:lower:]')_cpu}
overrides=("${@:4}")
episodes=${EVAL_EPISODES:-100}  # of each final checkpoint, with ppo_eval.py
trainer=${TRAINER:-ppo}  # ppo_rgb: from the task's camera (and state)
out=${OUT:-$repo/benchmarks/results/$name}
python=${PYTHON:-$repo/.venv/bin/python}

# ManiSkill's PushCube-v1 and PickCube-v1 defaults (gamma 0.8, 50-step rollouts, 3x256 networks, KL stop at 0.1) with
# 4 worker envs, 4 minibatches and 8 epochs, the learning rate decaying linearly to 0 (on PushCube, with batches of
# 200 steps the policy kept swinging between evaluations at a constant rate), and observation normalization, which
# mattered most on PushCube: without it the seeds first succeeded on every evaluation episode at 180k-360k steps and
# ended at 0.53-0.88 over 100 episodes after 500k; with it, seed 3 (the slowest) at 80k. Evaluation: the first
# episode of each of 4 envs (4 worker envs for training and 4 for evaluation are all that 2 cores hold),
# deterministic actions, every 50 iterations (10,000 steps) and at the end; --num_eval_steps=100 leaves room for a
# whole 50-step episode.
settings=(--env_id="$env_id" --num_envs=4 --num_steps=50 --num_minibatches=4 --update_epochs=8 --lr_schedule=linear
          --norm_obs --num_eval_envs=4 --num_eval_steps=100 --eval_freq=50 --no_capture_video "${overrides[@]}")

"$repo/scripts/sweep.sh" --seeds "$seeds" --jobs 1 "$name" -- \
  "$python" "$repo/$trainer.py" "${settings[@]}" --total_timesteps "$steps"

runs=()
for seed in $seeds; do
  runs+=("runs/${name}__seed${seed}")
done
mkdir -p "$out"
"$python" "$repo/scripts/plot.py" "${runs[@]}" --metrics eval/success_once eval/return --out "$out" >/dev/null
{
  echo "$trainer.py on $env_id (CPU simulation), $(date -u +%Y-%m-%d), $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), one run at a time"
  echo "seeds: $seeds; command: $trainer.py ${settings[*]} --total_timesteps $steps --seed <seed>"
  echo "eval/success_once: the share of the 4 evaluation episodes that succeeded at some step, at the last evaluation"
  echo
  "$python" "$repo/scripts/summarize.py" "${runs[@]}" --metrics eval/success_once eval/return charts/SPS
  echo
  "$python" "$repo/scripts/summarize.py" "${runs[@]}" --metrics eval/success_once eval/return charts/SPS --group '^(.*)$'
  # Four episodes cannot tell 0.9 from 1: each final checkpoint also plays $episodes episodes of its own.
  for seed in $seeds; do
    echo
    echo "\`ppo_eval.py runs/${name}__seed${seed} --num_episodes $episodes --num_envs 4 --sim_backend cpu\`:"
    echo '```'
    "$python" "$repo/ppo_eval.py" "runs/${name}__seed${seed}" --num_episodes "$episodes" --num_envs 4 --sim_backend cpu
    echo '```'
  done
} > "$out/table.md"
cat "$out/table.md"
