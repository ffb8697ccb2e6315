#!/usr/bin/env bash
# Builds the real Kubernetes control plane for gpuslice's tests from the Go module proxy:
# kube-apiserver, kube-scheduler, kube-controller-manager, kubelet (k8s.io/kubernetes),
# etcd (go.etcd.io/etcd/server/v3/embed) and fake-cri (k8s.io/cri-client/pkg/fake), into
# target/k8s/<kubernetes version>/. Skips what is already built; prints what it did.
#
#   integration/k8s/build.sh            # build what is missing
#   integration/k8s/build.sh --print-dir  # print the output folder and exit
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
# shellcheck source=versions.env
source "$here/versions.env"
out="${GPUSLICE_K8S_DIR:-$root/target/k8s/$KUBERNETES_VERSION}"
if [[ "${1:-}" == "--print-dir" ]]; then echo "$out"; exit 0; fi

command -v go >/dev/null || { echo "build.sh: 'go' is not on PATH; the real control plane is built with Go 1.26 (https://go.dev/dl)" >&2; exit 1; }
grep -q "k8s.io/kubernetes $KUBERNETES_VERSION" "$here/go.mod" \
  || { echo "build.sh: go.mod does not require k8s.io/kubernetes $KUBERNETES_VERSION (versions.env); fix one of them" >&2; exit 1; }

mkdir -p "$out"
cd "$here"
declare -A pkgs=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [etcd]=./cmd/etcd
  [fake-cri]=./cmd/fake-cri
)
# The version stamp kube-apiserver reports at /version (what `hack/lib/version.sh` sets).
ldflags="-s -w -X k8s.io/component-base/version.gitVersion=$KUBERNETES_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$(echo "$KUBERNETES_VERSION" | cut -d. -f2) -X k8s.io/client-go/pkg/version.gitVersion=$KUBERNETES_VERSION"
for name in etcd fake-cri kube-apiserver kube-scheduler kube-controller-manager kubelet; do
  bin="$out/$name"
  # Rebuilt when go.mod, go.sum, versions.env or the command's own sources are newer.
  if [[ -x "$bin" && -z "$(find "$here" -newer "$bin" \( -name '*.go' -o -name 'go.mod' -o -name 'go.sum' -o -name versions.env \) -print -quit)" ]]; then
    echo "build.sh: $name is built ($bin)"
    continue
  fi
  echo "build.sh: building $name from ${pkgs[$name]} (a cold build takes minutes on 2 cores)..."
  start=$(date +%s)
  CGO_ENABLED=0 go build -trimpath -ldflags "$ldflags" -o "$bin.tmp" "${pkgs[$name]}"
  mv "$bin.tmp" "$bin"
  echo "build.sh: built $name in $(( $(date +%s) - start )) s"
done
echo "build.sh: binaries in $out"
