#!/usr/bin/env python3
"""Checks of the gpuslice chart that helm and kubernetes-validate cannot do (used by helm/ci.sh).

  check_chart.py values CHART_DIR
      every leaf of values.yaml has a comment above it and a schema entry with a description.
  check_chart.py flags MANIFEST BIN_DIR
      every flag and env var the rendered chart passes to scheduler-webhook / node-daemon
      appears in that binary's --help, and the binary accepts the whole command line and the
      rendered config file (--print-config, which parses and validates, then exits).
  check_chart.py wiring MANIFEST
      the pieces that must agree do: kube-scheduler's profile, Lease and extender vs the
      scheduler-webhook flags and ports, managedResources vs the resource flags, the webhook's
      Service and port, the Lease Role, the certificate's names, the node-daemon socket folder.
  check_chart.py hamicore MANIFEST
      runs the DaemonSet's HAMi-core install command against a fake image folder and a fake
      host folder: it installs the files, a second run changes nothing, and a changed file
      replaces the old one by rename (a new inode), never by rewriting it in place.
  check_chart.py smoke MANIFEST BIN_DIR
      runs scheduler-webhook with the chart's own command line and generated certificate
      against integration's fake-apiserver (listen ports moved to free loopback ports) and
      checks, as kube-apiserver and kubelet would: TLS verifies with the chart's caBundle for
      the Service's DNS name, /healthz and /readyz answer 200, a GPU pod's AdmissionReview is
      routed to the chart's scheduler name, /metrics answers. Runs node-daemon with the
      chart's config file (simulated GPUs) and checks its /healthz and /metrics.
  check_chart.py crds MANIFEST
      the custom resources kubernetes-validate has no schema for (cert-manager, Prometheus
      Operator) have the fields their controllers require, and the webhook has a CA bundle or
      a CA injection.

Needs PyYAML (a dependency of kubernetes-validate). Exit 1 with one line per problem.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import yaml

# Env vars the chart sets that are read by the container runtime, not by our binaries.
RUNTIME_ENV = {
    "NVIDIA_VISIBLE_DEVICES": "NVIDIA container runtime: which GPUs to inject",
    "NVIDIA_DRIVER_CAPABILITIES": "NVIDIA container runtime: which driver libraries to inject",
}
OUR_BINARIES = {"scheduler-webhook", "node-daemon"}


def fail(problems):
    for p in problems:
        print(f"  FAIL {p}")
    if problems:
        sys.exit(1)


def load_docs(path):
    with open(path, encoding="utf-8") as f:
        return [d for d in yaml.safe_load_all(f) if d]


# ---------------------------------------------------------------- values
def leaves(node, schema, path=()):
    """Paths of every value. A map recurses when the schema lists its keys; a map the schema
    takes whole (resources, nodeSelector, affinity: Kubernetes objects) is one value."""
    entry = schema_at(schema, path) if path else schema
    if isinstance(node, dict) and node and (entry is None or "properties" in entry):
        for k, v in node.items():
            yield from leaves(v, schema, path + (k,))
    else:
        yield path


def schema_at(schema, path):
    for key in path:
        props = schema.get("properties", {})
        if key not in props:
            return None
        schema = props[key]
    return schema


def commented_keys(text):
    """Paths (by indentation) of the keys in values.yaml that have a comment line right above."""
    out, stack, prev_comment = set(), [], False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            prev_comment = False
            continue
        if stripped.startswith("#"):
            prev_comment = True
            continue
        m = re.match(r"^( *)([A-Za-z0-9_.\-/]+):", line)
        if m and not stripped.startswith("- "):
            indent = len(m.group(1))
            while stack and stack[-1][0] >= indent:
                stack.pop()
            stack.append((indent, m.group(2)))
            if prev_comment:
                out.add(tuple(k for _, k in stack))
        prev_comment = False
    return out


def check_values(chart):
    with open(os.path.join(chart, "values.yaml"), encoding="utf-8") as f:
        text = f.read()
    values = yaml.safe_load(text)
    with open(os.path.join(chart, "values.schema.json"), encoding="utf-8") as f:
        schema = json.load(f)
    commented = commented_keys(text)
    problems, count = [], 0
    for path in leaves(values, schema):
        count += 1
        name = ".".join(path)
        entry = schema_at(schema, path)
        if entry is None:
            problems.append(f"{name}: no entry in values.schema.json")
        elif not entry.get("description"):
            problems.append(f"{name}: schema entry has no description")
        if path not in commented:
            problems.append(f"{name}: no comment above it in values.yaml")
    fail(problems)
    print(f"  ok: {count} values, each with a comment and a described schema entry")


# ---------------------------------------------------------------- flags
def help_text(bin_dir, argv0, sub):
    cmd = [os.path.join(bin_dir, argv0)] + sub + ["--help"]
    return subprocess.run(cmd, capture_output=True, text=True, check=True).stdout


def flag_names(args):
    names = []
    for a in args:
        if a.startswith("--"):
            names.append(a.split("=", 1)[0])
    return names


def containers(docs):
    for d in docs:
        if d.get("kind") not in ("Deployment", "DaemonSet"):
            continue
        spec = d["spec"]["template"]["spec"]
        for c in spec.get("containers", []) + spec.get("initContainers", []):
            yield d, c


def config_maps(docs):
    return {
        d["metadata"]["name"]: d.get("data", {}) for d in docs if d.get("kind") == "ConfigMap"
    }


def mounted_file(docs, workload, container, path):
    """The ConfigMap content mounted at `path` in `container`, or None."""
    spec = workload["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec.get("volumes", [])}
    cms = config_maps(docs)
    for m in container.get("volumeMounts", []):
        mount = m["mountPath"].rstrip("/")
        if not path.startswith(mount + "/"):
            continue
        cm = volumes.get(m["name"], {}).get("configMap")
        if cm:
            return cms.get(cm["name"], {}).get(path[len(mount) + 1 :])
    return None


def camel_key(flag, effective):
    """The effective-config key a --flag sets (matched case-insensitively: defaultGPUNum)."""
    wanted = flag.lstrip("-").replace("-", "").lower()
    return next((k for k in effective if k.lower() == wanted), None)


def same(expected, actual):
    if isinstance(actual, bool):
        return expected in (True, "true", None)
    if isinstance(actual, (int, float)) and not isinstance(expected, bool):
        try:
            return float(expected) == float(actual)
        except (TypeError, ValueError):
            return False
    if isinstance(actual, dict):
        # The binary fills defaults: every key the chart set must be there with its value.
        return isinstance(expected, dict) and all(
            k in actual and same(v, actual[k]) for k, v in expected.items()
        )
    if isinstance(actual, list):
        return (
            isinstance(expected, list)
            and len(expected) == len(actual)
            and all(same(e, a) for e, a in zip(expected, actual))
        )
    return str(expected) == str(actual)


def config_files(run_args):
    out = {}
    for a in run_args:
        if a.startswith("--config="):
            with open(a.split("=", 1)[1], encoding="utf-8") as f:
                out.update(yaml.safe_load(f) or {})
    return out


def settings_landed(where, run_args, file_values, effective, problems):
    """Each flag and config-file key must reach the effective settings with its value."""
    landed = 0
    for key, value in file_values.items():
        if key not in effective:
            problems.append(f"{where}: config key {key} is not a setting of the binary")
        elif not same(value, effective[key]):
            problems.append(f"{where}: config {key}={value!r} became {effective[key]!r}")
        else:
            landed += 1
    for a in run_args:
        if not a.startswith("--") or a.startswith("--config=") or a == "--print-config":
            continue
        flag, _, value = a.partition("=")
        key = camel_key(flag, effective)
        if key is None:
            # Flags that are not settings (e.g. --log-json) have nothing to compare.
            continue
        if not same(value if value else None, effective[key]):
            problems.append(f"{where}: {a} became {key}={effective[key]!r}")
        else:
            landed += 1
    return landed


def check_flags(manifest, bin_dir):
    docs = load_docs(manifest)
    problems, checked = [], 0
    for workload, c in containers(docs):
        command = c.get("command", []) + c.get("args", [])
        if not command or command[0] not in OUR_BINARIES:
            continue
        argv0 = command[0]
        sub = [command[1]] if argv0 == "scheduler-webhook" else []
        args = command[1 + len(sub) :]
        where = f"{workload['kind']}/{workload['metadata']['name']} container {c['name']}"
        text = help_text(bin_dir, argv0, sub)
        for flag in flag_names(args):
            checked += 1
            if not re.search(re.escape(flag) + r"(?=[\s<=,]|$)", text):
                problems.append(f"{where}: {argv0} {' '.join(sub)} --help has no {flag}")
        for env in c.get("env", []):
            checked += 1
            name = env["name"]
            if name in RUNTIME_ENV:
                print(f"  note: {where}: env {name} is for the {RUNTIME_ENV[name]}")
                continue
            if not re.search(r"(?<![A-Z0-9_])" + re.escape(name) + r"(?![A-Z0-9_])", text):
                problems.append(f"{where}: env {name} is not mentioned in {argv0} --help")

        # The binary must accept the whole command line and the rendered config file.
        run_args, env = [], dict(os.environ)
        with tempfile.TemporaryDirectory() as tmp:
            for a in args:
                if a.startswith("--config="):
                    path = a.split("=", 1)[1]
                    content = mounted_file(docs, workload, c, path)
                    if content is None:
                        problems.append(f"{where}: {a} is not a mounted ConfigMap file")
                        continue
                    local = os.path.join(tmp, os.path.basename(path))
                    with open(local, "w", encoding="utf-8") as f:
                        f.write(content)
                    a = f"--config={local}"
                run_args.append(a)
            for e in c.get("env", []):
                if "value" in e:
                    env[e["name"]] = e["value"]
                elif e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "spec.nodeName":
                    env[e["name"]] = "ci-node"
            cmd = [os.path.join(bin_dir, argv0)] + sub + run_args + ["--print-config"]
            r = subprocess.run(cmd, capture_output=True, text=True, env=env)
            if r.returncode != 0:
                problems.append(
                    f"{where}: {argv0} rejected the chart's arguments (exit {r.returncode}): "
                    + (r.stderr.strip() or r.stdout.strip())
                )
                continue
            effective = json.loads(r.stdout)
            if "nodeName" in effective and env.get("NODE_NAME") == "ci-node":
                if effective["nodeName"] != "ci-node":
                    problems.append(f"{where}: NODE_NAME did not become nodeName")
            landed = settings_landed(where, run_args, config_files(run_args), effective, problems)
            print(
                f"  ok: {where}: `{' '.join([argv0] + sub)} … --print-config` accepts "
                f"{len(run_args)} arguments; {landed} chart settings found in its effective config"
            )
    if checked == 0:
        problems.append("no scheduler-webhook or node-daemon container found in the manifest")
    fail(problems)
    print(f"  ok: {checked} flags and env vars found in --help")


# ---------------------------------------------------------------- wiring
def flag_values(args):
    out = {}
    for a in args:
        if a.startswith("--") and "=" in a:
            k, v = a[2:].split("=", 1)
            out[k] = v
    return out


# kube-scheduler decodes its configuration strictly: an unknown key stops it at start.
# Field names of kubescheduler.config.k8s.io/v1 (KubeSchedulerConfiguration, Extender).
SCHEDULER_KEYS = {
    "": {"apiVersion", "kind", "parallelism", "leaderElection", "clientConnection",
         "enableProfiling", "enableContentionProfiling", "percentageOfNodesToScore",
         "podInitialBackoffSeconds", "podMaxBackoffSeconds", "profiles", "extenders",
         "delayCacheUntilActive"},
    "leaderElection": {"leaderElect", "leaseDuration", "renewDeadline", "retryPeriod",
                       "resourceLock", "resourceName", "resourceNamespace"},
    "profiles[]": {"schedulerName", "percentageOfNodesToScore", "plugins", "pluginConfig"},
    "extenders[]": {"urlPrefix", "filterVerb", "preemptVerb", "prioritizeVerb", "weight",
                    "bindVerb", "enableHTTPS", "tlsConfig", "httpTimeout", "nodeCacheCapable",
                    "managedResources", "ignorable"},
    "extenders[].tlsConfig": {"insecure", "serverName", "certFile", "keyFile", "caFile",
                              "certData", "keyData", "caData"},
    "extenders[].managedResources[]": {"name", "ignoredByScheduler"},
}
DURATION = re.compile(r"^([0-9]+(\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$")


def unknown_scheduler_keys(cfg):
    problems = []

    def check(obj, where):
        extra = set(obj) - SCHEDULER_KEYS[where]
        if extra:
            problems.append(f"KubeSchedulerConfiguration {where or 'top level'}: unknown keys {sorted(extra)}")

    check(cfg, "")
    check(cfg.get("leaderElection", {}), "leaderElection")
    for k in ("leaseDuration", "renewDeadline", "retryPeriod"):
        if not DURATION.match(str(cfg.get("leaderElection", {}).get(k, "1s"))):
            problems.append(f"leaderElection.{k} is not a duration")
    for p in cfg.get("profiles", []):
        check(p, "profiles[]")
    for e in cfg.get("extenders", []):
        check(e, "extenders[]")
        check(e.get("tlsConfig", {}), "extenders[].tlsConfig")
        for m in e.get("managedResources", []):
            check(m, "extenders[].managedResources[]")
        if not DURATION.match(str(e.get("httpTimeout", "1s"))):
            problems.append("extender httpTimeout is not a duration")
    return problems


def check_scheduler_config(docs, deploy, ks, flags, name, ns, listen_port, resources, problems):
    """device-plugin mode: kube-scheduler's profile, Lease and extender."""
    cfg_path = next(a.split("=", 1)[1] for a in ks["command"] if a.startswith("--config="))
    cfg_text = mounted_file(docs, deploy, ks, cfg_path)
    if cfg_text is None:
        fail(problems + [f"kube-scheduler {cfg_path} is not a mounted ConfigMap file"])
    cfg = yaml.safe_load(cfg_text)
    problems += unknown_scheduler_keys(cfg)
    if cfg.get("apiVersion") != "kubescheduler.config.k8s.io/v1":
        problems.append("KubeSchedulerConfiguration is not kubescheduler.config.k8s.io/v1")
    if [p["schedulerName"] for p in cfg["profiles"]] != [name]:
        problems.append(f"kube-scheduler profiles {cfg['profiles']} != [{name}]")
    le = cfg["leaderElection"]
    if not le.get("leaderElect") or le.get("resourceName") != name:
        problems.append(f"leader election {le} is not on the Lease {name}")
    if le.get("resourceNamespace") != flags.get("lease-namespace") or le.get("resourceNamespace") != ns:
        problems.append(
            f"Lease namespace {le.get('resourceNamespace')} != --lease-namespace "
            f"{flags.get('lease-namespace')} / release namespace {ns}"
        )
    (ext,) = cfg["extenders"]
    want = {
        "urlPrefix": f"https://127.0.0.1:{listen_port}",
        "filterVerb": "filter",
        "bindVerb": "bind",
        "nodeCacheCapable": True,
        "tlsConfig": {"insecure": True},
    }
    for k, v in want.items():
        if ext.get(k) != v:
            problems.append(f"extender {k} = {ext.get(k)!r}, want {v!r}")
    managed = {m["name"] for m in ext["managedResources"] if m.get("ignoredByScheduler")}
    if managed != resources or len(resources) != 5:
        problems.append(f"managedResources {sorted(managed)} != resource flags {sorted(resources)}")


