#!/usr/bin/env bash
# Population-based training (--pbt_interval, docs/pbt.md) against fixed settings at equal compute: each arm 8 seeds
# in one process (--num_seeds 8) on seeds no tuning used (10-17), one arm after the other, so that each arm's wall
# time is its own. A markdown table per suite (each arm's IQM of the final evaluations with its 95% interval, its
# compute in steps and seconds; each arm's best seed by its last evaluation, evaluated afresh by ppo_eval.py) and
# curves, in benchmarks/results/pbt/<suite>/.
#
#   bash benchmarks/pbt.sh ant          # Ant-v5, 1M steps a member: the defaults (benchmarks/mujoco.sh's), tune.py's
#                                       # best (benchmarks/results/tune_Ant-v5), PBT over tune.py's space less what
#                                       # cannot vary per member
#   bash benchmarks/pbt.sh maniskill    # PushCube-v1 on ManiSkill's CPU simulation, one worker env a member
#   bash benchmarks/pbt.sh discrete     # Acrobot-v1 (Discrete actions)
#   OUT=/tmp/check STEPS=4096 INTERVAL=1 MEMBERS=4 bash benchmarks/pbt.sh discrete   # a quick check of the script
#
# Runs go to runs/pbt_<suite>_<arm> of the working directory; run the script again after an interruption and it
# resumes what is unfinished and skips what is done. Needs mujoco (ant), rliable and matplotlib (requirements-dev).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
suite=${1:?usage: bash benchmarks/pbt.sh ant|maniskill|discrete}
out=${OUT:-$repo/benchmarks/results/pbt/$suite}
seed=10 members=${MEMBERS:-8} episodes=${EPISODES:-20}
case "$suite" in
  ant)
    steps=${STEPS:-1000000} interval=${INTERVAL:-20}
    settings=(--env_id Ant-v5 --num_envs 1 --norm_obs --norm_reward --target_kl None --num_eval_envs 4
              --hidden_sizes 64 64 --num_steps 2048 --lr_schedule linear --ent_coef 0 --clip_vloss --max_grad_norm 0.5
              --eval_freq 20)
    defaults=(--num_minibatches 32 --update_epochs 10 --gamma 0.99 --gae_lambda 0.95 --learning_rate 3e-4
              --clip_coef 0.2 --log_std_init -0.5)
    # tune.py's best of 22 trials (benchmarks/results/tune_Ant-v5/results.md)
    tuned=(--num_minibatches 16 --update_epochs 6 --gamma 0.9871137863288217 --gae_lambda 0.9135012837904042
           --learning_rate 0.00041957679014421266 --clip_coef 0.22317036289152187 --log_std_init -1.3312187684960202)
    space=(learning_rate=1e-4:1e-3:log gamma=0.98:0.999 gae_lambda=0.9:0.99 clip_coef=0.1:0.3) ;;
  maniskill)
    steps=${STEPS:-100000} interval=${INTERVAL:-10}
    settings=(--env_id PushCube-v1 --sim_backend cpu --num_envs 1 --num_eval_envs 1 --num_steps 50
              --num_minibatches 2 --update_epochs 8 --lr_schedule linear --norm_obs --eval_freq 50
              --num_eval_steps 100 --no_capture_video)
    defaults=() tuned=()
    space=(learning_rate=1e-4:3e-3:log gamma=0.7:0.95 gae_lambda=0.8:0.99 clip_coef=0.1:0.3) ;;
  discrete)
    steps=${STEPS:-200000} interval=${INTERVAL:-10}
    settings=(--env_id Acrobot-v1 --num_envs 4 --num_steps 128 --num_minibatches 4 --update_epochs 4 --target_kl None
              --num_eval_envs 4 --eval_freq 20 --no_capture_video)
    defaults=(--gamma 0.99 --gae_lambda 0.95 --learning_rate 2.5e-4 --ent_coef 0.01 --clip_coef 0.2)
    tuned=()
    space=(learning_rate=1e-4:3e-3:log ent_coef=0:0.02 gamma=0.95:0.999 clip_coef=0.1:0.3) ;;
  *) echo "error: no suite $suite: ant, maniskill or discrete" >&2; exit 2 ;;
esac
arms=(defaults pbt)
[ ${#tuned[@]} -gt 0 ] && arms=(defaults tuned pbt)
common=(--total_timesteps "$steps" --seed "$seed" --num_seeds "$members" --no_capture_video)
mkdir -p "$out" runs
: > "$out/seconds.txt"
for arm in "${arms[@]}"; do
  name=pbt_${suite}_$arm
  case "$arm" in
    defaults) flags=("${defaults[@]}") ;;
    tuned) flags=("${tuned[@]}") ;;
    pbt) flags=("${defaults[@]}" --pbt_interval "$interval" --pbt_start space --pbt_space "${space[@]}") ;;
  esac
  start=$SECONDS
  if [ -f "runs/$name/final_ckpt.pt" ]; then
    echo "$arm: done before (runs/$name)"
  elif compgen -G "runs/$name/ckpt_*.pt" > /dev/null; then
    "$python" "$repo/ppo.py" --resume "runs/$name" > "runs/$name.log" 2>&1
  else
    "$python" "$repo/ppo.py" "${settings[@]}" "${flags[@]}" "${common[@]}" --exp_name "$name" > "runs/$name.log" 2>&1
  fi
  echo "$arm: $((SECONDS - start)) s" >> "$out/seconds.txt"
done

{
  echo "# PBT against fixed settings: $suite, $members seeds an arm in one process"
  echo "# (seeds $seed-$((seed + members - 1))), $steps steps a member; each run's flags: its TensorBoard text"
  echo
  runs=()
  for arm in "${arms[@]}"; do runs+=("runs/pbt_${suite}_$arm"); done
  "$python" "$repo/scripts/summarize.py" "${runs[@]}" --metrics eval/return eval/success_once --iqm
  echo
  echo "Each arm's wall time, the arms one after the other (about 0 s: done in an earlier run of the script):"
  echo
  cat "$out/seconds.txt"
  echo
  echo "Each arm's best seed by its last evaluation in training, evaluated afresh by ppo_eval.py"
  echo "($episodes episodes, seed 1000):"
  echo
  for arm in "${arms[@]}"; do
    best=$("$python" - "runs/pbt_${suite}_$arm" <<'PY'
import sys
from pathlib import Path
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
finals = {}
for seed_dir in sorted(Path(sys.argv[1]).glob("*__seed*")):
    events = EventAccumulator(str(seed_dir), size_guidance={"scalars": 0})
    events.Reload()
    if "eval/return" in events.Tags()["scalars"]:
        finals[seed_dir] = events.Scalars("eval/return")[-1].value
print(max(finals, key=finals.get))
PY
)
    echo "$arm: $best"
    echo '```'
    "$python" "$repo/ppo_eval.py" "$best" --num_episodes "$episodes" --seed 1000 2>/dev/null | tail -n 4
    echo '```'
  done
} > "$out/table.md"
"$python" "$repo/scripts/plot.py" "${runs[@]}" --metrics eval/return --iqm --out "$out" > /dev/null
"$python" "$repo/scripts/plot.py" "runs/pbt_${suite}_pbt" --lineage --out "$out" > /dev/null
cp "runs/pbt_${suite}_pbt/lineage.csv" "$out/"
echo "$out/table.md"
