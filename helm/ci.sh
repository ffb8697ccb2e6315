#!/usr/bin/env bash
# Chart CI for gpuslice: lint, render, validate against Kubernetes 1.33 schemas (mode dra: 1.37),
# and check that every flag/env the chart passes exists in the binaries, for both modes. Exits non-zero on the first failure.
#
# Needs python3 with pip, openssl, and a Rust toolchain (only when target/debug lacks
# up-to-date scheduler-webhook, node-daemon or fake-apiserver binaries);
# installs helm (helm/install-helm.sh) and kubernetes-validate (pip --target), both into
# target/ci-tools, so a second run installs nothing.
# Usage: helm/ci.sh            (from anywhere; about 30 s when the binaries are built)
set -euo pipefail
HELM_DIR="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(dirname "$HELM_DIR")"
CHART="$HELM_DIR/gpuslice"
KUBE_VERSION="${KUBE_VERSION:-1.33.0}"
TOOLS="${GPUSLICE_CI_TOOLS:-$ROOT/target/ci-tools}"
BIN_DIR="${GPUSLICE_BIN_DIR:-${CARGO_TARGET_DIR:-$ROOT/target}/debug}"
export PYTHONDONTWRITEBYTECODE=1
OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT

step() { printf '\n=== helm/ci.sh: %s\n' "$*"; }

step "tools: helm (helm/install-helm.sh into $TOOLS/bin) and kubernetes-validate (pip)"
if [ ! -x "$TOOLS/bin/helm" ]; then
  "$HELM_DIR/install-helm.sh" "$TOOLS/bin"
fi
export PATH="$TOOLS/bin:$PATH"
helm version --short
# kubernetes-validate (bundles the Kubernetes schemas) and PyYAML go into $TOOLS/py with
# pip --target: no virtualenv needed, nothing installed system-wide, cached between runs.
if ! PYTHONPATH="$TOOLS/py" python3 -c 'import kubernetes_validate, yaml' 2>/dev/null; then
  python3 -m pip install -q --disable-pip-version-check --target "$TOOLS/py" "kubernetes-validate==1.37.0"
fi
export PYTHONPATH="$TOOLS/py${PYTHONPATH:+:$PYTHONPATH}"
kubernetes-validate() { python3 -m kubernetes_validate "$@"; }
echo "kubernetes-validate $(kubernetes-validate --version)"

VALUE_SETS=(default all-features dra)
values_args() {  # the -f / --set arguments of one value set
  case "$1" in
    default) ;;
    all-features) echo "-f $CHART/ci/all-features-values.yaml" ;;
    dra) echo "--set mode=dra" ;;
  esac
}
# The Kubernetes version a value set is checked against: DRA mode's DeviceClass
# (resource.k8s.io/v1, extendedResourceName) needs 1.37.
kube_version() { if [ "$1" = dra ]; then echo "${DRA_KUBE_VERSION:-1.37.0}"; else echo "$KUBE_VERSION"; fi; }

step "values: every value has a comment in values.yaml and a described entry in values.schema.json"
python3 "$HELM_DIR/check_chart.py" values "$CHART"

for set in "${VALUE_SETS[@]}"; do
  KV="$(kube_version "$set")"
  # shellcheck disable=SC2046
  step "lint ($set values): helm lint --strict"
  helm lint --strict "$CHART" $(values_args "$set") --kube-version "$KV"

  step "render ($set values): helm template --kube-version $KV"
  # shellcheck disable=SC2046
  helm template gpuslice "$CHART" --namespace gpuslice-system --kube-version "$KV" \
    $(values_args "$set") > "$OUT/$set.yaml"
  echo "rendered $(grep -c '^kind:' "$OUT/$set.yaml") objects: $(grep '^kind:' "$OUT/$set.yaml" | sort | uniq -c | awk '{printf "%s×%s ", $1, $3}')"

  step "NOTES.txt ($set values): helm install --dry-run=client renders the post-install notes"
  # shellcheck disable=SC2046
  helm install gpuslice "$CHART" --namespace gpuslice-system --dry-run=client $(values_args "$set") \
    | sed -n '/^NOTES:/,$p' > "$OUT/$set.notes"
  grep -q 'helm test gpuslice' "$OUT/$set.notes" || { echo "FAIL: NOTES.txt did not render"; exit 1; }
  echo "rendered $(wc -l < "$OUT/$set.notes") lines of notes"

  step "schema ($set values): kubernetes-validate --strict -k $KV"
  kubernetes-validate --strict -k "$KV" - < "$OUT/$set.yaml" 2>&1 | tee "$OUT/$set.validate" \
    | grep -v '^INFO - passed' || true
  if grep -q -E '^(ERROR|CRITICAL)' "$OUT/$set.validate" || ! grep -q 'INFO - passed' "$OUT/$set.validate"; then
    echo "FAIL: kubernetes-validate rejected the $set manifests"; exit 1
  fi
  # Only custom resources may lack a built-in schema; they get the structural check below.
  unknown="$(grep "Couldn't find schema" "$OUT/$set.validate" \
    | grep -v -E 'kind (Certificate|Issuer) with api version cert-manager.io/v1|kind ServiceMonitor with api version monitoring.coreos.com/v1' || true)"
  if [ -n "$unknown" ]; then
    echo "FAIL: objects without a schema that are not known custom resources:"; echo "$unknown"; exit 1
  fi
  crs="$(grep -c "Couldn't find schema" "$OUT/$set.validate" || true)"
  echo "passed: $(grep -c 'INFO - passed' "$OUT/$set.validate") objects valid against Kubernetes $KV;" \
    "$crs custom resources have no built-in schema (checked in the custom resources step)"

  step "wiring ($set values): kube-scheduler config (or, mode dra, the DeviceClass and DRA RBAC), webhook, Service, certificate and RBAC agree"
  python3 "$HELM_DIR/check_chart.py" wiring "$OUT/$set.yaml"

  step "custom resources ($set values): required fields of cert-manager / ServiceMonitor objects"
  python3 "$HELM_DIR/check_chart.py" crds "$OUT/$set.yaml"