def check_dra_wiring(by, flags, problems):
    """mode dra: the DeviceClass, and the RBAC the webhook and node-daemon need."""
    classes = by.get("DeviceClass", [])
    if len(classes) != 1 or classes[0]["metadata"]["name"] != "gpu.gpuslice.dev":
        problems.append(f"mode dra renders {len(classes)} DeviceClass(es), want gpu.gpuslice.dev")
    else:
        spec = classes[0]["spec"]
        if spec.get("selectors") != [{"cel": {"expression": 'device.driver == "gpu.gpuslice.dev"'}}]:
            problems.append(f"DeviceClass selectors {spec.get('selectors')}")
        if spec.get("extendedResourceName") != flags.get("resource-name"):
            problems.append("DeviceClass extendedResourceName differs from --resource-name")

    def grants(resource, verbs):
        return any(
            resource in r.get("resources", []) and set(verbs) <= set(r.get("verbs", []))
            and "resource.k8s.io" in r.get("apiGroups", [])
            for role in by.get("ClusterRole", []) for r in role["rules"]
        )

    for resource, verbs in (("resourceclaimtemplates", ["create"]),
                            ("resourceslices", ["get", "create", "update"]),
                            ("resourceclaims", ["get", "list", "watch"])):
        if not grants(resource, verbs):
            problems.append(f"no ClusterRole grants {verbs} on {resource}")
    if any("kubescheduler.config.k8s.io" in (d.get("data") or {}).get("config.yaml", "")
           for d in by.get("ConfigMap", [])):
        problems.append("mode dra renders a kube-scheduler configuration")


