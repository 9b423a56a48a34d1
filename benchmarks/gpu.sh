#!/usr/bin/env bash
# The GPU acceptance run: what the CPU-only suite cannot reach, in one command on a machine with CUDA.
#   bash benchmarks/gpu.sh [MINUTES] [PATH/TO/ManiSkill/examples/baselines/ppo/ppo.py]
# Its set-up check first (benchmarks/gpu_simulation.py): ManiSkill's GPU simulation needs PhysX's GPU library in
# ~/.sapien/physx/VERSION/, which SAPIEN downloads from GitHub at the first GPU simulation. Where it is missing (a
# machine without network) one line says so and the parts that need it are left out: nothing waits on that download.
# The parts, one after the other, each stopped with SIGTERM (a trainer saves a checkpoint) at its share of MINUTES
# (default 10, of which the report takes the last 20 s): the seconds it wants, scaled to fit MINUTES. Without the GPU
# simulation they want about 10 minutes; with it about 17 (a note says how much each part got).
# (a) pytest -m gpu (tests/test_gpu.py; its tests of the GPU simulation skip where the library is missing);
# (b) each trainer's learner on CUDA, then ppo_eval.py on its run and --export of its policy: with the GPU
#     simulation, ManiSkill's baseline commands (ppo.py, ppo_rnn.py and ppo_rgb.py's camera on PushCube-v1, ippo.py
#     on TwoRobotPickCube-v1), besides ppo.py on PickCube-v1, PushCube-v1 with 4 seeds in one simulation
#     (--num_seeds) and, given its path, ManiSkill's own ppo.py; without it, Gymnasium tasks (Pendulum-v1,
#     CartPole-v1, the tests' PointMassPixels-v0) and ippo.py on ManiSkill's CPU workers;
# (c) torchrun with one process on the GPU; ppo.py on PushCube-v1 with ManiSkill's CPU workers, as many as the
#     machine's cores, beside its learner on CUDA;
# (d) the CUDA benchmarks: torch_env_speed.py (the torch-native path at 1,024-16,384 envs, eager and compiled),
#     rnn_replay.py (in stretches and packed), seeds_update.py at 1-64 seeds (seeds_update.py --device=cuda), and
#     ppo.py --num_seeds 8 against one seed on CartPole-v1 (and as a population, --pbt_interval) and on its torch
#     version.
# The runs go to ./runs/gpu_* (refused where an earlier run left some); the results to
# benchmarks/results/gpu/DATE/ (OUT=... elsewhere): table.md (the set-up check; each part's time, exit and last
# line; the runs' final SPS, evaluation and wall time; ppo_eval.py's evaluations; the benchmarks' tables), each
# part's output in logs/, gpu.txt and PNG curves. Without CUDA it says so and exits 0. PLAN=1 runs the set-up check
# and prints the parts, each with its seconds, as they would run here, and runs nothing; REPORT_ONLY=1 writes
# table.md and the curves from what there is.
set -uo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-$repo/.venv/bin/python}
minutes=${1:-10}
maniskill_ppo=${2:-}
out=${OUT:-$repo/benchmarks/results/gpu/$(date +%F)}
report_seconds=20

