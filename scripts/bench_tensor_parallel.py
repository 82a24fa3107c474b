#!/usr/bin/env python3
"""Tensor parallelism's speed and memory benchmark, measured side by side in one run: on a wide
model (10 layers, width 2048, input 2048, 10 classes) with a global batch of 256 at 2 ranks, the
step time of --tp 2 against plain data parallelism (--dp 2) at the same global batch, interleaved
over --rounds rounds (medians), and the parameter memory per rank against one process.
Writes results/tensor_parallel.json."""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
MODEL = ["--dataset", "mixture", "--layers", "10", "--hidden", "2048", "--input-dim", "2048",
         "--output-dim", "10", "--global-batch", "256", "--log-every", "0"]


def train(ranks, layout, steps):
    metrics = os.path.join(BUILD, f"bench-tp-{ranks}-{'-'.join(layout)}.jsonl")
    subprocess.run(["mpiexec.mpich", "-n", str(ranks), os.path.join(BUILD, "mlptrain")] + MODEL + layout +
                   ["--steps", str(steps), "--metrics", metrics],
                   check=True, capture_output=True, env=dict(os.environ, OPENBLAS_NUM_THREADS="1"))
    with open(metrics) as handle:
        records = [json.loads(line) for line in handle]
    step_ms = [r["step_ms"] for r in records if not r.get("summary")][2:]  # skip warm-up
    return (statistics.median(step_ms) if step_ms else None), records[-1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--output", default=os.path.join(ROOT, "results", "tensor_parallel.json"))
    args = parser.parse_args()
    samples = {"dp": [], "tp": []}
    summaries = {}
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        for name, layout in (("dp", ["--dp", "2"]), ("tp", ["--tp", "2"])):
            step_ms, summaries[name] = train(2, layout, args.steps)
            samples[name].append(step_ms)
    _, summaries["one"] = train(1, [], 1)
    params = {name: summaries[name]["peak_mem_bytes_by_rank"][0]["params"] for name in summaries}
    comm = summaries["tp"]["comm_per_step"]["all_reduce"]
    result = {
        "date": datetime.date.today().isoformat(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
        "command": "scripts/bench_tensor_parallel.py " + " ".join(sys.argv[1:]),
        "step_ms": {name: statistics.median(values) for name, values in samples.items()},
        "tp_step_time_over_dp": statistics.median(samples["tp"]) / statistics.median(samples["dp"]),
        "params_bytes_per_rank": params,
        "tp_params_per_rank_over_one_process": params["tp"] / params["one"],
        "tp_all_reduce_bytes_per_step": comm,
        "targets": {"tp_step_time_over_dp": "<= 1.3", "tp_params_per_rank_over_one_process": "<= 0.52"},
        "samples": samples,
    }
    os.makedirs(os.path.dirname(args.output), exist_ok=True)
    with open(args.output, "w") as handle:
        json.dump(result, handle, indent=2)
    print(f"TP step time / DP step time: {result['tp_step_time_over_dp']:.3f} "
          f"(TP {result['step_ms']['tp']:.1f} ms, DP {result['step_ms']['dp']:.1f} ms)")
    print(f"TP parameters per rank / one process: {result['tp_params_per_rank_over_one_process']:.4f}")
    print(f"bench: wrote {args.output}")


if __name__ == "__main__":
    main()
