#!/usr/bin/env python3
"""Plays the scheduler for e2e_fakes.sh: per pod, take the node lock, create
the pod bound to node-a with the HAMi annotations, wait for bind-phase=success
and the lock release; prints p50/p99 of that round trip.

Usage: e2e_drive.py APISERVER_URL N
"""
import json, sys, time, urllib.request, datetime
S, N = sys.argv[1], int(sys.argv[2])
def req(method, path, body=None, ctype="application/json"):
    r = urllib.request.Request(S + path, method=method, data=None if body is None else json.dumps(body).encode(), headers={"content-type": ctype})
    with urllib.request.urlopen(r) as f: return json.load(f)
node = req("GET", "/api/v1/nodes/node-a")
uuids = [d["id"] for d in json.loads(node["metadata"]["annotations"]["hami.io/node-nvidia-register"])]
lat = []
for i in range(N):
    g = uuids[i % len(uuids)]
    d = f"{g},NVIDIA,400,5:;"
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    t0 = time.monotonic()
    req("PATCH", "/api/v1/nodes/node-a", {"metadata": {"annotations": {"hami.io/mutex.lock": f"{now},default,p{i}"}}}, "application/merge-patch+json")
    req("POST", "/api/v1/namespaces/default/pods", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}", "namespace": "default", "annotations": {
        "hami.io/vgpu-node": "node-a", "hami.io/bind-phase": "allocating", "hami.io/bind-time": str(int(time.time())),
        "hami.io/vgpu-devices-to-allocate": d, "hami.io/vgpu-devices-allocated": d}},
        "spec": {"nodeName": "node-a", "containers": [{"name": "app", "image": "x", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}})
    while True:
        p = req("GET", f"/api/v1/namespaces/default/pods/p{i}")
        phase = p["metadata"]["annotations"].get("hami.io/bind-phase")
        if phase in ("success", "failed") or p.get("status", {}).get("phase") == "Failed": break
        time.sleep(0.002)
    assert phase == "success", (i, phase, p.get("status"))
    while req("GET", "/api/v1/nodes/node-a")["metadata"]["annotations"].get("hami.io/mutex.lock") is not None:
        time.sleep(0.002)
    lat.append(time.monotonic() - t0)
lat.sort()
print(f"{N} pods, lock -> bound -> admitted -> success -> lock released: p50 {lat[len(lat)//2]*1000:.1f} ms, p99 {lat[min(len(lat)-1, int(len(lat)*0.99))]*1000:.1f} ms, max {lat[-1]*1000:.1f} ms")
