#!/usr/bin/python3
"""A kernel table of a training step from Nsight Compute: each kernel's calls, time
(gpu__time_duration.sum), the bytes it moved to and from DRAM (dram__bytes_read.sum +
dram__bytes_write.sum) and their rate against the device's copy rate, and each kernel's share of
the GPU's time, over one whole step: the launches after one call of the step's last kernel (its
update) up to the next, where the profile holds two. GEMMs (cuBLAS's kernels) are counted apart
from the rest, which memory bounds.

usage: ncu --clock-control none --csv --print-units base \\
           --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \\
           --launch-skip S --launch-count N PROGRAM ... > profile.csv
       scripts/gpu/ncu_kernels.py profile.csv --copy-gbps RATE [--output kernels_ncu.json] [--step-ends-with KERNEL]
RATE is a device copy's rate in GB/s (layerbench's kernel table measures it in the same run)."""
import argparse
import csv
import json
import re
import sys


def short_name(kernel):
    """The kernel's name without its namespaces, template arguments and parameters."""
    name = kernel.replace("(anonymous namespace)::", "")
    depth, result = 0, []
    for character in name:
        depth += character in "<("
        if depth == 0:
            result.append(character)
        depth -= character in ">)"
    return re.sub(r"^void ", "", "".join(result)).split("::")[-1].strip()


def is_gemm(name):
    return any(mark in name.lower() for mark in ("gemm", "sm90_xmma", "cutlass", "nvjet", "cublas"))


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", help="ncu's CSV output")
    parser.add_argument("--copy-gbps", type=float, required=True, help="a device copy's rate, GB/s")
    parser.add_argument("--output", help="write the table as JSON here (else print it)")
    parser.add_argument("--step-ends-with", default="adamw_kernel", metavar="KERNEL",
                        help="the kernel that ends a training step, its update (default adamw_kernel): where the "
                             "profile holds two of its calls, the table covers the launches after the first up to "
                             "the second, one whole step; '' keeps every launch")
    args = parser.parse_args()
    launches = {}
    with open(args.profile) as handle:
        lines = [line for line in handle if line.startswith('"')]
    for row in csv.DictReader(lines):
        launch = launches.setdefault(int(row["ID"]), {"kernel": short_name(row["Kernel Name"])})
        launch[row["Metric Name"]] = float(row["Metric Value"].replace(",", ""))
    # A window of launches rarely starts where a step does: a table of part of one step and part
    # of the next misses some of its GEMMs and counts others twice.
    ordered = [launches[launch_id] for launch_id in sorted(launches)]
    ends = [index for index, launch in enumerate(ordered) if launch["kernel"] == args.step_ends_with]
    whole_step = bool(args.step_ends_with) and len(ends) >= 2
    if whole_step:
        ordered = ordered[ends[0] + 1:ends[1] + 1]
    elif args.step_ends_with:
        print(f"ncu_kernels: fewer than two {args.step_ends_with} launches in the profile: the table covers every "
              "launch, not one whole step", file=sys.stderr)
    kernels = {}
    for launch in ordered:
        entry = kernels.setdefault(launch["kernel"], {"kernel": launch["kernel"], "calls": 0, "ns": 0.0, "bytes": 0.0})
        entry["calls"] += 1
        entry["ns"] += launch.get("gpu__time_duration.sum", 0.0)
        entry["bytes"] += launch.get("dram__bytes_read.sum", 0.0) + launch.get("dram__bytes_write.sum", 0.0)
    total_ns = sum(entry["ns"] for entry in kernels.values()) or 1.0
    table = []
    for entry in sorted(kernels.values(), key=lambda entry: -entry["ns"]):
        gbps = entry["bytes"] / entry["ns"] if entry["ns"] else 0.0  # bytes per ns is GB/s
        table.append({"kernel": entry["kernel"], "gemm": is_gemm(entry["kernel"]), "calls": entry["calls"],
                      "ms": entry["ns"] / 1e6, "mean_ms": entry["ns"] / 1e6 / entry["calls"],
                      "share_of_gpu_time": entry["ns"] / total_ns, "dram_bytes": entry["bytes"],
                      "gbytes_per_s": gbps, "of_copy_rate": gbps / args.copy_gbps})
    result = {"copy_gbps": args.copy_gbps, "whole_step": whole_step, "gpu_ms": total_ns / 1e6,
              "gemm_share_of_gpu_time": sum(row["share_of_gpu_time"] for row in table if row["gemm"]),
              "kernels": table}
    if args.output:
        with open(args.output, "w") as handle:
            json.dump(result, handle, indent=1)
    for row in table:
        print(f"{row['kernel'][:60]:60s} {row['calls']:5d} {row['mean_ms']:8.3f} ms {100 * row['share_of_gpu_time']:5.1f} % "
              f"{row['gbytes_per_s']:7.0f} GB/s {row['of_copy_rate']:5.2f}" + ("  (GEMM)" if row["gemm"] else ""))
    print(f"GEMMs: {100 * result['gemm_share_of_gpu_time']:.1f} % of {result['gpu_ms']:.2f} ms of GPU time", file=sys.stderr)


if __name__ == "__main__":
    main()
