#!/usr/bin/env bash
# scripts/tune.py on ppo.py: Pendulum-v1 and Ant-v5, each from a baseline of settings (the flags after --, which
# --confirm's "defaults" run), trials shorter than the final run, pruned, then the best and the baseline on fresh
# seeds at the full budget. The tunings' directories are tunes/bench_<task> of the working directory; run the script
# again after an interruption and it goes on where it stopped. results.md and the plots are copied to
# benchmarks/results/tune_<task>/.
#
#   bash benchmarks/tune.sh pendulum   # 40 trials of 4 seeds x 40,960 steps, 10 evaluations each; the best and the
#                                      # baseline on 10 fresh seeds at 102,400 steps
#   bash benchmarks/tune.sh ant        # 24 trials of 4 seeds x 204,800 steps, 5 evaluations each; on 5 fresh seeds
#                                      # at 1M steps
#   TRIALS=2 STEPS=2048 FINAL=4096 CONFIRM=2 bash benchmarks/tune.sh pendulum   # a quick check of the script
#
# Needs optuna, mujoco (Ant), rliable and matplotlib (requirements-dev.txt).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
task=${1:?give pendulum or ant}

case "$task" in
  pendulum)
    env_id=Pendulum-v1 trials=${TRIALS:-40} steps=${STEPS:-40960} final=${FINAL:-102400} confirm=${CONFIRM:-10}
    # tests/test_learning.py's Pendulum settings (chosen by hand on seeds 1-3)
    baseline=(--num_envs 8 --num_steps 256 --num_minibatches 8 --update_epochs 10 --gamma 0.95 --gae_lambda 0.95
              --learning_rate 1e-3 --lr_schedule linear --target_kl None --norm_obs --reward_scale 0.1
              --clip_coef 0.2 --ent_coef 0 --eval_freq 2)
    space=(learning_rate=1e-4:3e-3:log gamma=0.9:0.99 gae_lambda=0.8:0.99 num_minibatches=4,8,16,32
           update_epochs=4:20 clip_coef=0.1:0.3 ent_coef=0.0:0.01) ;;
  ant)
    env_id=Ant-v5 trials=${TRIALS:-24} steps=${STEPS:-204800} final=${FINAL:-1000000} confirm=${CONFIRM:-5}
    # benchmarks/mujoco.sh's Ant settings (CleanRL's ppo_continuous_action.py's, log-std from -0.5)
    baseline=(--num_envs 1 --norm_obs --norm_reward --target_kl None --num_eval_envs 4 --hidden_sizes 64 64
              --num_steps 2048 --num_minibatches 32 --update_epochs 10 --gamma 0.99 --gae_lambda 0.95
              --learning_rate 3e-4 --lr_schedule linear --ent_coef 0 --clip_coef 0.2 --clip_vloss
              --max_grad_norm 0.5 --log_std_init -0.5 --eval_freq 20)
    space=(learning_rate=1e-4:1e-3:log gamma=0.98:0.999 gae_lambda=0.9:0.99 num_minibatches=8,16,32,64
           update_epochs=5:20 clip_coef=0.1:0.3 log_std_init=-1.5:0.0) ;;
  *) echo "error: give pendulum or ant, not $task" >&2; exit 2 ;;
esac

dir=tunes/bench_$env_id
"$python" "$repo/scripts/tune.py" --trainer "$repo/ppo.py" --env_id "$env_id" --trials "$trials" --seeds 4 \
  --dir "$dir" --confirm "$confirm" --confirm_flags="--total_timesteps $final" --space "${space[@]}" \
  -- "${baseline[@]}" --total_timesteps "$steps"
out=${OUT:-$repo/benchmarks/results/tune_$env_id}
mkdir -p "$out"
rm -f "$out"/confirmation_*.png  # as tune.py does: an earlier confirmation's curves go
cp "$dir"/results.md "$dir"/*.png "$out"/
