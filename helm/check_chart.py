#!/usr/bin/env python3
"""Checks of the gpuslice chart that helm and kubernetes-validate cannot do (used by helm/ci.sh).

  check_chart.py values CHART_DIR
      every leaf of values.yaml has a comment above it and a schema entry with a description.
  check_chart.py flags MANIFEST BIN_DIR
      every flag and env var the rendered chart passes to scheduler-webhook / node-daemon
      appears in that binary's --help, and the binary accepts the whole command line and the
      rendered config file (--print-config, which parses and validates, then exits).
  check_chart.py crds MANIFEST
      the custom resources kubernetes-validate has no schema for (cert-manager, Prometheus
      Operator) have the fields their controllers require, and the webhook has a CA bundle or
      a CA injection.

Needs PyYAML (a dependency of kubernetes-validate). Exit 1 with one line per problem.
"""

import json
import os
import re
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
    elif len(sys.argv) >= 3 and sys.argv[1] == "crds":
        check_crds(sys.argv[2])
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
