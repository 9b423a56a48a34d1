#!/usr/bin/env bash
# The recipes (recipes/, docs/recipes.md) against ppo.py where their papers make a claim on a task that runs on a
# CPU, each variant's seeds in one process (--num_seeds), the variants side by side: a markdown table per suite
# (each variant's interquartile mean with its 95% interval, and each seed's) and curves, in
# benchmarks/results/recipes/<suite>/.
#
#   bash benchmarks/recipes.sh mujoco         # ppo.py, RPO, SimBa and PPG on Hopper-v5 at CleanRL's settings
#   TASKS="Walker2d-v5 HalfCheetah-v5" bash benchmarks/recipes.sh mujoco
#   bash benchmarks/recipes.sh exploration    # ppo.py and RND on MountainCar-v0, a hard-exploration task
#   OUT=/tmp/check STEPS=4096 SEEDS="1 2" bash benchmarks/recipes.sh mujoco   # a quick check of the script
#
# Each recipe is applied to a fresh copy of today's ppo.py (runs/recipes/my_<recipe>.py of the working directory),
# whose run directories are runs/recipes_<suite>_<task>_<variant>__seedsF-L there; run the script again after an
# interruption and it finishes what is missing (scripts/sweep.sh). JOBS variants at a time (default: the machine's
# cores). Needs mujoco (the mujoco suite), rliable and matplotlib (requirements-dev.txt).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)

suite=${1:?usage: bash benchmarks/recipes.sh mujoco|exploration}
seeds=${SEEDS:-"1 2 3 4 5"}
jobs=${JOBS:-$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)}
python=${PYTHON:-$repo/.venv/bin/python}
out=${OUT:-$repo/benchmarks/results/recipes/$suite}
common=(--norm_obs --target_kl None --num_eval_envs 4 --no_capture_video)
case "$suite" in
  mujoco)  # CleanRL's ppo_continuous_action.py and rpo_continuous_action.py settings (benchmarks/mujoco.sh)
    steps=${STEPS:-1000000}
    read -ra tasks <<< "${TASKS:-Hopper-v5}"
    variants=(ppo rpo simba ppg)
    settings=(--num_envs 1 --norm_reward --hidden_sizes 64 64 --num_steps 2048 --num_minibatches 32 --update_epochs 10
              --gamma 0.99 --gae_lambda 0.95 --learning_rate 3e-4 --lr_schedule linear --ent_coef 0 --clip_vloss
              --max_grad_norm 0.5 --eval_freq 25) ;;
  exploration)  # a sparse reward: the car reaches the flag only by first driving away from it
    steps=${STEPS:-300000}
    read -ra tasks <<< "${TASKS:-MountainCar-v0}"
    variants=(ppo rnd)
    settings=(--num_envs 16 --num_steps 128 --num_minibatches 4 --update_epochs 4 --gamma 0.99 --gae_lambda 0.95
              --eval_freq 10) ;;
  *) echo "error: no suite $suite: mujoco or exploration" >&2; exit 2 ;;
esac

mkdir -p runs/recipes
for variant in "${variants[@]}"; do  # each recipe on a fresh copy of ppo.py, once, before any run starts
  if [ "$variant" != ppo ]; then
    rm -f "runs/recipes/my_$variant.py"
    "$python" "$repo/scripts/recipes.py" apply "$variant" "runs/recipes/my_$variant.py" >/dev/null
  fi
done
trainer_of() {
  if [ "$1" = ppo ]; then echo "$repo/ppo.py"; else echo "runs/recipes/my_$1.py"; fi
}

read -ra listed <<< "$seeds"
failed=0
for task in "${tasks[@]}"; do
  for variant in "${variants[@]}"; do
    while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
      wait -n || failed=1
    done
    "$repo/scripts/sweep.sh" --seeds "$seeds" --one_process "recipes_${suite}_${task}_${variant}" -- \
      "$python" "$(trainer_of "$variant")" "${common[@]}" "${settings[@]}" --total_timesteps "$steps" --env_id "$task" \
      > /dev/null &
  done
done
while [ "$(jobs -rp | wc -l)" -gt 0 ]; do
  wait -n || failed=1
done
[ "$failed" -eq 0 ] || { echo "error: some runs failed; see runs/recipes_${suite}_*.log" >&2; exit 1; }

mkdir -p "$out"
all_runs=()
for task in "${tasks[@]}"; do
  runs=()
  for variant in "${variants[@]}"; do
    runs+=("runs/recipes_${suite}_${task}_${variant}__seeds${listed[0]}-${listed[-1]}")
  done
  all_runs+=("${runs[@]}")
  "$python" "$repo/scripts/plot.py" "${runs[@]}" --metrics eval/return --out "$out/$task" >/dev/null
done
{
  cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
  cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)
  echo "ppo.py and its recipes, $(date -u +%Y-%m-%d), $cores cores ($cpu), $jobs variants at a time, each variant's" \
    "seeds in one process (--num_seeds)"
  echo "seeds: $seeds; command: TASKS=\"${tasks[*]}\" bash benchmarks/recipes.sh $suite (STEPS=$steps), i.e. for" \
    "each variant (${variants[*]}): python ppo.py or my_<recipe>.py ${common[*]} ${settings[*]} --total_timesteps" \
    "$steps --env_id <task>"
  echo "eval/return: the mean return of 4 episodes of the deterministic policy at the last evaluation"
  echo
  "$python" "$repo/scripts/summarize.py" "${all_runs[@]}" --metrics eval/return charts/SPS --by_run --iqm
  if [ "$suite" = exploration ]; then  # how soon each seed first reached the flag, which a final return hides
    echo
    "$python" - "${all_runs[@]}" <<'EOF'
import sys
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

print("| runs | reached the flag | the first evaluation's step above -200 (the time limit's return), by seed |")
print("|---|---:|---|")
for run in sys.argv[1:]:
    firsts = []
    for seed_run in sorted(Path(run).glob("*__seed*"), key=lambda path: int(path.name.rsplit("seed", 1)[1])):
        events = EventAccumulator(str(seed_run), size_guidance={"scalars": 0})
        events.Reload()
        firsts.append(next((e.step for e in events.Scalars("eval/return") if e.value > -200), None))
    print(f"| {Path(run).name} | {sum(first is not None for first in firsts)}/{len(firsts)} | "
          f"{', '.join('never' if first is None else f'{first:,}' for first in firsts)} |")
EOF
  fi
} > "$out/table.md"
cat "$out/table.md"
