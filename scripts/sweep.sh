#!/usr/bin/env bash
# Run a trainer over seeds and flag values: every combination, N at a time, each its own run directory.
#
#   scripts/sweep.sh --seeds "1 2 3" cartpole -- python ppo.py --env_id=CartPole-v1 --num_envs=8 --num_steps=128
#   scripts/sweep.sh --seeds "1 2" --vary "--learning_rate=1e-4 --learning_rate=3e-4" \
#       --vary "--num_envs=1 --num_envs=4" --jobs 2 lr_envs \
#       -- python ppo.py --env_id=Hopper-v5 --num_steps=2048 --no_capture_video  # pip install mujoco
#
#   scripts/sweep.sh --seeds "1 2 3 4 5" --one_process mujoco -- python ppo.py --env_id=Hopper-v5 ...  # ppo.py only
#
# Each run is named NAME[__flag=value...]__seed{S} and writes runs/<that name>, its output in runs/<that name>.log.
# --one_process trains the seeds of each combination in one process (the trainer's --num_seeds; seeds consecutive,
# F to L): runs/NAME[__flag=value...]__seedsF-L holds each seed's run, NAME[__flag=value...]__seedsF-L__seed{S}
# (summarize.py and plot.py take runs/NAME[__flag=value...]__seedsF-L as those seeds' runs).
# A run whose final checkpoint exists is skipped; one that was interrupted is resumed (--resume). Run it again after
# a crash or a reboot and it finishes what is missing (a run killed before its first checkpoint starts again). At the
# end it prints the commands of the table and the curves, python scripts/summarize.py runs/NAME__*/ and
# python scripts/plot.py runs/NAME__*/ --out plots/NAME (the run directories, not their .log files), which group the
# seeds of each combination.
set -euo pipefail

usage() {
  echo "usage: $0 [--seeds \"1 2 3\"] [--vary \"--flag=a --flag=b\"]... [--jobs N] [--one_process]" \
    "NAME -- COMMAND..." >&2
  exit 2
}

seeds="1 2 3"
jobs=1
one_process=0
varies=()
while [ $# -gt 0 ]; do
  case "$1" in
    --seeds) [ $# -ge 2 ] || usage; seeds="$2"; shift 2 ;;
    --vary) [ $# -ge 2 ] || usage; varies+=("$2"); shift 2 ;;
    --jobs) [ $# -ge 2 ] || usage; jobs="$2"; shift 2 ;;
    --one_process) one_process=1; shift ;;
    --) usage ;;
    -*) echo "error: unknown option $1" >&2; usage ;;
    *) break ;;
  esac
done
[ $# -ge 3 ] && [ "$2" = "--" ] || usage
name="$1"; shift 2
command=("$@")
[[ "$jobs" =~ ^[1-9][0-9]*$ ]] || { echo "error: --jobs must be a positive integer, not $jobs" >&2; exit 2; }
for value in "${varies[@]}"; do
  for flag in $value; do
    [[ "$flag" == --*=* ]] || { echo "error: --vary takes --flag=value words, not $flag" >&2; exit 2; }
  done
done

# Every combination of one value from each --vary, as lines of space-separated --flag=value words.
combinations=("")
for value in "${varies[@]}"; do
  extended=()
  for combination in "${combinations[@]}"; do
    for flag in $value; do
      extended+=("${combination:+$combination }$flag")
    done
  done
  combinations=("${extended[@]}")
done

batches=("$seeds")  # the seeds of each process
if [ "$one_process" = 1 ]; then
  read -ra listed <<< "$seeds"
  for i in "${!listed[@]}"; do
    if [ "${listed[$i]}" != $(( listed[0] + i )) ]; then
      echo "error: --one_process needs consecutive seeds, not $seeds" >&2
      exit 2
    fi
  done
else
  read -ra batches <<< "$seeds"
fi

mkdir -p runs
failed=0
running=0
for combination in "${combinations[@]}"; do
  for batch in "${batches[@]}"; do
    read -ra batch_seeds <<< "$batch"
    suffix=""
    for flag in $combination; do
      suffix+="__${flag#--}"
    done
    run="${name}${suffix//\//-}"
    seed_flags=(--seed "${batch_seeds[0]}")
    if [ "${#batch_seeds[@]}" -gt 1 ]; then  # --one_process: the seeds' range names the run
      seed_flags+=(--num_seeds "${#batch_seeds[@]}")
      run+="__seeds${batch_seeds[0]}-${batch_seeds[-1]}"
    else
      run+="__seed${batch_seeds[0]}"
    fi
    if [ -f "runs/$run/final_ckpt.pt" ]; then
      echo "done already: runs/$run"
      continue
    fi
    if [ "$running" -ge "$jobs" ]; then
      wait -n || failed=$((failed + 1))
      running=$((running - 1))
    fi
    # shellcheck disable=SC2206  # the words of a combination are flags
    argv=("${command[@]}" $combination "${seed_flags[@]}" --exp_name "$run")
    if compgen -G "runs/$run/*.pt" >/dev/null; then
      echo "resuming: runs/$run"
      argv+=(--resume "runs/$run")
    else
      echo "starting: runs/$run"
    fi
    "${argv[@]}" >"runs/$run.log" 2>&1 </dev/null &
    running=$((running + 1))
  done
done
while [ "$running" -gt 0 ]; do
  wait -n || failed=$((failed + 1))
  running=$((running - 1))
done
if [ "$failed" -gt 0 ]; then
  echo "error: $failed run(s) failed; see runs/${name}*.log" >&2
  exit 1
fi
# the python that trained, where the command names one, has the scripts' packages too
python="${command[0]}"
[[ "$(basename "$python")" == python* ]] || python=python
scripts="$(dirname "$0")"
printf 'table:  %q %q runs/%q__*/\n' "$python" "$scripts/summarize.py" "$name"
printf 'curves: %q %q runs/%q__*/ --out plots/%q\n' "$python" "$scripts/plot.py" "$name" "$name"
