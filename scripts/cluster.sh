#!/usr/bin/env bash
# A local cluster: N `tandem serve` replicas on loopback behind vllm-router.
#
#   scripts/cluster.sh -m MODEL [--replicas N] [--policy POLICY] [--port PORT] [-- SERVE ARGS...]
#   scripts/cluster.sh -m MODEL --prefill P --decode D [--port PORT] [-- SERVE ARGS...]
#
# With --prefill and --decode: P prefill instances and D decode instances
# (`tandem serve --role`) behind vllm-router's prefill/decode mode
# (docs/scale-out.md, "Roles").
# POLICY is vllm-router's: cache_aware (default), kv_aware (the replicas
# publish KV events and the router follows them), round_robin, power_of_two,
# random, consistent_hash. Prints `router: http://127.0.0.1:PORT` once every
# replica and the router answer, then runs until interrupted (Ctrl-C, SIGTERM)
# and stops everything it started. Logs go to a temporary folder it names.
set -euo pipefail
cd "$(dirname "$0")/.."

model="" replicas=3 policy=cache_aware port=0 n_prefill=0 n_decode=0
serve_args=()
usage() { sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while (($#)); do
  case "$1" in
    -m|--model) model="${2:?}"; shift 2 ;;
    -n|--replicas) replicas="${2:?}"; shift 2 ;;
    --policy) policy="${2:?}"; shift 2 ;;
    --port) port="${2:?}"; shift 2 ;;
    --prefill) n_prefill="${2:?}"; shift 2 ;;
    --decode) n_decode="${2:?}"; shift 2 ;;
    --) shift; serve_args=("$@"); break ;;
    -h|--help) usage ;;
    *) echo "cluster.sh: unknown argument '$1'" >&2; usage ;;
  esac
done
[[ -n "$model" ]] || { echo "cluster.sh: -m MODEL is required" >&2; usage; }
[[ -f "$model" ]] || { echo "cluster.sh: $model: no such file" >&2; exit 2; }
[[ "$replicas" =~ ^[1-9][0-9]*$ ]] || { echo "cluster.sh: --replicas must be a positive number" >&2; exit 2; }
[[ "$n_prefill" =~ ^[0-9]+$ && "$n_decode" =~ ^[0-9]+$ ]] || { echo "cluster.sh: --prefill and --decode take counts" >&2; exit 2; }
if ((n_prefill || n_decode)); then
  ((n_prefill && n_decode)) || { echo "cluster.sh: --prefill and --decode go together" >&2; exit 2; }
  [[ "$policy" != kv_aware ]] || { echo "cluster.sh: kv_aware is for replicas, not --prefill/--decode" >&2; exit 2; }
fi

tandem="${TANDEM_CLI:-build/tandem}"
router="${VLLM_ROUTER:-.venv/bin/vllm-router}"
[[ -x "$tandem" ]] || { echo "cluster.sh: $tandem not found: run scripts/setup.sh (or set TANDEM_CLI)" >&2; exit 2; }
[[ -x "$router" ]] || { echo "cluster.sh: $router not found: run scripts/setup.sh (or set VLLM_ROUTER)" >&2; exit 2; }

logs="$(mktemp -d -t tandem-cluster-XXXXXX)"
pids=()
stop_all() {
  trap - INT TERM EXIT
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for _ in $(seq 100); do
    alive=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
    ((alive)) || break
    sleep 0.1
  done
  for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  echo "cluster: stopped (logs in $logs)" >&2
}
trap 'stop_all; exit 0' INT TERM
trap stop_all EXIT

free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# Waits until `pattern` shows in `file` (or the process dies); prints the match.
wait_for() {
  local file="$1" pattern="$2" pid="$3" what="$4"
  for _ in $(seq 1200); do
    if grep -qE "$pattern" "$file" 2>/dev/null; then grep -oE "$pattern" "$file" | head -1; return 0; fi
    kill -0 "$pid" 2>/dev/null || { echo "cluster.sh: $what exited:" >&2; cat "$file" >&2; return 1; }
    sleep 0.1
  done
  echo "cluster.sh: $what did not start in 120 s (log: $file)" >&2
  return 1
}

urls=() sources=() roles=()
if ((n_prefill)); then
  for i in $(seq 1 "$n_prefill"); do roles+=(prefill); done
  for i in $(seq 1 "$n_decode"); do roles+=(decode); done
  replicas=${#roles[@]}
fi
pd_args=()
for i in $(seq 1 "$replicas"); do
  events=() role=()
  [[ "$policy" == kv_aware ]] && events=(--kv-events 'tcp://127.0.0.1:*')
  ((n_prefill)) && role=(--role "${roles[$((i - 1))]}")
  "$tandem" serve -m "$model" --host 127.0.0.1 --port 0 "${role[@]}" "${events[@]}" "${serve_args[@]}" \
    >"$logs/replica$i.log" 2>&1 &
  pid=$!
  pids+=("$pid")
  line="$(wait_for "$logs/replica$i.log" 'on http://127\.0\.0\.1:[0-9]+' "$pid" "replica $i")"
  url="http://127.0.0.1:${line##*:}"
  urls+=("$url")
  ((n_prefill)) && pd_args+=("--${roles[$((i - 1))]}" "$url")
  if [[ "$policy" == kv_aware ]]; then
    ep="$(wait_for "$logs/replica$i.log" 'KV events on tcp://[0-9.:]+' "$pid" "replica $i")"
    sources+=(--kv-event-source "$url=${ep##* }")
  fi
  echo "cluster: replica $i at $url" >&2
done

((port)) || port="$(free_port)"
if ((n_prefill)); then
  workers=(--vllm-pd-disaggregation "${pd_args[@]}")
else
  workers=(--worker-urls "${urls[@]}" --policy "$policy")
fi
router_args=(--host 127.0.0.1 --port "$port" "${workers[@]}"
  --prometheus-port "$(free_port)" --health-check-interval-secs 2 --health-failure-threshold 1
  --health-success-threshold 1 --log-level warning)
if [[ "$policy" == kv_aware ]]; then
  router_args+=("${sources[@]}" --kv-event-model "$(basename "$model")")
fi
"$router" "${router_args[@]}" >"$logs/router.log" 2>&1 &
pids+=($!)
router_pid=$!
for _ in $(seq 600); do
  curl -fs "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
  kill -0 "$router_pid" 2>/dev/null || { echo "cluster.sh: vllm-router exited:" >&2; cat "$logs/router.log" >&2; exit 1; }
  sleep 0.1
done
curl -fs "http://127.0.0.1:$port/health" >/dev/null || { echo "cluster.sh: vllm-router did not answer" >&2; exit 1; }

echo "router: http://127.0.0.1:$port"
if ((n_prefill)); then
  echo "cluster: $n_prefill prefill and $n_decode decode instances, logs in $logs; Ctrl-C stops everything" >&2
else
  echo "cluster: $replicas replicas, policy $policy, logs in $logs; Ctrl-C stops everything" >&2
fi
wait "$router_pid" || true
echo "cluster.sh: vllm-router exited:" >&2
tail -20 "$logs/router.log" >&2
exit 1
