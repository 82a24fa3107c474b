#!/usr/bin/python3
"""Hybrid sharding against ZeRO-3 and plain data parallelism, on ranks split into simulated nodes:

  mpiexec -launcher fork -hosts nodeA:2,nodeB:2 puts ranks 0-1 and 2-3 on two "nodes" of this
  machine (MPICH takes its node map from the launcher), UCX_TLS=tcp,self sends what crosses them
  over TCP, and inside a node MPICH's shared memory and mlptrain's shared-memory collectives work
  as on one host. For each layout (plain DP, ZeRO-3 over the 4 ranks, hybrid ZeRO-3 over the 2
  ranks of a node; ZeRO-1 and hybrid ZeRO-1 beside them), interleaved over --rounds rounds:

  * memory per rank by state (the ledger's peaks, the largest rank);
  * bytes per step within and across nodes, in bus bytes (nccl-tests' size x bus factor), from
    the ledger's bytes by group, and as mlpplan predicts them for the same layout and nodes;
  * the step time (median over the rounds' medians).

Writes results/hybrid_sharding.json and .png."""
import json
import os
import statistics
import subprocess

from benchlib import BUILD, arguments, interleaved_rounds, train, write_result

NODES = 2
RANKS_PER_NODE = 2
RANKS = NODES * RANKS_PER_NODE
LAUNCH = ["-launcher", "fork", "-hosts", ",".join(f"node{index}:{RANKS_PER_NODE}" for index in range(NODES))]
ACROSS_NODES_BY_TCP = {"UCX_TLS": "tcp,self"}
MODEL = ["--dataset", "mixture", "--layers", 6, "--hidden", 1024, "--input-dim", 1024, "--output-dim", 16,
         "--global-batch", 256]
LAYOUTS = {
    "plain DP": ["--zero", 0],
    "ZeRO-1": ["--zero", 1],
    "hybrid ZeRO-1": ["--zero", 1, "--zero-shard-size", RANKS_PER_NODE],
    "ZeRO-3": ["--zero", 3],
    "hybrid ZeRO-3": ["--zero", 3, "--zero-shard-size", RANKS_PER_NODE],
}
# nccl-tests' bus factors (what each rank's links carry per byte of the operation's size).
BUS_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
              "all_gather": lambda n: (n - 1) / n, "all_to_all": lambda n: (n - 1) / n,
              "broadcast": lambda n: 1.0, "send": lambda n: 1.0, "recv": lambda n: 0.0}
# Rank 0's groups at dp 4 in two nodes of two: their sizes and whether they cross nodes.
GROUPS = {"world": (RANKS, True), "dp": (RANKS, True), "dp_shard": (RANKS_PER_NODE, False),
          "dp_replica": (NODES, True)}


def measured_bus_bytes(by_group):
    links = {"intra_node": 0.0, "inter_node": 0.0}
    for group, operations in by_group.items():
        size, crosses = GROUPS[group]
        for op, size_bytes in operations.items():
            links["inter_node" if crosses else "intra_node"] += size_bytes * BUS_FACTOR[op](size)
    return links


def planned(flags):
    command = [os.path.join(BUILD, "mlpplan"), "--world", RANKS, "--ranks-per-node", RANKS_PER_NODE, "--json"]
    output = subprocess.run([str(part) for part in command + MODEL + flags], capture_output=True, text=True,
                            check=True).stdout
    return json.loads(output)


