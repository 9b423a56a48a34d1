#!/usr/bin/env bash
# ppo_rgb.py learns an Atari game at CleanRL's ppo_atari.py settings on this machine: learning curves (the training
# episodes' return and the evaluation return against steps and wall time), a markdown table and ppo_eval.py's
# results of the final checkpoint, in benchmarks/results/<game>_atari/ (e.g. pong_atari for PongNoFrameskip-v4).
#
#   bash benchmarks/learn_atari.sh                                   # PongNoFrameskip-v4, 1.5M steps (45 minutes on 2 cores), seed 1
#   bash benchmarks/learn_atari.sh BreakoutNoFrameskip-v4 10000000 "1 2 3"   # game, steps, seeds
#   OUT=/tmp/check EVAL_EPISODES=2 bash benchmarks/learn_atari.sh PongNoFrameskip-v4 2048 1 --eval_freq=1   # quick
#
# Runs go to runs/<game>_atari__seed<S> of the working directory, one at a time; flags after the seeds override.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

env_id=${1:-PongNoFrameskip-v4}
steps=${2:-1500000}
seeds=${3:-1}
game=${env_id#ALE/}
name=$(echo "${game%%NoFrameskip*}" | tr '[:upper:]' '[:lower:]' | sed 's/-v[0-9]*$//')_atari
episodes=${EVAL_EPISODES:-16}
out=${OUT:-$repo/benchmarks/results/$name}
python=${PYTHON:-$repo/.venv/bin/python}

# CleanRL's ppo_atari.py: 8 envs x 128 steps, 4 minibatches, 4 epochs, lr 2.5e-4 decaying to 0, clip 0.1, clipped
# value loss, entropy 0.01, no KL stop, rewards clipped to +-1 (returns are logged unclipped). The envs step in this
# process: in worker processes they were slower on 2 cores (benchmarks/speed_cleanrl_settings.py --suite atari).
# Evaluation: one episode on each of 4 envs every 50 iterations (51,200 steps), deterministic actions.
settings=(--env_id="$env_id" --num_envs=8 --num_steps=128 --num_minibatches=4 --update_epochs=4 --gamma=0.99
          --gae_lambda=0.95 --learning_rate=2.5e-4 --lr_schedule=linear --clip_coef=0.1 --clip_vloss --ent_coef=0.01
          --target_kl=None --clip_reward=1 --num_eval_envs=4 --eval_freq=50 --no_capture_video "${@:4}")

"$repo/scripts/sweep.sh" --seeds "$seeds" --jobs 1 "$name" -- \
  "$python" "$repo/ppo_rgb.py" "${settings[@]}" --total_timesteps "$steps"

runs=()
for seed in $seeds; do
  runs+=("runs/${name}__seed${seed}")
done
metrics=(charts/episodic_return eval/return charts/SPS)
mkdir -p "$out"
"$python" "$repo/scripts/plot.py" "${runs[@]}" --metrics "${metrics[@]:0:2}" --out "$out" >/dev/null
{
  echo "ppo_rgb.py on $env_id, $(date -u +%Y-%m-%d), $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), one run at a time"
  echo "seeds: $seeds; command: ppo_rgb.py ${settings[*]} --total_timesteps $steps --seed <seed>"
  echo "charts/episodic_return: the mean return of the training episodes that ended in the last iteration"
  echo
  "$python" "$repo/scripts/summarize.py" "${runs[@]}" --metrics "${metrics[@]}" --group '^(.*)$'
  for seed in $seeds; do
    echo
    echo "\`ppo_eval.py runs/${name}__seed${seed} --num_episodes $episodes --num_envs 4\`:"
    echo '```'
    "$python" "$repo/ppo_eval.py" "runs/${name}__seed${seed}" --num_episodes "$episodes" --num_envs 4
    echo '```'
  done
} > "$out/table.md"
cat "$out/table.md"
