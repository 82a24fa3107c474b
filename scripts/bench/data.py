#!/usr/bin/python3
"""Real data at the speed of built-in data, measured side by side in one run (ratios only: these
machines are shared and noisy, and the CPU behind them changes).

The Fashion-MNIST shape (784-512-512-10, global batch 128 per rank, one GEMM thread a rank,
--shuffle) at 1 and 2 ranks, each of:

  memory   Fashion-MNIST's HDF5 file (uint8 images, scaled on the fly), held in memory (the
           default when it fits under --data-memory-mb)
  file     the same file read a batch at a time (--data-memory-mb 0: one read of the batch's
           rows per array and step)
  builtin  the built-in `mixture` data of the same shape (784 inputs, 10 classes)

Ranks are bound to a core each, so the one GEMM thread fills it and every read is on the step's
path. At 1 rank the file and builtin runs are repeated unbound ("free core"): the rank's share of
the cores then leaves one to the reader, which reads the file's next batch during the step.

Runs are interleaved over --rounds rounds; medians of the step time and of data_ms (the time the
step waited for samples) are reported, with memory/builtin and file/builtin (target: memory
<= 1.03x builtin), and whether memory and file gave the same losses.

The file comes from Debian's dataset-fashion-mnist (apt-get install dataset-fashion-mnist) through
scripts/datasets/idx_to_hdf5.py, or --data FILE. Writes results/data_speed.json."""
import os
import statistics
import subprocess
import sys

from benchlib import BUILD, ROOT, arguments, cpu_model, read_records, train, write_result

DEBIAN_FOLDER = "/usr/share/datasets/fashion-mnist"


def fashion_mnist_file(path):
    """The Fashion-MNIST HDF5 file: `path`, or converted once from the Debian package."""
    if path:
        return path
    converted = os.path.join(BUILD, "fashion-mnist.h5")
    if not os.path.exists(converted):
        if not os.path.isdir(DEBIAN_FOLDER):
            sys.exit(f"bench_data: {DEBIAN_FOLDER} is missing: apt-get install dataset-fashion-mnist, or give --data FILE")
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "datasets", "idx_to_hdf5.py"), "--from", DEBIAN_FOLDER,
                        "--output", converted], check=True)
    return converted


def main():
    parser = arguments(__doc__.split("\n\n")[0], rounds=5, steps=200, result_file="data_speed.json")
    parser.add_argument("--data", help="an HDF5 file of the Fashion-MNIST layout (default: converted from the Debian package)")
    args = parser.parse_args()
    data = fashion_mnist_file(args.data)
    model = ["--layers", 3, "--hidden", 512, "--shuffle", "--lr", "1e-3", "--steps", args.steps]
    sources = {"memory": ["--dataset", "hdf5", "--data-path", data],
               "file": ["--dataset", "hdf5", "--data-path", data, "--data-memory-mb", 0],
               "builtin": ["--dataset", "mixture", "--input-dim", 784, "--output-dim", 10]}
    runs = [(ranks, source) for ranks in (1, 2) for source in sources] + [(1, "file free core"), (1, "builtin free core")]
    step_ms = {run: [] for run in runs}
    data_ms = {run: [] for run in runs}
    losses = {}
    for round_index in range(args.rounds):
        print(f"bench_data: round {round_index + 1} of {args.rounds}", flush=True)
        for ranks, source in runs:
            name = f"data-{source.replace(' ', '-')}-{ranks}"
            free_core = source.endswith("free core")
            time_ms, _ = train(ranks, model + sources[source.split()[0]] + ["--global-batch", 128 * ranks], name,
                               bind_to_cores=not free_core)
            records = [record for record in read_records(name) if not record.get("summary")]
            step_ms[(ranks, source)].append(time_ms)
            data_ms[(ranks, source)].append(statistics.median(record["data_ms"] for record in records[2:]))
            losses[(ranks, source)] = [record["loss"] for record in records]

    rows = {}
    for ranks in (1, 2):
        median = {source: statistics.median(step_ms[(ranks, source)]) for source in sources}
        rows[f"{ranks}_ranks"] = {
            "step_ms": median,
            "data_ms": {source: statistics.median(data_ms[(ranks, source)]) for source in sources},
            "step_ms_by_round": {source: step_ms[(ranks, source)] for source in sources},
            "memory_over_builtin": median["memory"] / median["builtin"],
            "file_over_builtin": median["file"] / median["builtin"],
            "memory_and_file_losses_equal": losses[(ranks, "memory")] == losses[(ranks, "file")]}
        print(f"bench_data: {ranks} rank(s): memory {median['memory']:.2f} ms, file {median['file']:.2f} ms, "
              f"builtin {median['builtin']:.2f} ms: memory/builtin {rows[f'{ranks}_ranks']['memory_over_builtin']:.3f}, "
              f"file/builtin {rows[f'{ranks}_ranks']['file_over_builtin']:.3f} ({cpu_model()})", flush=True)
    free = {source: statistics.median(step_ms[(1, source + " free core")]) for source in ("file", "builtin")}
    rows["1_rank_free_core"] = {
        "step_ms": free, "data_ms": {source: statistics.median(data_ms[(1, source + " free core")]) for source in free},
        "file_over_builtin": free["file"] / free["builtin"]}
    print(f"bench_data: 1 rank with a free core: file {free['file']:.2f} ms, builtin {free['builtin']:.2f} ms: "
          f"file/builtin {rows['1_rank_free_core']['file_over_builtin']:.3f}", flush=True)
    write_result(args.output, {"model": "784-512-512-10, batch 128 per rank, --shuffle, one GEMM thread a rank",
                               "data": os.path.relpath(data, ROOT) if data.startswith(ROOT) else data,
                               "rounds": args.rounds, "steps": args.steps,
                               "targets": {"memory_over_builtin": "<= 1.03"}, **rows})


if __name__ == "__main__":
    main()