def draw(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    names = list(result["layouts"])
    rows = [result["layouts"][name] for name in names]
    figure, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    positions = range(len(names))
    model_state = [row["memory_bytes"]["params"] + row["memory_bytes"]["grads"] + row["memory_bytes"]["optimizer"]
                   for row in rows]
    axes[0].bar(positions, [bytes_ / 2**20 for bytes_ in model_state], color="#4878a8")
    axes[0].set_title("model state per rank (MiB)")
    width = 0.38
    axes[1].bar([p - width / 2 for p in positions], [row["bus_bytes_per_step"]["intra_node"] / 2**20 for row in rows],
                width, label="within a node", color="#6aa84f")
    axes[1].bar([p + width / 2 for p in positions], [row["bus_bytes_per_step"]["inter_node"] / 2**20 for row in rows],
                width, label="across nodes", color="#cc4125")
    axes[1].set_title("bus bytes per step and rank (MiB)")
    axes[1].legend()
    axes[2].bar(positions, [row["step_ms"] for row in rows], color="#8e7cc3")
    axes[2].set_title("step time (ms)")
    for axis in axes:
        axis.set_xticks(list(positions))
        axis.set_xticklabels(names, rotation=20, fontsize=8)
    figure.suptitle(f"{RANKS} ranks in {NODES} simulated nodes (TCP across), 6 x 1024 MLP, fp32 — {result['cpu']}",
                    fontsize=9)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main():
    args = arguments(__doc__, rounds=3, steps=10, result_file="hybrid_sharding.json").parse_args()
    step_ms, summaries = interleaved_rounds(
        args.rounds, LAYOUTS,
        lambda name, flags: train(RANKS, MODEL + flags + ["--steps", args.steps], "hybrid", launch=LAUNCH,
                                  environment=ACROSS_NODES_BY_TCP))
    layouts = {}
    for name, flags in LAYOUTS.items():
        summary, plan = summaries[name], planned(flags)
        peaks = summary["peak_mem_bytes_by_rank"]
        largest = max(peaks, key=lambda rank: rank["params"] + rank["grads"] + rank["optimizer"])
        layouts[name] = {
            "flags": [str(flag) for flag in flags],
            "memory_bytes": {state: largest[state] for state in ("params", "grads", "optimizer", "comm_buffers")},
            "planned_memory_bytes": {state: plan["memory_bytes"][state]
                                     for state in ("params", "grads", "optimizer", "comm_buffers")},
            "comm_bytes_by_group": summary["comm_bytes_by_group"],
            "bus_bytes_per_step": measured_bus_bytes(summary["comm_bytes_by_group"]),
            "planned_bus_bytes_per_step": plan["bus_bytes_per_step"],
            "step_ms": statistics.median(step_ms[name]),
            "step_ms_by_round": step_ms[name],
        }
    plain = layouts["plain DP"]
    zero3, hybrid3 = layouts["ZeRO-3"], layouts["hybrid ZeRO-3"]
    result = {
        "setup": f"{RANKS} ranks on {os.cpu_count()} cores, {NODES} simulated nodes of {RANKS_PER_NODE} "
                 f"(mpiexec {' '.join(LAUNCH)}, UCX_TLS=tcp,self)",
        "model": " ".join(map(str, MODEL)),
        "layouts": layouts,
        "ratios": {
            "hybrid ZeRO-3 across-node bytes over ZeRO-3's":
                hybrid3["bus_bytes_per_step"]["inter_node"] / zero3["bus_bytes_per_step"]["inter_node"],
            "hybrid ZeRO-3 across-node bytes over plain DP's":
                hybrid3["bus_bytes_per_step"]["inter_node"] / plain["bus_bytes_per_step"]["inter_node"],
            "hybrid ZeRO-3 model state over ZeRO-3's":
                sum(hybrid3["memory_bytes"][s] for s in ("params", "grads", "optimizer")) /
                sum(zero3["memory_bytes"][s] for s in ("params", "grads", "optimizer")),
            "hybrid ZeRO-3 step time over ZeRO-3's": hybrid3["step_ms"] / zero3["step_ms"],
            "hybrid ZeRO-3 step time over plain DP's": hybrid3["step_ms"] / plain["step_ms"],
        },
    }
    for name, row in layouts.items():
        print(f"{name:>14}: model state {sum(row['memory_bytes'][s] for s in ('params', 'grads', 'optimizer')) / 2**20:7.1f} MiB,"
              f" bus bytes within {row['bus_bytes_per_step']['intra_node'] / 2**20:7.1f} MiB"
              f" across {row['bus_bytes_per_step']['inter_node'] / 2**20:7.1f} MiB"
              f" (planned {row['planned_bus_bytes_per_step']['intra_node'] / 2**20:.1f} /"
              f" {row['planned_bus_bytes_per_step']['inter_node'] / 2**20:.1f}), step {row['step_ms']:.1f} ms")
    write_result(args.output, result)
    draw(result, os.path.splitext(args.output)[0] + ".png")


if __name__ == "__main__":
    main()
