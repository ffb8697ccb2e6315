#!/usr/bin/env bash
# Try the REAL kubelet (k8s.io/kubernetes cmd/kubelet) on this machine, on loopback only:
# etcd + kube-apiserver (self-made certs, Node,RBAC) + the Kubernetes project's fake CRI
# runtime + kubelet, then gpuslice's node-daemon with simulated GPUs as a device plugin, then
# one pod asking for nvidia.com/gpu: 1 bound to the node. See FINDINGS.md for what happens.
#
#   integration/k8s/try-kubelet/run.sh            # run everything, keep it up until Ctrl-C
#   STEPS=controlplane integration/k8s/try-kubelet/run.sh  # etcd, apiserver, fake-cri only
#   STEPS=kubelet integration/k8s/try-kubelet/run.sh   # stop after the kubelet (no node-daemon / pod)
#
# Env: K8S_BIN (etcd, kube-apiserver, kubelet, fake-cri), NODE_DAEMON (binary), WORK (temp folder),
#      NODE (node name), *_PORT, KUBELET_V (log level), KUBELET_FLAGS (extra kubelet flags), KEEP=1 (do not stop on exit of the checks; wait for Ctrl-C).
#
# Network rule: every address below is 127.0.0.1 (or a unix socket). The kubelet gets
# --node-ip=127.0.0.1, which it refuses to publish (the node ends with no addresses at all,
# so nothing can dial it), and the apiserver's endpoint reconciler is off.
#
# Host isolation: the kubelet runs in a private mount namespace (unshare -m) where
#  - /var/lib/kubelet/device-plugins (hard-coded in the device manager, NOT under --root-dir)
#    is a bind mount of <root-dir>/device-plugins, so node-daemon, outside, uses that folder;
#  - the six sysctls kubelet wants (vm.overcommit_memory=1, kernel.panic=10, ...) are bind
#    mounts of small files holding the wanted values, so kubelet neither changes the host's
#    sysctls nor fails (protectKernelDefaults: true);
#  - its rshared root-dir bind mount and any tmpfs volume mounts stay in that namespace.
# The only trace on the host is an empty /var/lib/kubelet/device-plugins mount point.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../../.." && pwd)"
K8S_BIN="${K8S_BIN:-/work/main/target/k8s/v1.37.2}"
NODE_DAEMON="${NODE_DAEMON:-$root/target/debug/node-daemon}"
# fake-cri must give pulled images a size, else kubelet's CRI client rejects them (see
# fake-cri-image-size.patch); until that patch is in, point FAKE_CRI at a patched build.
FAKE_CRI="${FAKE_CRI:-$K8S_BIN/fake-cri}"
WORK="${WORK:-/tmp/try-kubelet}"
NODE="${NODE:-try-node}"
STEPS="${STEPS:-all}"
ETCD_PORT="${ETCD_PORT:-42379}"; ETCD_PEER_PORT="${ETCD_PEER_PORT:-42380}"
API_PORT="${API_PORT:-46443}"
KUBELET_PORT="${KUBELET_PORT:-40250}"; KUBELET_HEALTHZ_PORT="${KUBELET_HEALTHZ_PORT:-40248}"
METRICS_PORT="${METRICS_PORT:-49396}"
LO=127.0.0.1

need="etcd kube-apiserver fake-cri"; [[ $STEPS == controlplane ]] || need+=" kubelet"
for b in $need; do
  [[ -x "$K8S_BIN/$b" ]] || { echo "run.sh: $K8S_BIN/$b is not built (integration/k8s/build.sh)" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "run.sh: needs root (mount namespace for the kubelet)" >&2; exit 1; }