def check_wiring(manifest):
    import base64

    docs = load_docs(manifest)
    problems = []
    by = {}
    for d in docs:
        by.setdefault(d["kind"], []).append(d)

    def one(kind, pred=lambda d: True):
        found = [d for d in by.get(kind, []) if pred(d)]
        if len(found) != 1:
            problems.append(f"expected one {kind}, found {len(found)}")
            return None
        return found[0]

    deploy = one("Deployment")
    if deploy is None:
        fail(problems)
    spec = deploy["spec"]["template"]["spec"]
    ctrs = {c["name"]: c for c in spec["containers"]}
    sw, ks = ctrs.get("scheduler-webhook"), ctrs.get("kube-scheduler")
    flags = flag_values(sw["command"]) if sw else {}
    dra = flags.get("mode") == "dra"
    if not sw or (not ks and not dra):
        fail(problems + ["scheduler pod lacks scheduler-webhook or kube-scheduler"])
    if dra and ks:
        problems.append("mode dra renders a kube-scheduler container (the cluster's own allocates)")
    name = flags.get("scheduler-name")
    ns = deploy["metadata"]["namespace"]
    listen_port = int(flags["listen"].rsplit(":", 1)[1])
    metrics_port = int(flags["metrics-listen"].rsplit(":", 1)[1])
    resources = {v for k, v in flags.items() if k.startswith("resource-")}
    if dra:
        check_dra_wiring(by, flags, problems)
    else:
        check_scheduler_config(docs, deploy, ks, flags, name, ns, listen_port, resources, problems)

    # Ports, probes, Service and webhook.
    ports = {p["name"]: p["containerPort"] for p in sw.get("ports", [])}
    if ports.get("https") != listen_port or ports.get("metrics") != metrics_port:
        problems.append(f"container ports {ports} do not match --listen/--metrics-listen")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz")):
        get = sw.get(probe, {}).get("httpGet", {})
        if get.get("path") != path or get.get("scheme") != "HTTPS":
            problems.append(f"scheduler-webhook {probe} is not HTTPS {path}")
    mwc = one("MutatingWebhookConfiguration")
    if mwc:
        (hook,) = mwc["webhooks"]
        svc_ref = hook["clientConfig"]["service"]
        if svc_ref.get("path") != "/webhook":
            problems.append("webhook path is not /webhook")
        svc = one("Service", lambda d: d["metadata"]["name"] == svc_ref["name"])
        if svc:
            port = next((p for p in svc["spec"]["ports"] if p["port"] == svc_ref.get("port", 443)), None)
            if port is None or port.get("targetPort") not in ("https", listen_port):
                problems.append(f"Service {svc_ref['name']} does not forward port {svc_ref.get('port')} to https")
            sel = svc["spec"]["selector"]
            labels = deploy["spec"]["template"]["metadata"]["labels"]
            if any(labels.get(k) != v for k, v in sel.items()):
                problems.append("webhook Service selector does not match the scheduler pods")
        if svc_ref["namespace"] != ns:
            problems.append("webhook Service namespace is not the release namespace")
        excluded = [
            e for e in hook["namespaceSelector"]["matchExpressions"]
            if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"
        ]
        if not excluded or ns not in excluded[0]["values"]:
            problems.append("the release namespace is not excluded from the webhook")
        pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
        if pod_labels.get("hami.io/webhook") != "ignore":
            problems.append("scheduler pods are not labelled hami.io/webhook=ignore")
        if set(hook["admissionReviewVersions"]) != {"v1", "v1beta1"} or hook["sideEffects"] != "None":
            problems.append("webhook admissionReviewVersions/sideEffects")
        if hook["rules"] != [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                              "resources": ["pods"], "scope": "Namespaced"}]:
            problems.append(f"webhook rules {hook['rules']}")
        # The generated certificate must name the Service and be signed by the bundle's CA.
        secret = next((d for d in by.get("Secret", []) if d.get("type") == "kubernetes.io/tls"), None)
        if secret and hook["clientConfig"].get("caBundle") and not shutil.which("openssl"):
            print("  note: openssl not found; the generated certificate is not verified")
        elif secret and hook["clientConfig"].get("caBundle"):
            if secret["data"]["ca.crt"] != hook["clientConfig"]["caBundle"]:
                problems.append("caBundle differs from the Secret's ca.crt")
            cert = base64.b64decode(secret["data"]["tls.crt"])
            r = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"],
                               input=cert, capture_output=True)
            if r.returncode == 0:
                dns = f"{svc_ref['name']}.{ns}.svc".encode()
                if dns not in r.stdout:
                    problems.append(f"serving certificate lacks DNS name {dns.decode()}")
                with tempfile.TemporaryDirectory() as tmp:
                    ca = os.path.join(tmp, "ca.crt")
                    leaf = os.path.join(tmp, "tls.crt")
                    with open(ca, "wb") as f:
                        f.write(base64.b64decode(secret["data"]["ca.crt"]))
                    with open(leaf, "wb") as f:
                        f.write(cert)
                    v = subprocess.run(["openssl", "verify", "-CAfile", ca, leaf], capture_output=True, text=True)
                    if v.returncode != 0:
                        problems.append(f"serving certificate does not verify against the CA: {v.stdout}{v.stderr}")
                    else:
                        print("  ok: generated serving certificate names the Service and verifies against caBundle")
        elif not secret and "cert-manager.io/inject-ca-from" not in (mwc["metadata"].get("annotations") or {}):
            problems.append("no TLS Secret and no cert-manager CA injection")

    # RBAC of the Lease.
    role = next((d for d in by.get("Role", []) if any(
        "leases" in r.get("resources", []) for r in d["rules"])), None)
    if not dra and (role is None or not any(name in r.get("resourceNames", []) for r in role["rules"])):
        problems.append(f"no Role grants the Lease {name}")

    # node-daemon: socket folder mounted where the config says.
    ds = next(iter(by.get("DaemonSet", [])), None)
    if ds:
        c = ds["spec"]["template"]["spec"]["containers"][0]
        path = next(a.split("=", 1)[1] for a in c["command"] if a.startswith("--config="))
        conf = yaml.safe_load(mounted_file(docs, ds, c, path) or "{}")
        mounts = {m["mountPath"] for m in c["volumeMounts"]}
        if dra != (conf.get("mode") == "dra"):
            problems.append(f"node-daemon mode {conf.get('mode')} differs from the webhook's {flags.get('mode')}")
        keys = ("draPluginDir", "pluginRegistryDir", "cdiDir") if dra else ("devicePluginDir",)
        for key in keys:
            value = str(conf.get(key))
            if not any(value == m or value.startswith(m.rstrip("/") + "/") for m in mounts):
                problems.append(f"node-daemon {key} {conf.get(key)} is not mounted")
        if f"{conf.get('hookPath', '').rstrip('/')}/vgpu" not in mounts:
            problems.append("node-daemon <hookPath>/vgpu is not mounted at the same path")
        if conf.get("resourceName") not in resources:
            problems.append("node-daemon resourceName differs from the scheduler's")
    fail(problems)
    if dra:
        print(f"  ok: mode dra: DeviceClass, webhook/Service, node-daemon folders and DRA RBAC agree (port {listen_port})")
    else:
        print(f"  ok: scheduler profile/Lease/extender/webhook/Service/RBAC agree (scheduler {name}, port {listen_port})")


