#!/usr/bin/python3
"""Tensor parallelism's speed and memory benchmark, measured side by side in one run: on a wide
model (10 layers, width 2048, input 2048, 10 classes) with a global batch of 256 at 2 ranks, the
step time of --tp 2 against plain data parallelism (--dp 2) at the same global batch, interleaved
over --rounds rounds (medians), and the parameter memory per rank against one process.
Writes results/tensor_parallel.json."""
import statistics

from benchlib import arguments, train, write_result

MODEL = ["--dataset", "mixture", "--layers", "10", "--hidden", "2048", "--input-dim", "2048",
         "--output-dim", "10", "--global-batch", "256"]


def main():
    args = arguments(__doc__, rounds=3, steps=8, result_file="tensor_parallel.json").parse_args()
    samples = {"dp": [], "tp": []}
    summaries = {}
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        for name, layout in (("dp", ["--dp", "2"]), ("tp", ["--tp", "2"])):
            step_ms, summaries[name] = train(2, MODEL + layout + ["--steps", args.steps], "tp-" + name)
            samples[name].append(step_ms)
    _, summaries["one"] = train(1, MODEL + ["--steps", 1], "tp-one")
    params = {name: summaries[name]["peak_mem_bytes_by_rank"][0]["params"] for name in summaries}
    comm = summaries["tp"]["comm_per_step"]["all_reduce"]
    result = {
        "step_ms": {name: statistics.median(values) for name, values in samples.items()},
        "tp_step_time_over_dp": statistics.median(samples["tp"]) / statistics.median(samples["dp"]),
        "params_bytes_per_rank": params,
        "tp_params_per_rank_over_one_process": params["tp"] / params["one"],
        "tp_all_reduce_bytes_per_step": comm,
        "targets": {"tp_step_time_over_dp": "<= 1.3", "tp_params_per_rank_over_one_process": "<= 0.52"},
        "samples": samples,
    }
    write_result(args.output, result)
    print(f"TP step time / DP step time: {result['tp_step_time_over_dp']:.3f} "
          f"(TP {result['step_ms']['tp']:.1f} ms, DP {result['step_ms']['dp']:.1f} ms)")
    print(f"TP parameters per rank / one process: {result['tp_params_per_rank_over_one_process']:.4f}")


if __name__ == "__main__":
    main()