report() {
  mkdir -p "$out"
  shopt -s nullglob
  local events=(runs/gpu_*/events.out.tfevents.* runs/gpu_*/*__seed*/events.out.tfevents.*) runs=() file
  shopt -u nullglob
  for file in "${events[@]}"; do  # a --num_seeds run's seeds, not the directory of the run that holds them
    compgen -G "${file%/*}/*__seed*/" > /dev/null || runs+=("${file%/*}")
  done
  [ ${#runs[@]} -gt 0 ] && mapfile -t runs < <(printf '%s\n' "${runs[@]}" | sort -u)  # a resumed run has several
  {
    echo "# benchmarks/gpu.sh, $(date +%F)"
    echo
    [ -f "$out/gpu.txt" ] && echo "GPU: $(cat "$out/gpu.txt")" && echo
    [ -f "$out/setup_check.txt" ] && cat "$out/setup_check.txt" && echo
    if [ -f "$out/parts.md" ]; then
      echo "| part | seconds allotted | seconds taken | exit (124: stopped at its time) | its output's last line |"
      echo "|---|---:|---:|---:|---|"
      cat "$out/parts.md"
      echo
    fi
    if [ ${#runs[@]} -gt 0 ]; then
      echo "The runs (a --num_seeds run's n seeds in one row: SPS is a seed's, the run steps n times as many):"
      echo
      "$PYTHON" "$repo/scripts/summarize.py" "${runs[@]}" --group '^(.*?)(?:__seed\d+)?$' \
        --metrics charts/SPS eval/return eval/success_once
      echo
    fi
    for file in "$out"/logs/eval_*.log; do
      [ -f "$file" ] || continue
      printf 'ppo_eval.py, %s:\n\n```\n%s\n```\n\n' "$(basename "$file" .log)" "$(cat "$file")"
    done
    [ -f "$out/logs/rnn_replay.log" ] && cat "$out/logs/rnn_replay.log" && tail -n 1 "$out/logs/rnn_replay_packed.log"
    [ -f "$out/logs/seeds_update.log" ] && echo && cat "$out/logs/seeds_update.log"
    # its rows, not the compiler's warnings that share its log
    [ -f "$out/logs/torch_env_speed.log" ] && echo && grep -E '^(\||tests\.envs)' "$out/logs/torch_env_speed.log"
  } > "$out/table.md"
  if [ ${#runs[@]} -gt 0 ]; then
    "$PYTHON" "$repo/scripts/plot.py" "${runs[@]}" --group '^(.*?)(?:__seed\d+)?$' --metrics eval/return --out "$out"
  fi
}
if [ "${REPORT_ONLY:-0}" = 1 ]; then
  report
  exit
fi
plan=${PLAN:-0}
if [ "$plan" != 1 ]; then
  if compgen -G 'runs/gpu_*' > /dev/null; then  # the trainers refuse a run directory that exists
    echo "error: runs/gpu_* are here from an earlier benchmarks/gpu.sh (its report: REPORT_ONLY=1); move them away" >&2
    exit 1
  fi
  if ! "$PYTHON" -c 'import sys, torch; sys.exit(not torch.cuda.is_available())'; then
    echo "no GPU here (torch.cuda.is_available() is False): benchmarks/gpu.sh measures on a machine with CUDA"
    exit 0
  fi
fi

if why=$("$PYTHON" "$repo/benchmarks/gpu_simulation.py"); then
  simulation=1
  check="ManiSkill's GPU simulation can start: PhysX's GPU library is in place"
else
  simulation=0
  check="ManiSkill's GPU simulation cannot start: $why: running what needs no GPU simulation"
fi
echo "$check"

names=() wanted_seconds=() commands=()
part() {  # NAME SECONDS COMMAND...: the seconds it wants, before they are scaled to fit the budget
  names+=("$1")
  wanted_seconds+=("$2")
  shift 2
  commands+=("$(printf '%q ' "$@")")
}
learner() {  # NAME SECONDS EVAL_SECONDS COMMAND...: a training run in runs/gpu_NAME, then ppo_eval.py on it and
  # its export, EVAL_SECONDS each (ManiSkill's take longer: its envs start in seconds)
  local name=$1 seconds=$2 eval_seconds=$3
  shift 3
  part "$name" "$seconds" "$@" --exp_name="gpu_$name"
  part "eval_$name" "$eval_seconds" "$PYTHON" "$repo/ppo_eval.py" "runs/gpu_$name" --num_episodes=4
  part "export_$name" "$eval_seconds" "$PYTHON" "$repo/ppo_eval.py" "runs/gpu_$name" \
    --export="runs/gpu_$name/policy.pt2"
}
# the cores this process may use (nproc alone gives OMP_NUM_THREADS where it is set, as the tests set it)
cores=$(env -u OMP_NUM_THREADS -u OMP_THREAD_LIMIT nproc)
parallel=()  # the GPU tests side by side where pytest-xdist is installed: a GPU machine has the cores
"$PYTHON" -c 'import xdist' 2>/dev/null && parallel=(-n 8)
small=(--num_envs=8 --num_steps=64 --num_minibatches=4 --total_timesteps=20480 --eval_freq=10 --num_eval_envs=4
       --no_capture_video)  # a few seconds of learning on CUDA, 40 iterations
workers=(--sim_backend=cpu --num_envs="$cores" --num_eval_envs=2 --num_steps=64 --num_minibatches=4
         --no_capture_video)

part pytest_gpu $((simulation ? 200 : 90)) "$PYTHON" -m pytest -m gpu -q -rs "${parallel[@]}" \
  "$repo/tests/test_gpu.py"
if [ "$simulation" = 1 ]; then
  pushcube=(--env_id=PushCube-v1 --num_envs=2048 --update_epochs=8 --num_minibatches=32 --total_timesteps=2_000_000
            --eval_freq=10 --num_steps=20)
  learner ppo_PushCube 60 25 "$PYTHON" "$repo/ppo.py" "${pushcube[@]}"
  learner ppo_rnn_PushCube 45 25 "$PYTHON" "$repo/ppo_rnn.py" "${pushcube[@]}"
  learner ppo_rgb_PushCube 70 25 "$PYTHON" "$repo/ppo_rgb.py" --env_id=PushCube-v1 --num_envs=256 --update_epochs=8 \
    --num_minibatches=8 --total_timesteps=1_000_000 --eval_freq=10 --num_steps=20
  learner ippo_TwoRobotPickCube 60 25 "$PYTHON" "$repo/ippo.py" --env_id=TwoRobotPickCube-v1
  part ppo_PickCube 60 "$PYTHON" "$repo/ppo.py" --env_id=PickCube-v1 --num_envs=1024 --update_epochs=8 \
    --num_minibatches=32 --total_timesteps=10_000_000 --exp_name=gpu_ppo_PickCube
  # 4 seeds of PushCube in one simulation of 4 x 512 envs, beside the 2048 envs of one seed above
  part ppo_PushCube_seeds4 40 "$PYTHON" "$repo/ppo.py" "${pushcube[@]}" --num_envs=512 --num_seeds=4 \
    --total_timesteps=500_000 --exp_name=gpu_ppo_PushCube_seeds4
  if [ -n "$maniskill_ppo" ]; then
    part maniskill_ppo_PushCube 60 "$PYTHON" "$maniskill_ppo" "${pushcube[@]}" --exp-name=gpu_maniskill_ppo_PushCube
  fi
else
  learner ppo_Pendulum 20 12 "$PYTHON" "$repo/ppo.py" --env_id=Pendulum-v1 "${small[@]}"
  learner ppo_rnn_CartPole 30 12 "$PYTHON" "$repo/ppo_rnn.py" --env_id=CartPole-v1 "${small[@]}"
  learner ppo_rgb_PointMassPixels 20 12 "$PYTHON" "$repo/ppo_rgb.py" --env_id=tests.envs:PointMassPixels-v0 \
    "${small[@]}"
  learner ippo_TwoRobotPickCube 40 25 "$PYTHON" "$repo/ippo.py" --env_id=TwoRobotPickCube-v1 "${workers[@]}" \
    --total_timesteps=$((cores * 64 * 4)) --eval_freq=4
fi
part torchrun_ppo_Pendulum 20 "$PYTHON" -m torch.distributed.run --standalone --nproc_per_node=1 "$repo/ppo.py" \
  --env_id=Pendulum-v1 "${small[@]}" --exp_name=gpu_torchrun_ppo_Pendulum
part ppo_PushCube_cpu_workers 35 "$PYTHON" "$repo/ppo.py" --env_id=PushCube-v1 "${workers[@]}" --update_epochs=4 \
  --total_timesteps=$((cores * 64 * 10)) --eval_freq=10 --exp_name=gpu_ppo_PushCube_cpu_workers
# benchmarks/seeds_speed.py's CartPole-v1 settings; evaluated once, at the end
cartpole=(--env_id=CartPole-v1 --num_envs=4 --num_steps=128 --num_minibatches=4 --update_epochs=4 --gamma=0.99
          --gae_lambda=0.95 --learning_rate=2e-3 --total_timesteps=20480 --eval_freq=1000 --num_eval_envs=1
          --no_capture_video)
part ppo_CartPole 15 "$PYTHON" "$repo/ppo.py" "${cartpole[@]}" --exp_name=gpu_ppo_CartPole
part ppo_CartPole_seeds8 20 "$PYTHON" "$repo/ppo.py" "${cartpole[@]}" --num_seeds=8 --exp_name=gpu_ppo_CartPole_seeds8
# the same 8 seeds as a population ranked every 2 iterations (docs/pbt.md): its cost on CUDA, where a ranking syncs
part ppo_CartPole_pbt8 20 "$PYTHON" "$repo/ppo.py" "${cartpole[@]}" --num_seeds=8 --pbt_interval=2 \
  --pbt_space learning_rate=1e-4:1e-2:log ent_coef=0:0.02 --exp_name=gpu_ppo_CartPole_pbt8
# the torch-native path (issue 49): CartPole-v1's torch version on the GPU, an iteration's shares and host syncs at
# 1,024-16,384 envs, eager and compiled; end to end, one seed of 512 envs against 8 seeds of 512 in one batch
part torch_env_speed 60 "$PYTHON" "$repo/benchmarks/torch_env_speed.py" --device=cuda --num_envs 1024 4096 16384 \
  --compile=both
cartpole_torch=(--env_id=tests.envs:CartPoleTorch-v1 --num_envs=512 --num_steps=50 --num_minibatches=32
                --total_timesteps=1_024_000 --eval_freq=1000 --num_eval_envs=16 --no_capture_video)
part ppo_CartPoleTorch 15 "$PYTHON" "$repo/ppo.py" "${cartpole_torch[@]}" --exp_name=gpu_ppo_CartPoleTorch
part ppo_CartPoleTorch_seeds8 20 "$PYTHON" "$repo/ppo.py" "${cartpole_torch[@]}" --num_seeds=8 \
  --exp_name=gpu_ppo_CartPoleTorch_seeds8
part rnn_replay 8 "$PYTHON" "$repo/benchmarks/rnn_replay.py" --device=cuda
part rnn_replay_packed 8 "$PYTHON" "$repo/benchmarks/rnn_replay.py" --device=cuda --packed
part seeds_update 32 "$PYTHON" "$repo/benchmarks/seeds_update.py" --device=cuda --seeds 1 2 4 8 16 32 64 --steps=16

wanted=0
for seconds in "${wanted_seconds[@]}"; do wanted=$((wanted + seconds)); done
budget=$((minutes * 60 - report_seconds))
if [ "$wanted" -gt "$budget" ]; then
  scaled="note: the parts want $(((wanted + report_seconds + 59) / 60)) minutes; in $minutes each gets"
  scaled+=" $((100 * budget / wanted))% of its time"
  echo "$scaled"
  check+=$'\n\n'$scaled
fi
share() {  # part $1's seconds; at least one, as timeout's 0 means none
  local seconds=$((budget * wanted_seconds[$1] / wanted))
  echo $((seconds > 0 ? seconds : 1))
}
if [ "$plan" = 1 ]; then
  for i in "${!names[@]}"; do printf '%4d s  %-34s %s\n' "$(share "$i")" "${names[i]}" "${commands[i]}"; done
  exit 0
fi

mkdir -p "$out/logs" runs
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader > "$out/gpu.txt"
echo "$check" > "$out/setup_check.txt"
: > "$out/parts.md"
for i in "${!names[@]}"; do
  name=${names[i]}
  seconds=$(share "$i")
  start=$SECONDS
  echo "$(date +%T) $name (at most ${seconds}s): ${commands[i]}"
  eval "timeout --signal=TERM --kill-after=10 $seconds ${commands[i]}" > "$out/logs/$name.log" 2>&1
  status=$?
  echo "$(date +%T) $name: exit $status"
  # a progress bar redraws with carriage returns: its last drawing is what it ended at
  last=$(tr '\r' '\n' < "$out/logs/$name.log" | grep -v '^[[:space:]]*$' | tail -n 1 | cut -c 1-160)
  echo "| $name | $seconds | $((SECONDS - start)) | $status | ${last//|/\\|} |" >> "$out/parts.md"
done
report
cat "$out/table.md"
echo "results: $out"
