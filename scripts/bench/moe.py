#!/usr/bin/python3
"""Expert parallelism against plain data parallelism on the same MoE model, in one run: at 2 ranks
(each bound to a core), E = 8 experts, top-2, hidden 1024, global batch 512, two MoE layers of
four. The two layouts alternate over --rounds rounds; the result is the ratio of their median step
times, each rank's expert parameter memory under both (from the measured params bytes less the
dense part), and the all-to-all bytes per step predicted from the routing counts and measured.

Writes results/moe.json."""
import statistics

from benchlib import arguments, interleaved_rounds, train as train_run, write_result

HIDDEN, EXPERTS, INPUT, OUTPUT, LAYERS = 1024, 8, 256, 10, 4
MODEL = ["--dataset", "mixture", "--layers", LAYERS, "--hidden", HIDDEN, "--input-dim", INPUT,
         "--output-dim", OUTPUT, "--moe-every", "1", "--experts", EXPERTS, "--top-k", "2",
         "--global-batch", "512"]
LAYOUTS = {"data_parallel": ["--dp", "2"], "expert_parallel": ["--dp", "2", "--ep", "2"]}


def main():
    args = arguments(__doc__, rounds=3, steps=12, result_file="moe.json").parse_args()
    times, summaries = interleaved_rounds(
        args.rounds, LAYOUTS,
        lambda name, flags: train_run(2, MODEL + flags + ["--steps", args.steps], f"moe-{name}", bind_to_cores=True))
    step_ms = {name: statistics.median(values) for name, values in times.items()}
    # Dense layers 0 and 3 and the two routers are replicated; the rest of params is experts.
    dense_bytes = 4 * ((INPUT + 1) * HIDDEN + (HIDDEN + 1) * OUTPUT + 2 * EXPERTS * HIDDEN)
    expert_bytes = {name: [peaks["params"] - dense_bytes for peaks in summary["peak_mem_bytes_by_rank"]]
                    for name, summary in summaries.items()}
    exchanged = summaries["expert_parallel"]["comm_per_step"]["all_to_all"]
    result = {
        "step_ms": step_ms,
        "expert_parallel_over_data_parallel": step_ms["expert_parallel"] / step_ms["data_parallel"],
        "expert_parameter_bytes_by_rank": expert_bytes,
        "expert_parameter_memory_ratio": max(expert_bytes["expert_parallel"]) /
                                         max(expert_bytes["data_parallel"]),
        "all_to_all_bytes_per_step": exchanged,
        "all_reduce_bytes_per_step": {name: summary["comm_per_step"]["all_reduce"]["measured_bytes"]
                                      for name, summary in summaries.items()},
        "targets": {"expert parallel step time over data parallel": "<= 1.2",
                    "expert parameter memory per rank over data parallel": "0.5"},
        "samples": times,
    }
    write_result(args.output, result)
    print(f"expert parallel: {result['expert_parallel_over_data_parallel']:.3f} x the data-parallel "
          f"step time ({step_ms['expert_parallel']:.1f} vs {step_ms['data_parallel']:.1f} ms); expert "
          f"parameters per rank {result['expert_parameter_memory_ratio']:.3f} x; all-to-all "
          f"{exchanged['measured_bytes'] / 2**20:.2f} MiB per step (predicted "
          f"{exchanged['predicted_bytes'] / 2**20:.2f} MiB)")


if __name__ == "__main__":
    main()