done

step "HAMi-core install command (default values): installs, idempotent, atomic replace"
python3 "$HELM_DIR/check_chart.py" hamicore "$OUT/default.yaml"

step "render variants: external cert-manager issuer, no node-daemon, no anti-affinity, no PDB"
helm template gpuslice "$CHART" --namespace gs --kube-version "$KUBE_VERSION" \
  --set scheduler.certManager.enabled=true \
  --set scheduler.certManager.issuerRef.name=corp-ca \
  --set scheduler.certManager.issuerRef.kind=ClusterIssuer \
  --set devicePlugin.enabled=false --set scheduler.podAntiAffinity=none \
  --set scheduler.podDisruptionBudget.enabled=false > "$OUT/variant.yaml"
kubernetes-validate --strict -k "$KUBE_VERSION" --quiet - < "$OUT/variant.yaml" 2>&1 \
  | { grep -v "Couldn't find schema for kind Certificate" || true; } | tee "$OUT/variant.validate"
if [ -s "$OUT/variant.validate" ]; then echo "FAIL: variant manifests rejected"; exit 1; fi
python3 "$HELM_DIR/check_chart.py" crds "$OUT/variant.yaml"
if grep -q '^kind: DaemonSet' "$OUT/variant.yaml"; then echo "FAIL: devicePlugin.enabled=false still renders a DaemonSet"; exit 1; fi
echo "passed"

step "bad values are refused by values.schema.json"
for bad in scheduler.replicas=0 scheduler.defaultSchedulerPolicy.nodeSchedulerPolicy=packed \
           devicePlugin.deviceSplitCount=0 scheduler.admissionWebhook.failurePolicy=Maybe \
           resourceMem=gpumem devicePlugin.unknownKey=1 mode=hybrid; do
  if helm template gpuslice "$CHART" --kube-version "$KUBE_VERSION" --set "$bad" >/dev/null 2>"$OUT/bad.err"; then
    echo "FAIL: --set $bad was accepted"; exit 1
  fi
  echo "refused --set $bad: $(grep -m1 -E "at '|Error" "$OUT/bad.err" | sed 's/^ *//')"
done

step "images: docker/Dockerfile has a target per binary the chart runs (no Docker engine here: not built)"
for bin in scheduler-webhook node-daemon; do
  grep -q -E "^FROM .* AS $bin\$" "$ROOT/docker/Dockerfile" \
    && grep -q -E "^COPY --from=builder /out/$bin /usr/local/bin/$bin\$" "$ROOT/docker/Dockerfile" \
    && grep -q -E -- "-p $bin --bin $bin" "$ROOT/docker/Dockerfile" \
    || { echo "FAIL: docker/Dockerfile lacks the build, target or copy of $bin"; exit 1; }
  grep -q -E "^ +- $bin\$" "$OUT/default.yaml" \
    || { echo "FAIL: the chart does not run $bin as its command"; exit 1; }
  echo "target $bin: builds, copies to /usr/local/bin/$bin; the chart runs command $bin"
done
grep -q '^target/' "$ROOT/.dockerignore" || { echo "FAIL: .dockerignore does not exclude target/"; exit 1; }

step "binaries: flags and env vars the chart passes exist in --help, and the binaries accept them"
stale=""
for bin in scheduler-webhook node-daemon; do
  if [ ! -x "$BIN_DIR/$bin" ]; then
    stale="$stale $bin (absent)"
  elif [ -n "$(find "$ROOT/$bin" "$ROOT/proto" \( -name '*.rs' -o -name Cargo.toml \) -newer "$BIN_DIR/$bin" -print -quit)" ]; then
    stale="$stale $bin (older than its sources)"
  fi
done
if [ -n "$stale" ] && [ -z "${GPUSLICE_BIN_DIR:-}" ]; then
  echo "building:$stale (cargo build, debug)"
  (cd "$ROOT" && cargo build -q -p scheduler-webhook --bin scheduler-webhook -p node-daemon --bin node-daemon)
elif [ -n "$stale" ]; then
  echo "FAIL: GPUSLICE_BIN_DIR=$BIN_DIR has no usable binaries:$stale"; exit 1
fi
echo "binaries: $BIN_DIR/scheduler-webhook ($("$BIN_DIR/scheduler-webhook" --version)), $BIN_DIR/node-daemon ($("$BIN_DIR/node-daemon" --version))"
for set in "${VALUE_SETS[@]}"; do
  echo "-- $set values"
  python3 "$HELM_DIR/check_chart.py" flags "$OUT/$set.yaml" "$BIN_DIR"
done

step "smoke (default values): the chart's command lines and certificate, run against integration's fake-apiserver"
if [ ! -x "$BIN_DIR/fake-apiserver" ] || [ -n "$(find "$ROOT/integration/src" -name '*.rs' -newer "$BIN_DIR/fake-apiserver" -print -quit)" ]; then
  if [ -n "${GPUSLICE_BIN_DIR:-}" ]; then echo "FAIL: $BIN_DIR/fake-apiserver is absent or stale"; exit 1; fi
  echo "building fake-apiserver (cargo build -p integration --bin fake-apiserver)"
  (cd "$ROOT" && cargo build -q -p integration --bin fake-apiserver)
fi
python3 "$HELM_DIR/check_chart.py" smoke "$OUT/default.yaml" "$BIN_DIR"

step "all chart checks passed"
