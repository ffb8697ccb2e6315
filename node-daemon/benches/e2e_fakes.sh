#!/usr/bin/env bash
# The release node-daemon binary between the real stand-in binaries:
# fake-apiserver + fake-kubelet (integration crate), 8 simulated GPUs x 10
# slices. e2e_drive.py then plays the scheduler for N single-GPU pods one at
# a time (node lock, annotations, binding) and times lock -> lock released.
# Prints the daemon's RSS idle and after, and checks SIGTERM removes the socket.
#
#   cargo build -p integration --bins && cargo build --release -p node-daemon
#   N=60 node-daemon/benches/e2e_fakes.sh
set -euo pipefail
N=${N:-60}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BIN=${FAKES_DIR:-$ROOT/target/debug}
REL=${DAEMON_DIR:-$ROOT/target/release}
W=$(mktemp -d)
trap 'kill ${K:-} ${A:-} 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$W" 2>/dev/null || true' EXIT
mkdir -p "$W/dp" "$W/hook"
"$BIN/fake-apiserver" --listen 127.0.0.1:0 --kubeconfig-out "$W/kc" > "$W/api.log" 2>&1 & A=$!
for _ in $(seq 100); do [ -s "$W/kc" ] && break; sleep 0.1; done
S=$(grep "server:" "$W/kc" | awk '{print $2}')
"$BIN/fake-kubelet" --node-name node-a --dir "$W/dp" --kubeconfig "$W/kc" --resource nvidia.com/gpu > "$W/kubelet.log" 2>&1 & K=$!
for _ in $(seq 100); do [ -S "$W/dp/kubelet.sock" ] && break; sleep 0.1; done
"$REL/node-daemon" --node-name node-a --kubeconfig "$W/kc" --device-plugin-dir "$W/dp" \
  --device-source simulated --simulated-gpus 8 --device-split-count 10 \
  --hook-path "$W/hook" --metrics-bind-address 127.0.0.1:0 > "$W/daemon.log" 2>&1 & D=$!
for _ in $(seq 100); do grep -q "registered with kubelet" "$W/daemon.log" && break; sleep 0.1; done
echo "node-daemon idle: $(grep VmRSS /proc/$D/status)"
python3 "$(dirname "$0")/e2e_drive.py" "$S" "$N"
echo "node-daemon after: $(grep -E 'VmRSS|VmHWM' /proc/$D/status | tr '\n' ' ')"
echo "Allocate log lines: $(grep -c ' allocated ' "$W/daemon.log")"
kill -TERM $D; wait $D || true
[ ! -e "$W/dp/nvidia-gpu.sock" ] && echo "SIGTERM: socket removed"
