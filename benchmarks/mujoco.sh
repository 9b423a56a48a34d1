#!/usr/bin/env bash
# ppo.py on MuJoCo v5 (HalfCheetah, Hopper, Walker2d, Ant) with per-task settings, several seeds: a markdown table
# (each task's interquartile mean with its 95% interval, and each seed's) and learning curves in
# benchmarks/results/mujoco/.
#
#   bash benchmarks/mujoco.sh                          # 1M steps, seeds 1-5 of each task in one process (--num_seeds),
#                                                      # the tasks side by side
#   TASKS="Hopper-v5 Ant-v5" bash benchmarks/mujoco.sh  # some of the tasks
#   ONE_PROCESS=0 bash benchmarks/mujoco.sh 1000000 "1 2 3" 2  # a process a seed, 2 seeds at a time per task
#   OUT=/tmp/check bash benchmarks/mujoco.sh 4096 1 1  # a quick check of the script (the test suite runs this)
#
# Needs mujoco (requirements-dev.txt, or pip install "gymnasium[mujoco]"), rliable and matplotlib. The runs go to
# runs/mujoco_<task>__seedsF-L/mujoco_<task>__seedsF-L__seed<S> (ONE_PROCESS=0: runs/mujoco_<task>__seed<S>) of the
# working directory; run the script again after an interruption and it finishes what is missing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

steps=${1:-1000000}
seeds=${2:-"1 2 3 4 5"}
jobs=${3:-1}
one_process=${ONE_PROCESS:-1}
out=${OUT:-$repo/benchmarks/results/mujoco}
python=${PYTHON:-$repo/.venv/bin/python}
read -ra tasks <<< "${TASKS:-HalfCheetah-v5 Hopper-v5 Walker2d-v5 Ant-v5}"

# Every task: one env, observation and reward normalization, no KL stop; ppo.py's evaluation: 4 episodes of the
# deterministic policy about every 51,200 steps and at the end.
common=(--num_envs 1 --norm_obs --norm_reward --target_kl None --num_eval_envs 4 --no_capture_video)
# Hopper, Walker2d and Ant: CleanRL's ppo_continuous_action.py settings (2x64 tanh networks, clipped value loss, linear
# learning-rate decay), with ppo.py's initial log-std of -0.5 (CleanRL's: 0).
cleanrl=(--hidden_sizes 64 64 --num_steps 2048 --num_minibatches 32 --update_epochs 10 --gamma 0.99 --gae_lambda 0.95
         --learning_rate 3e-4 --lr_schedule linear --ent_coef 0 --clip_vloss --max_grad_norm 0.5 --eval_freq 25)
# HalfCheetah: rl-baselines3-zoo's tuned settings (2x256 relu networks starting at std e^-2, short rollouts, many small
# minibatches, a small constant learning rate), with the zoo's value-loss weight: its vf_coef 0.58096 multiplies SB3's
# squared error, which is twice ppo.py's value loss (0.5 * squared error), hence 1.16192 here. (With 0.58096, half the
# weight, the three seeds ended at 5817, 2968 and 5480.) One difference remains: ppo.py's layers are initialized
# orthogonally, the zoo's with torch's default.
zoo_halfcheetah=(--hidden_sizes 256 256 --activation relu --log_std_init -2 --num_steps 512 --num_minibatches 8
                 --update_epochs 20 --gamma 0.98 --gae_lambda 0.92 --learning_rate 2.0633e-5 --clip_coef 0.1
                 --ent_coef 0.000401762 --vf_coef 1.16192 --max_grad_norm 0.8 --eval_freq 100)
settings_of() {
  case "$1" in
    HalfCheetah-v5) echo "${zoo_halfcheetah[*]}" ;;
    *) echo "${cleanrl[*]}" ;;
  esac
}

pids=()
failed=0
for task in "${tasks[@]}"; do
  read -ra settings <<< "$(settings_of "$task")"
  sweep=(--seeds "$seeds" --jobs "$jobs")
  [ "$one_process" = 1 ] && sweep+=(--one_process)
  "$repo/scripts/sweep.sh" "${sweep[@]}" "mujoco_$task" -- \
    "$python" "$repo/ppo.py" "${common[@]}" "${settings[@]}" --total_timesteps "$steps" --env_id "$task" &
  pids+=($!)
done
for pid in "${pids[@]}"; do
  wait "$pid" || failed=1
done
[ "$failed" -eq 0 ] || { echo "error: some runs failed; see runs/mujoco_*.log" >&2; exit 1; }

mkdir -p "$out"
all_runs=()
for task in "${tasks[@]}"; do
  runs=()
  read -ra listed <<< "$seeds"
  batch="mujoco_${task}__seeds${listed[0]}-${listed[-1]}"  # sweep.sh --one_process's run of several seeds
  for seed in "${listed[@]}"; do
    if [ "$one_process" = 1 ] && [ "${#listed[@]}" -gt 1 ]; then
      runs+=("runs/$batch/${batch}__seed${seed}")
    else
      runs+=("runs/mujoco_${task}__seed${seed}")
    fi
  done
  all_runs+=("${runs[@]}")
  "$python" "$repo/scripts/plot.py" "${runs[@]}" --metrics eval/return --out "$out/$task" >/dev/null
done
{
  way="$jobs seed(s) at a time each"
  [ "$one_process" = 1 ] && way="each task's seeds in one process (--num_seeds)"
  echo "ppo.py on MuJoCo v5, $(date -u +%Y-%m-%d), $(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), the tasks side by side, $way"
  echo "seeds: $seeds; command: TASKS=\"${tasks[*]}\" ONE_PROCESS=$one_process bash benchmarks/mujoco.sh $steps \"$seeds\" $jobs, i.e. ppo.py ${common[*]} --total_timesteps $steps --env_id <task> and"
  for task in "${tasks[@]}"; do
    echo "- $task: $(settings_of "$task")"
  done
  echo "eval/return: the mean return of 4 episodes of the deterministic policy at the last evaluation"
  echo "peers at 1M steps (HalfCheetah, Hopper, Walker2d): CleanRL's ppo_continuous_action.py (v4) 1442.64 ± 46.03, 2382.86 ± 271.74, 2287.95 ± 571.78; rl-baselines3-zoo's tuned PPO (v3, one run each) 5819, 2410, 3479, and Ant 1327"
  echo
  "$python" "$repo/scripts/summarize.py" "${all_runs[@]}" --metrics eval/return charts/SPS --by_run --iqm
} > "$out/table.md"
cat "$out/table.md"