# ---------------------------------------------------------------- HAMi-core install
def check_hamicore(manifest):
    docs = load_docs(manifest)
    problems = []
    ds = next((d for d in docs if d.get("kind") == "DaemonSet"), None)
    init = (ds or {}).get("spec", {}).get("template", {}).get("spec", {}).get("initContainers", [])
    c = next((i for i in init if i["name"] == "install-hami-core"), None)
    if c is None:
        fail(["no install-hami-core init container"])
    if {m["mountPath"] for m in c["volumeMounts"]} != {"/usr/local/vgpu"}:
        problems.append("install-hami-core must mount the host folder at /usr/local/vgpu only")
    with tempfile.TemporaryDirectory() as tmp:
        src, dst = os.path.join(tmp, "k8s-vgpu/lib/nvidia"), os.path.join(tmp, "usr/local/vgpu")
        os.makedirs(src)
        os.makedirs(dst)
        for name, text in (("libvgpu.so", "v1"), ("ld.so.preload", "/usr/local/vgpu/libvgpu.so\n")):
            with open(os.path.join(src, name), "w", encoding="utf-8") as f:
                f.write(text)
        cmd = [a.replace("/k8s-vgpu/", tmp + "/k8s-vgpu/").replace("/usr/local/vgpu", dst) for a in c["command"]]

        def run():
            r = subprocess.run(cmd, capture_output=True, text=True)
            if r.returncode != 0:
                problems.append(f"install command failed: {r.stderr.strip() or r.stdout.strip()}")
            return r.stdout

        run()
        lib = os.path.join(dst, "libvgpu.so")
        if not os.path.isfile(lib) or not os.path.isfile(os.path.join(dst, "ld.so.preload")):
            problems.append("install command did not install libvgpu.so and ld.so.preload")
            fail(problems)
        first = os.stat(lib)
        run()
        if os.stat(lib).st_ino != first.st_ino or os.stat(lib).st_mtime_ns != first.st_mtime_ns:
            problems.append("a second run rewrote an unchanged libvgpu.so")
        with open(os.path.join(src, "libvgpu.so"), "w", encoding="utf-8") as f:
            f.write("v2")
        run()
        with open(lib, encoding="utf-8") as f:
            if f.read() != "v2":
                problems.append("a changed libvgpu.so was not installed")
        if os.stat(lib).st_ino == first.st_ino:
            problems.append("a changed libvgpu.so was rewritten in place (same inode): running containers would see a torn file")
        leftovers = [n for n in os.listdir(dst) if n.endswith(".tmp")]
        if leftovers:
            problems.append(f"temporary files left behind: {leftovers}")
    fail(problems)
    print("  ok: HAMi-core install: installs both files, idempotent, replaces a changed file by rename")


