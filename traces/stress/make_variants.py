#!/usr/bin/env python3
"""Stress variants of openb's default pod list, for checking `simulate` on
workload mixes the public traces do not have (docs/benchmarks.md, "The bound
on workloads it was not built on").

Each variant keeps the default list's pods (CPU, memory, GPU request) and
resamples them, with a fixed seed, to another mix of CPU-only, fractional,
one-GPU and multi-GPU pods; `spec60*` also pins 60 % of the GPU pods to GPU
models. Writes `<variant>.csv` (same columns as the openb lists) into the
folder given (default: this one).

    python3 traces/stress/make_variants.py /tmp/variants
"""
import csv
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.join(HERE, "..", "openb", "openb_pod_list_default.csv")
SPEC_SOURCE = os.path.join(HERE, "..", "openb", "openb_pod_list_gpuspec33.csv")


def main(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    rows = list(csv.DictReader(open(SOURCE)))
    header = list(rows[0].keys())
    cpu = [r for r in rows if int(r["num_gpu"]) == 0]
    frac = [r for r in rows if int(r["num_gpu"]) == 1 and int(r["gpu_milli"]) < 1000]
    one = [r for r in rows if int(r["num_gpu"]) == 1 and int(r["gpu_milli"]) == 1000]
    multi = [r for r in rows if int(r["num_gpu"]) > 1]
    only810 = [r for r in frac if r["gpu_milli"] == "810"]
    n = len(rows)
    as_is = [(cpu, len(cpu) / n), (frac, len(frac) / n), (one, len(one) / n), (multi, len(multi) / n)]
    # Uniform over six pins (one model, A10, has 2 GPUs in the cluster), or
    # the pins of gpuspec33's pinned pods, with their frequencies.
    uniform = ["V100M16|V100M32", "T4", "G2", "P100", "G3", "A10"]
    published = [r["gpu_spec"] for r in csv.DictReader(open(SPEC_SOURCE))
                 if int(r["num_gpu"]) > 0 and r["gpu_spec"]]

    def write(name, mix, pins=None):
        rng = random.Random(0)
        out = []
        for k in range(n):
            u, acc = rng.random(), 0.0
            pool = mix[-1][0]
            for candidates, weight in mix:
                acc += weight
                if u < acc:
                    pool = candidates
                    break
            r = dict(rng.choice(pool))
            if pins and int(r["num_gpu"]) > 0 and rng.random() < 0.6:
                r["gpu_spec"] = rng.choice(pins)
            r["name"] = f"stress-{k:05d}"
            out.append(r)
        with open(os.path.join(out_dir, f"{name}.csv"), "w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=header)
            w.writeheader()
            w.writerows(out)

    write("lots810", [(cpu, 0.1), (only810, 0.5), (frac, 0.2), (one, 0.2)])
    write("share90", [(cpu, 0.1), (frac, 0.8), (one, 0.05), (multi, 0.05)])
    write("share20", [(cpu, 0.13), (frac, 0.1), (one, 0.57), (multi, 0.2)])
    write("multi80", [(cpu, 0.1), (frac, 0.1), (one, 0.1), (multi, 0.7)])
    write("cpu50", [(cpu, 0.5), (frac, 0.2), (one, 0.25), (multi, 0.05)])
    write("spec60", as_is, uniform)
    write("spec60-published", as_is, published)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else HERE)