rm -rf "$WORK"; mkdir -p "$WORK"/{pki,logs,etcd,root/device-plugins,sysctl,pod-logs,volume-plugins}
log() { echo "[$(date +%T)] $*"; }
pids=()
cleanup() {
  # newest first, each gone before the next (the apiserver before etcd)
  for ((i=${#pids[@]}-1; i>=0; i--)); do
    kill "${pids[$i]}" 2>/dev/null || continue
    for _ in $(seq 50); do kill -0 "${pids[$i]}" 2>/dev/null || break; sleep 0.1; done
    kill -9 "${pids[$i]}" 2>/dev/null || true
  done
}
trap cleanup EXIT
trap "exit 130" INT TERM
logs=()   # log file of each pid, same index
started() { pids+=("$1"); logs+=("$2"); }
dead() { # exits when a started process has died, showing the end of its log
  for i in "${!pids[@]}"; do
    kill -0 "${pids[$i]}" 2>/dev/null && continue
    log "DIED: pid ${pids[$i]}; last lines of ${logs[$i]}:"; tail -5 "${logs[$i]}" | cut -c1-400 | sed 's/^/    /'
    exit 1
  done
}
wait_for() { # description, seconds, command...
  local what=$1 end=$((SECONDS + $2)); shift 2
  while ((SECONDS < end)); do
    dead
    "$@" >/dev/null 2>&1 && { log "ok: $what"; return 0; }
    sleep 0.3
  done
  log "TIMEOUT: $what"; return 1
}

# --- certificates (openssl) ---------------------------------------------------------------
pki="$WORK/pki"
openssl req -x509 -newkey rsa:2048 -nodes -days 2 -subj "/CN=try-kubelet-ca" \
  -keyout "$pki/ca.key" -out "$pki/ca.crt" 2>/dev/null
cert() { # name subject [san]
  local name=$1 subj=$2 san=${3:-}
  openssl req -newkey rsa:2048 -nodes -subj "$subj" -keyout "$pki/$name.key" -out "$pki/$name.csr" 2>/dev/null
  local ext="$pki/$name.ext"
  { echo "basicConstraints=CA:FALSE"; echo "keyUsage=digitalSignature,keyEncipherment";
    if [[ -n $san ]]; then echo "extendedKeyUsage=serverAuth"; echo "subjectAltName=$san";
    else echo "extendedKeyUsage=clientAuth"; fi; } > "$ext"
  openssl x509 -req -in "$pki/$name.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial \
    -days 2 -extfile "$ext" -out "$pki/$name.crt" 2>/dev/null
}
cert apiserver "/CN=kube-apiserver" "IP:127.0.0.1,DNS:localhost"
cert admin "/O=system:masters/CN=admin"
cert node "/O=system:nodes/CN=system:node:$NODE"
openssl genrsa -out "$pki/sa.key" 2048 2>/dev/null
openssl rsa -in "$pki/sa.key" -pubout -out "$pki/sa.pub" 2>/dev/null
kubeconfig() { # file user
  cat > "$1" <<KC
apiVersion: v1
kind: Config
clusters: [{name: try, cluster: {server: "https://$LO:$API_PORT", certificate-authority: "$pki/ca.crt"}}]
users: [{name: $2, user: {client-certificate: "$pki/$2.crt", client-key: "$pki/$2.key"}}]
contexts: [{name: try, context: {cluster: try, user: $2}}]
current-context: try
KC
}
kubeconfig "$WORK/admin.kubeconfig" admin
kubeconfig "$WORK/node.kubeconfig" node
export KUBECONFIG="$WORK/admin.kubeconfig"
log "certificates and kubeconfigs in $WORK"

# --- etcd ----------------------------------------------------------------------------------
"$K8S_BIN/etcd" --data-dir "$WORK/etcd" --client-url "http://$LO:$ETCD_PORT" \
  --peer-url "http://$LO:$ETCD_PEER_PORT" > "$WORK/logs/etcd.log" 2>&1 &
started $! "$WORK/logs/etcd.log"
wait_for "etcd ready" 30 grep -q ready "$WORK/logs/etcd.log"

# --- kube-apiserver ------------------------------------------------------------------------
"$K8S_BIN/kube-apiserver" \
  --etcd-servers="http://$LO:$ETCD_PORT" \
  --bind-address=$LO --advertise-address=$LO --secure-port="$API_PORT" \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --service-account-issuer="https://$LO:$API_PORT" \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-cluster-ip-range=10.96.0.0/24 \
  --endpoint-reconciler-type=none \
  --authorization-mode=Node,RBAC \
  --enable-admission-plugins=NodeRestriction \
  --allow-privileged=true \
  --cert-dir="$WORK/apiserver-certs" \
  --profiling=false \
  > "$WORK/logs/kube-apiserver.log" 2>&1 &
started $! "$WORK/logs/kube-apiserver.log"
wait_for "kube-apiserver /readyz" 90 kubectl get --raw /readyz
kubectl version 2>&1 | sed 's/^/    /'
kubectl create serviceaccount default -n default >/dev/null 2>&1 || true  # no controller-manager here

# --- fake CRI runtime ----------------------------------------------------------------------
"$FAKE_CRI" --endpoint "unix://$WORK/cri.sock" > "$WORK/logs/fake-cri.log" 2>&1 &
started $! "$WORK/logs/fake-cri.log"
wait_for "fake-cri ready" 30 grep -q ready "$WORK/logs/fake-cri.log"

[[ $STEPS == controlplane ]] && { log "STEPS=controlplane: stopping here"; [[ ${KEEP:-} ]] && wait; exit 0; }

# --- kubelet -------------------------------------------------------------------------------
cat > "$WORK/kubelet.yaml" <<KCFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $LO
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: $LO
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: false}
  x509: {clientCAFile: "$pki/ca.crt"}
authorization: {mode: AlwaysAllow}
containerRuntimeEndpoint: "unix://$WORK/cri.sock"
cgroupDriver: cgroupfs
cgroupsPerQOS: false
enforceNodeAllocatable: []
failSwapOn: false
failCgroupV1: false
localStorageCapacityIsolation: false
makeIPTablesUtilChains: false
protectKernelDefaults: true
podLogsDir: "$WORK/pod-logs"
volumePluginDir: "$WORK/volume-plugins"
resolvConf: ""
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {}
rotateCertificates: false
serverTLSBootstrap: false
KCFG
# The values kubelet's setupKernelTunables wants, served from files in the kubelet's namespace.
declare -A tunables=([vm/overcommit_memory]=1 [vm/panic_on_oom]=0 [kernel/panic]=10
  [kernel/panic_on_oops]=1 [kernel/keys/root_maxkeys]=1000000 [kernel/keys/root_maxbytes]=25000000)
binds=""
for k in "${!tunables[@]}"; do
  f="$WORK/sysctl/${k//\//.}"; echo "${tunables[$k]}" > "$f"
  binds+="mount --bind '$f' '/proc/sys/$k'; "
done
mkdir -p /var/lib/kubelet/device-plugins   # mount point only (empty on the host)
binds+="mount --bind '$WORK/root/device-plugins' /var/lib/kubelet/device-plugins; "
# shellcheck disable=SC2016
unshare --mount --propagation private -- bash -c "$binds"'exec "$@"' kubelet \
  "$K8S_BIN/kubelet" \
  --config="$WORK/kubelet.yaml" \
  --kubeconfig="$WORK/node.kubeconfig" \
  --root-dir="$WORK/root" \
  --cert-dir="$WORK/root/pki" \
  --hostname-override="$NODE" \
  --node-ip=$LO \
  --v="${KUBELET_V:-2}" \
  ${KUBELET_FLAGS:-} \
  > "$WORK/logs/kubelet.log" 2>&1 &
started $! "$WORK/logs/kubelet.log"
log "kubelet pid ${pids[-1]}, log $WORK/logs/kubelet.log"
wait_for "kubelet /healthz" 60 curl -sf "http://$LO:$KUBELET_HEALTHZ_PORT/healthz" || true
wait_for "Node $NODE registered" 60 kubectl get node "$NODE" || true
wait_for "Node $NODE Ready" 60 bash -c "kubectl get node $NODE -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}' | grep -q True" || true
kubectl get node -o wide 2>&1 | sed 's/^/    /'
kubectl get node "$NODE" -o jsonpath='{range .status.conditions[*]}{.type}={.status} {.reason}: {.message}{"\n"}{end}' 2>&1 | sed 's/^/    /'
[[ $STEPS == kubelet ]] && { log "STEPS=kubelet: stopping here"; [[ ${KEEP:-} ]] && wait; exit 0; }

# --- node-daemon (simulated GPUs) as the kubelet's device plugin ----------------------------
[[ -x $NODE_DAEMON ]] || { echo "run.sh: $NODE_DAEMON not built (cargo build -p node-daemon)" >&2; exit 1; }
RUST_LOG="${RUST_LOG:-debug,kube_client=info,hyper=info,tower=info,h2=info,rustls=info}" NODE_NAME="$NODE" "$NODE_DAEMON" \
  --kubeconfig "$WORK/admin.kubeconfig" --node-name "$NODE" \
  --device-plugin-dir "$WORK/root/device-plugins" \
  --device-source simulated --simulated-gpus 2 --device-split-count 4 \
  --metrics-bind-address "$LO:$METRICS_PORT" --hook-path "$WORK/hook" \
  > "$WORK/logs/node-daemon.log" 2>&1 &
started $! "$WORK/logs/node-daemon.log"
gpus() { kubectl get node "$NODE" -o jsonpath='{.status.allocatable.nvidia\.com/gpu}'; }
wait_for "node allocatable nvidia.com/gpu > 0" 60 bash -c "[[ \$(kubectl get node $NODE -o jsonpath='{.status.allocatable.nvidia\.com/gpu}') -gt 0 ]]" || true
log "capacity nvidia.com/gpu=$(kubectl get node "$NODE" -o jsonpath='{.status.capacity.nvidia\.com/gpu}') allocatable=$(gpus)"
reg=$(kubectl get node "$NODE" -o jsonpath='{.metadata.annotations.hami\.io/node-nvidia-register}')
log "hami.io/node-nvidia-register: $reg"
uuid=$(sed -n 's/^\[{"id":"\([^"]*\)".*/\1/p' <<<"$reg")

# --- a pod bound to the node with the annotations HAMi's scheduler would have written ------
now=$(date +%s)
ann="GPU-unknown,NVIDIA,1000,30:;"
[[ -n $uuid ]] && ann="$uuid,NVIDIA,1000,30:;"
kubectl annotate node "$NODE" --overwrite "hami.io/mutex.lock=$(date -u +%Y-%m-%dT%H:%M:%SZ),default,gpu-pod" >/dev/null
kubectl apply -f - <<POD
apiVersion: v1
kind: Pod
metadata:
  name: gpu-pod
  namespace: default
  labels: {hami.io/vgpu-node: "$NODE"}
  annotations:
    hami.io/vgpu-node: "$NODE"
    hami.io/vgpu-time: "$now"
    hami.io/vgpu-devices-to-allocate: "$ann"
    hami.io/vgpu-devices-allocated: "$ann"
    hami.io/bind-phase: allocating
    hami.io/bind-time: "$now"
spec:
  nodeName: $NODE
  automountServiceAccountToken: false
  restartPolicy: Never
  containers:
  - name: cuda
    image: registry.k8s.io/pause:3.10
    resources:
      limits: {nvidia.com/gpu: 1}
POD
wait_for "pod gpu-pod Running" 60 bash -c "kubectl get pod gpu-pod -o jsonpath='{.status.phase}' | grep -q Running" || true
kubectl get pod gpu-pod -o wide 2>&1 | sed 's/^/    /'
kubectl get pod gpu-pod -o jsonpath='{.metadata.annotations}{"\n"}{.status.conditions}{"\n"}' | sed 's/^/    /'
kubectl get events -A --sort-by=.lastTimestamp 2>&1 | tail -15 | sed 's/^/    /'
log "node-daemon Allocate lines:"
grep -i "allocat" "$WORK/logs/node-daemon.log" | tail -20 | sed 's/^/    /'
log "kubelet device manager lines:"
grep -iE "devicemanager|device plugin|Allocate|nvidia" "$WORK/logs/kubelet.log" | tail -30 | sed 's/^/    /'
if [[ ${KEEP:-} ]]; then log "KEEP=1: everything stays up; Ctrl-C to stop"; wait; fi