# ---------------------------------------------------------------- smoke
def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def https_get(port, dns, cafile, path, body=None):
    import http.client
    import socket
    import ssl

    ctx = ssl.create_default_context(cafile=cafile)

    class Conn(http.client.HTTPSConnection):
        def connect(self):
            raw = socket.create_connection(("127.0.0.1", port), timeout=5)
            self.sock = ctx.wrap_socket(raw, server_hostname=dns)

    conn = Conn(dns, port, timeout=5)
    headers = {"Content-Type": "application/json"} if body is not None else {}
    try:
        conn.request("POST" if body is not None else "GET", path, body=body, headers=headers)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def http_get(port, path):
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def wait_for(what, probe, proc, deadline_s=30.0):
    """Polls `probe` until it returns True, the process exits, or the deadline passes."""
    import time

    end = time.monotonic() + deadline_s
    last = None
    while time.monotonic() < end:
        if proc.poll() is not None:
            return f"{what}: process exited with {proc.returncode}"
        try:
            if probe():
                return None
        except OSError as e:  # connection refused while starting
            last = e
        time.sleep(0.1)
    return f"{what}: not true within {deadline_s:.0f} s (last error: {last})"


def check_smoke(manifest, bin_dir):
    import base64
    import time

    docs = load_docs(manifest)
    problems, procs = [], []
    tmp = tempfile.mkdtemp()
    logs = {}

    def start(name, cmd, env=None):
        log = open(os.path.join(tmp, name + ".log"), "w", encoding="utf-8")
        logs[name] = log.name
        p = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
        procs.append(p)
        return p

    try:
        api_port = free_port()
        kubeconfig = os.path.join(tmp, "kubeconfig")
        api = start("fake-apiserver", [os.path.join(bin_dir, "fake-apiserver"),
                                       f"--listen=127.0.0.1:{api_port}", f"--kubeconfig-out={kubeconfig}"])
        err = wait_for("fake-apiserver kubeconfig", lambda: os.path.exists(kubeconfig), api)
        if err:
            fail([err])

        deploy = next(d for d in docs if d.get("kind") == "Deployment")
        ns = deploy["metadata"]["namespace"]
        sw = next(c for c in deploy["spec"]["template"]["spec"]["containers"] if c["name"] == "scheduler-webhook")
        secret = next(d for d in docs if d.get("kind") == "Secret" and d.get("type") == "kubernetes.io/tls")
        mwc = next(d for d in docs if d.get("kind") == "MutatingWebhookConfiguration")
        hook = mwc["webhooks"][0]
        svc = hook["clientConfig"]["service"]
        dns = f"{svc['name']}.{svc['namespace']}.svc"
        files = {}
        for key in ("tls.crt", "tls.key"):
            files[key] = os.path.join(tmp, key)
            with open(files[key], "wb") as f:
                f.write(base64.b64decode(secret["data"][key]))
        cafile = os.path.join(tmp, "ca-bundle.crt")
        with open(cafile, "wb") as f:
            f.write(base64.b64decode(hook["clientConfig"]["caBundle"]))

        port, mport = free_port(), free_port()
        args = []
        for a in sw["command"][2:]:
            flag = a.split("=", 1)[0]
            a = {
                "--listen": f"--listen=127.0.0.1:{port}",
                "--metrics-listen": f"--metrics-listen=127.0.0.1:{mport}",
                "--tls-cert": f"--tls-cert={files['tls.crt']}",
                "--tls-key": f"--tls-key={files['tls.key']}",
            }.get(flag, a)
            args.append(a)
        env = dict(os.environ, HOSTNAME="smoke-scheduler-0")
        sched = start("scheduler-webhook", [os.path.join(bin_dir, "scheduler-webhook"), "serve", *args,
                                            f"--kubeconfig={kubeconfig}"], env)
        t0 = time.monotonic()
        err = wait_for("scheduler-webhook /healthz over TLS verified with the chart's caBundle for " + dns,
                       lambda: https_get(port, dns, cafile, "/healthz")[0] == 200, sched)
        if err:
            problems.append(err)
        else:
            print(f"  ok: /healthz 200 over TLS, certificate verified for {dns} with the chart's caBundle")
            err = wait_for("/readyz", lambda: https_get(port, dns, cafile, "/readyz")[0] == 200, sched)
            if err:
                problems.append(err)
            else:
                print(f"  ok: /readyz 200 after {time.monotonic() - t0:.1f} s (nodes and pods listed)")
            flags = flag_values(sw["command"])
            review = {
                "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                "request": {
                    "uid": "smoke-1", "operation": "CREATE", "namespace": "default",
                    "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "resource": {"group": "", "version": "v1", "resource": "pods"},
                    "object": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "slice"},
                               "spec": {"containers": [{"name": "app", "image": "cuda",
                                        "resources": {"limits": {flags["resource-mem"]: "1000"}}}]}},
                },
            }
            status, body = https_get(port, dns, cafile, hook["clientConfig"]["service"]["path"],
                                     json.dumps(review).encode())
            answer = json.loads(body or b"{}").get("response", {})
            patch = json.loads(base64.b64decode(answer.get("patch", "")) or b"[]")
            routed = any(op.get("path") == "/spec/schedulerName" and op.get("value") == flags["scheduler-name"]
                         for op in patch)
            if status != 200 or not answer.get("allowed") or answer.get("uid") != "smoke-1" or not routed:
                problems.append(f"/webhook did not route a gpumem pod to {flags['scheduler-name']}: {status} {body[:300]!r}")
            else:
                print(f"  ok: /webhook (path from the MutatingWebhookConfiguration) routes a pod asking for "
                      f"{flags['resource-mem']} to {flags['scheduler-name']} ({len(patch)} patch operations)")
            status, body = http_get(mport, "/metrics")
            if status != 200:
                problems.append(f"scheduler-webhook /metrics answered {status}")
            else:
                print(f"  ok: scheduler-webhook /metrics 200 ({len(body)} bytes)")

        # node-daemon with the chart's config file; simulated GPUs when the chart's config says nvml.
        ds = next((d for d in docs if d.get("kind") == "DaemonSet"), None)
        if ds:
            c = ds["spec"]["template"]["spec"]["containers"][0]
            cfg_path = next(a.split("=", 1)[1] for a in c["command"] if a.startswith("--config="))
            conf = yaml.safe_load(mounted_file(docs, ds, c, cfg_path))
            dport = free_port()
            conf.update({
                "devicePluginDir": os.path.join(tmp, "device-plugins"),
                "hookPath": os.path.join(tmp, "hook"),
                "metricsBindAddress": f"127.0.0.1:{dport}",
            })
            if conf.get("deviceSource") != "simulated":
                conf.update({"deviceSource": "simulated", "simulatedGpus": 2})
            os.makedirs(conf["devicePluginDir"])
            local = os.path.join(tmp, "node-daemon.yaml")
            with open(local, "w", encoding="utf-8") as f:
                yaml.safe_dump(conf, f)
            args = [a if not a.startswith("--config=") else f"--config={local}" for a in c["command"][1:]]
            nd = start("node-daemon", [os.path.join(bin_dir, "node-daemon"), *args, f"--kubeconfig={kubeconfig}"],
                       dict(os.environ, NODE_NAME="smoke-node"))
            err = wait_for("node-daemon /healthz", lambda: http_get(dport, "/healthz")[0] == 200, nd)
            if err:
                problems.append(err)
            else:
                status, body = http_get(dport, "/metrics")
                gpus = body.decode().count("gpuslice_gpu_healthy{")
                if status != 200 or gpus == 0:
                    problems.append(f"node-daemon /metrics: {status}, {gpus} GPUs")
                else:
                    print(f"  ok: node-daemon with the chart's config: /healthz 200, /metrics lists {gpus} GPUs")
    finally:
        # Stop in reverse order, each before the next: the API server goes last, so the
        # daemons' shutdown never waits on a vanished API server.
        # Graceful exit on SIGTERM matters (kubelet sends it on every rollout and kills after
        # terminationGracePeriodSeconds); a binary that hangs is reported, then killed.
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                print(f"  WARN: {os.path.basename(p.args[0])} did not exit within 5 s of SIGTERM; killed "
                      "(in a cluster every rollout of it would wait for terminationGracePeriodSeconds)")
        if problems:
            for name, path in logs.items():
                with open(path, encoding="utf-8") as f:
                    tail = f.read().splitlines()[-15:]
                print(f"  --- last lines of {name}:")
                for line in tail:
                    print(f"      {line}")
        import shutil as _sh

        _sh.rmtree(tmp, ignore_errors=True)
    fail(problems)


