#!/usr/bin/python3
"""mlpplan at scale: every layout of a world ranked for a large model on a multi-node preset, drawn
as memory per rank against predicted step time with the Pareto front (the layouts no other beats
in both); the 4,096-rank enumeration timed; and mlpplan's own time and peak memory for one layout
as the world grows (flat: one rank per pipeline stage stands for the world). Writes
results/plan_pareto.json and .png.

usage: scripts/experiments/plan_pareto.py [--world N] [--cluster PRESET] [--output FILE]"""
import argparse
import json
import os
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
import benchlib  # noqa: E402

PLAN = os.path.join(benchlib.BUILD, "mlpplan")
# About 7.5 B parameters (the ZeRO paper's model size) in bf16 with fp32 AdamW.
MODEL = ["--layers", 112, "--hidden", 8192, "--input-dim", 8192, "--output-dim", 8192,
         "--param-dtype", "bf16", "--reduce-dtype", "bf16"]


def timed_plan(arguments):
    """mlpplan's rows, its wall time and its peak resident memory (bytes)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    started = time.perf_counter()
    output = subprocess.run([PLAN] + [str(a) for a in arguments] + ["--json"], capture_output=True, text=True,
                            check=True).stdout
    seconds = time.perf_counter() - started
    peak = max(before, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss) * 1024
    return [json.loads(line) for line in output.splitlines()], seconds, peak


def pareto(rows):
    front, best = [], float("inf")
    for row in sorted(rows, key=lambda r: (r["step_ms"]["total"], r["memory_bytes"]["total"])):
        if row["memory_bytes"]["total"] < best:
            front.append(row)
            best = row["memory_bytes"]["total"]
    return front


def name(layout):
    text = f"dp{layout['dp']} tp{layout['tp']} pp{layout['pp']} z{layout['zero']} mb{layout['micro_batches']}"
    return text + (" rc" if layout["recompute"] else "")


def plot(rows, front, capacity, title, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(9, 6))
    for fits, color in ((True, "tab:blue"), (False, "tab:gray")):
        chosen = [r for r in rows if r["fits"] == fits]
        axis.scatter([r["step_ms"]["total"] for r in chosen], [r["memory_bytes"]["total"] / 1e9 for r in chosen],
                     s=8, color=color, alpha=0.5, label="fits" if fits else "does not fit")
    axis.plot([r["step_ms"]["total"] for r in front], [r["memory_bytes"]["total"] / 1e9 for r in front], "o-",
              color="tab:red", label="Pareto front")
    for row in front[:3]:
        axis.annotate(name(row["layout"]), (row["step_ms"]["total"], row["memory_bytes"]["total"] / 1e9),
                      fontsize=7, xytext=(4, 4), textcoords="offset points")
    axis.axhline(capacity / 1e9, color="k", linestyle="--", linewidth=0.8, label="device memory")
    axis.set(xscale="log", yscale="log", xlabel="predicted step time (ms)", ylabel="memory of the largest rank (GB)",
             title=title)
    axis.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--world", type=int, default=256)
    parser.add_argument("--cluster", default="h100-sxm-8")
    parser.add_argument("--output", default=os.path.join(benchlib.ROOT, "results", "plan_pareto.json"))
    args = parser.parse_args()
    common = MODEL + ["--cluster", args.cluster, "--layouts", "all", "--micro-batch-choices", "1,2,4,8,16"]
    # First, while the children's peak memory is still theirs alone (it is a maximum over them).
    flat = []
    for world in (8, 4096, 1_000_000):
        _, took, peak = timed_plan(MODEL + ["--cluster", args.cluster, "--world", world, "--global-batch", 4 * world,
                                            "--zero", 3, "--tp", 8])
        flat.append({"world": world, "seconds": took, "peak_resident_bytes": peak})
        print(f"plan_pareto: one layout of {world} ranks: {took:.3f} s, peak {peak / 2 ** 20:.1f} MiB")
    rows, seconds, _ = timed_plan(common + ["--world", args.world, "--global-batch", 4 * args.world])
    front = pareto([r for r in rows if r["fits"]])
    print(f"plan_pareto: {len(rows)} layouts of {args.world} ranks in {seconds:.2f} s, "
          f"{sum(r['fits'] for r in rows)} fit, {len(front)} on the Pareto front")
    big, big_seconds, _ = timed_plan(common + ["--world", 4096, "--global-batch", 16384])
    print(f"plan_pareto: {len(big)} layouts of 4096 ranks in {big_seconds:.2f} s")
    benchlib.write_result(args.output, {
        "cluster": args.cluster, "model": " ".join(map(str, MODEL)),
        "world": args.world, "layouts": len(rows), "fitting": sum(r["fits"] for r in rows),
        "enumeration_seconds": seconds, "layouts_4096": len(big), "enumeration_4096_seconds": big_seconds,
        "one_layout_by_world": flat,
        "pareto_front": [{"layout": r["layout"], "memory_bytes": r["memory_bytes"]["total"],
                          "step_ms": r["step_ms"], "bus_bytes_per_step": r["bus_bytes_per_step"]} for r in front]})
    plot(rows, front, rows[0]["memory_capacity_bytes"],
         f"{args.world} ranks of {args.cluster}, 7.5 B parameters (bf16, fp32 AdamW), batch {4 * args.world}",
         os.path.splitext(args.output)[0] + ".png")


if __name__ == "__main__":
    main()
