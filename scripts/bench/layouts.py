#!/usr/bin/python3
"""The composed layouts beside plain data parallelism at the same rank count and global batch:
MoE layers with ZeRO stages 2 and 3 (experts sharded over the ranks holding them) and with tensor
parallelism (experts split over the tensor ranks) at 2 ranks; at 4 ranks (more ranks than this
machine's 2 cores: times there show traffic and waiting, not speed) ZeRO stage 3 over
tensor-parallel slices and MoE layers over dp 2 x tp 2 with ep 2 and with ZeRO-3. For each: the
step time against plain DP's (medians over interleaved rounds), rank 0's memory by state as
predicted and as measured, and its bytes per step by group and operation (over the run, divided
by its steps). Writes results/layouts.json."""
import statistics

from benchlib import cpu_model
from benchlib import arguments, train, write_result

DENSE = ["--dataset", "teacher", "--layers", 8, "--hidden", 512, "--input-dim", 512, "--output-dim", 16,
         "--global-batch", 256, "--micro-batches", 2]
MOE = DENSE + ["--moe-every", 2, "--experts", 8, "--top-k", 2]
# (name, ranks, model, options): each against the plain data-parallel run of its model and ranks.
LAYOUTS = [
    ("dense dp 2", 2, DENSE, []),
    ("MoE dp 2", 2, MOE, []),
    ("MoE dp 2, ZeRO-2", 2, MOE, ["--zero", 2]),
    ("MoE dp 2, ZeRO-3", 2, MOE, ["--zero", 3]),
    ("MoE tp 2", 2, MOE, ["--tp", 2]),
    ("dense dp 4", 4, DENSE, []),
    ("dense dp 2 x tp 2, ZeRO-3", 4, DENSE, ["--tp", 2, "--zero", 3]),
    ("MoE dp 4", 4, MOE, []),
    ("MoE ep 2, ZeRO-3", 4, MOE, ["--ep", 2, "--zero", 3]),
    ("MoE dp 2 x tp 2, ep 2", 4, MOE, ["--tp", 2, "--ep", 2]),
]
STATES = ("params", "grads", "optimizer", "activations", "comm_buffers")


def main():
    args = arguments(__doc__, rounds=3, steps=10, result_file="layouts.json").parse_args()
    times = {name: [] for name, _, _, _ in LAYOUTS}
    summaries = {}
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        for index, (name, ranks, model, options) in enumerate(LAYOUTS):
            step_ms, summaries[name] = train(ranks, model + options + ["--steps", args.steps], f"layouts-{index}")
            times[name].append(step_ms)
    rows = []
    for name, ranks, model, options in LAYOUTS:
        reference = f"{'MoE' if model is MOE else 'dense'} dp {ranks}"
        summary = summaries[name]
        placement = summary["placement"]
        rows.append({
            "layout": name, "ranks": ranks, "options": " ".join(map(str, options)),
            "step_ms": statistics.median(times[name]),
            "step_over_plain_dp": statistics.median(times[name]) / statistics.median(times[reference]),
            "memory_bytes": {state: {"predicted": placement[state]["predicted_bytes"],
                                     "measured": placement[state]["measured_bytes"]} for state in STATES},
            "comm_buffers_bytes_measured": summary["peak_mem_bytes"]["comm_buffers"],
            "bytes_per_step_by_group": summary["comm_bytes_by_group"],
            "samples": times[name]})
    write_result(args.output, dict(dense_model=" ".join(map(str, DENSE)),
                                   moe_model=" ".join(map(str, MOE)), layouts=rows))
    print(f"cpu: {cpu_model()}")
    for row in rows:
        memory = ", ".join(f"{state} {entry['predicted']}/{entry['measured']}" for state, entry in row["memory_bytes"].items())
        groups = "; ".join(f"{group}: " + ", ".join(f"{op} {int(value)}" for op, value in ops.items())
                           for group, ops in row["bytes_per_step_by_group"].items())
        print(f"{row['layout']:28s} step {row['step_ms']:8.1f} ms ({row['step_over_plain_dp']:.2f} of plain DP)\n"
              f"    memory predicted/measured: {memory}\n    bytes per step: {groups}")


if __name__ == "__main__":
    main()