# ---------------------------------------------------------------- CRDs
def need(problems, obj, path):
    node = obj
    for key in path.split("."):
        if not isinstance(node, dict) or key not in node or node[key] in (None, "", [], {}):
            problems.append(f"{obj['kind']}/{obj['metadata']['name']}: missing {path}")
            return
        node = node[key]


CRD_RULES = {
    ("cert-manager.io/v1", "Issuer"): lambda p, o: (
        None
        if ("selfSigned" in o.get("spec", {}) or "ca" in o.get("spec", {}))
        else p.append(f"Issuer/{o['metadata']['name']}: spec needs selfSigned or ca")
    ),
    ("cert-manager.io/v1", "Certificate"): lambda p, o: [
        need(p, o, "spec.secretName"),
        need(p, o, "spec.issuerRef.name"),
        (o["spec"].get("dnsNames") or o["spec"].get("commonName"))
        or p.append(f"Certificate/{o['metadata']['name']}: needs dnsNames or commonName"),
    ],
    ("monitoring.coreos.com/v1", "ServiceMonitor"): lambda p, o: [
        need(p, o, "spec.selector.matchLabels"),
        need(p, o, "spec.endpoints"),
        all(e.get("port") for e in o["spec"].get("endpoints", []))
        or p.append(f"ServiceMonitor/{o['metadata']['name']}: an endpoint has no port"),
    ],
}


