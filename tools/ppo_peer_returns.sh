#!/usr/bin/env bash
# The PyTorch PPO peer's returns at troupe's APPO frames: bench/peers/torch_ppo.py
# `learn` on each task and seed with the hyperparameters of
# configs/appo_TASK_state.textproto (batch, unroll, epochs, minibatches,
# learning rate annealed to 0, reward scale, action repeat, clip, discount,
# the exploration's floor where the config sets one, the mean bounded to
# +-5), evaluated as troupe's evaluator does (5 episodes
# of the mean action every 250k frames).
#
# usage: tools/ppo_peer_returns.sh [--lane I/N] [--frames F] [TASK.SEED ...]
#   default runs: cartpole.swingup, walker.walk and cheetah.run, seeds 0-2.
#   --lane I/N runs every N-th of them from the I-th (0-based), so N shells
#   share the list; each run prints its evaluations as they come.
#
# Resumable: a finished run is kept in docs/results/ppo_peer/TASK/seedS.txt
# and skipped next time; a run in progress writes runs/ppo_peer/TASK/seedS.log
# and starts again from the beginning if it was killed (the peer keeps no
# checkpoint). Runs at nice 19, so builds and tests go first; started in a
# session of its own (`setsid tools/ppo_peer_returns.sh ...`) it lowers that
# session's autogroup too, without which Linux's autogroup scheduling shares
# the CPU between sessions whatever their nice values.
set -euo pipefail
cd "$(dirname "$0")/.."
if [[ "$(ps -o sid= -p $$ | tr -d ' ')" == "$$" && -w /proc/self/autogroup ]]; then
  echo 19 >/proc/self/autogroup || true
fi

lane=0 lanes=1 frames=3000000 runs=()
while (($#)); do
  case "$1" in
    --lane) IFS=/ read -r lane lanes <<<"$2"; shift 2 ;;
    --frames) frames="$2"; shift 2 ;;
    -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
    -*) echo "ppo_peer_returns.sh: unknown option $1" >&2; exit 2 ;;
    *) runs+=("$1"); shift ;;
  esac
done
if ! [[ "$lane" =~ ^[0-9]+$ && "$lanes" =~ ^[1-9][0-9]*$ ]] || ((lane >= lanes)); then
  echo "ppo_peer_returns.sh: --lane I/N needs 0 <= I < N, got '$lane/$lanes'" >&2; exit 2
fi
if ! [[ "$frames" =~ ^[1-9][0-9]*$ ]]; then
  echo "ppo_peer_returns.sh: --frames needs a positive integer, got '$frames'" >&2; exit 2
fi
if ((${#runs[@]} == 0)); then
  for task in cartpole.swingup walker.walk cheetah.run; do
    for seed in 0 1 2; do runs+=("$task.$seed"); done
  done
fi
python=build/release/peers-venv/bin/python
if [[ ! -x "$python" ]]; then
  echo "ppo_peer_returns.sh: no $python; \`build/release/cli/troupe bench appo\` makes it (torch, dm_control)" >&2
  exit 1
fi

# One setting of a config, by name (the first `NAME: VALUE` in the file).
setting() { sed -n "s/^ *$2: *\([^ #]*\).*/\1/p" "$1" | head -1; }

for ((i = lane; i < ${#runs[@]}; i += lanes)); do
  run="${runs[i]}" task="${runs[i]%.*}" seed="${runs[i]##*.}"
  domain="${task%%.*}" name="${task#*.}"
  config="configs/appo_${domain}_${name}_state.textproto"
  if [[ ! -f "$config" || ! "$seed" =~ ^[0-9]+$ ]]; then
    echo "ppo_peer_returns.sh: '$run' is not TASK.SEED with a $config" >&2; exit 2
  fi
  kept="docs/results/ppo_peer/$task/seed$seed.txt" log="runs/ppo_peer/$task/seed$seed.log"
  if [[ -f "$kept" ]]; then echo "$run: kept in $kept"; continue; fi
  mkdir -p "$(dirname "$kept")" "$(dirname "$log")"
  args=(batch="$(setting "$config" batch_size)" unroll="$(setting "$config" unroll_length)"
        epochs="$(setting "$config" epochs)" minibatches="$(setting "$config" minibatches)"
        lr="$(setting "$config" learning_rate)" gamma="$(setting "$config" discount)"
        clip="$(setting "$config" clip)" reward_scale="$(setting "$config" reward_scale)"
        anneal=1 mean_bound=5 eval_every=250000 eval_episodes=5 seed="$seed")
  floor="$(setting "$config" min_log_std)"
  [[ -n "$floor" ]] && args+=(min_log_std="$floor")
  repeat="$(setting "$config" action_repeat)"
  echo "$run: torch_ppo.py 1 $domain $name $repeat learn $frames ${args[*]}"
  {
    echo "# bench/peers/torch_ppo.py 1 $domain $name $repeat learn $frames ${args[*]}"
    echo "# at $(git rev-parse --short=12 HEAD), $(date -u +%FT%TZ), $(nproc) cores"
  } >"$log"
  nice -n 19 "$python" bench/peers/torch_ppo.py 1 "$domain" "$name" "$repeat" learn "$frames" "${args[@]}" \
    | tee -a "$log" | sed -u "s/^/$run: /"
  mv "$log" "$kept"
done