def check_crds(manifest):
    docs = load_docs(manifest)
    problems, seen = [], 0
    by_kind = {(d.get("kind"), d["metadata"]["name"]) for d in docs}
    for d in docs:
        rule = CRD_RULES.get((d.get("apiVersion"), d.get("kind")))
        if rule is None:
            continue
        seen += 1
        rule(problems, d)
        # A Certificate's issuer must be rendered too, unless it is an external ClusterIssuer.
        if d["kind"] == "Certificate":
            ref = d["spec"]["issuerRef"]
            if ref.get("kind", "Issuer") == "Issuer" and ("Issuer", ref["name"]) not in by_kind:
                print(f"  note: Certificate/{d['metadata']['name']} uses an Issuer not in this chart: {ref['name']}")
    # The MutatingWebhookConfiguration must get its CA from somewhere.
    for d in docs:
        if d.get("kind") == "MutatingWebhookConfiguration":
            injected = "cert-manager.io/inject-ca-from" in (d["metadata"].get("annotations") or {})
            for w in d["webhooks"]:
                if not injected and not w["clientConfig"].get("caBundle"):
                    problems.append(f"MutatingWebhookConfiguration {w['name']}: no caBundle and no CA injection")
    fail(problems)
    print(f"  ok: {seen} custom resources have their required fields; webhook CA present")


def main():
    if len(sys.argv) >= 3 and sys.argv[1] == "values":
        check_values(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "flags":
        check_flags(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "wiring":
        check_wiring(sys.argv[2])
    elif len(sys.argv) >= 3 and sys.argv[1] == "hamicore":
        check_hamicore(sys.argv[2])
    elif len(sys.argv) >= 4 and sys.argv[1] == "smoke":
        check_smoke(sys.argv[2], sys.argv[3])
    elif len(sys.argv) >= 3 and sys.argv[1] == "crds":
        check_crds(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
