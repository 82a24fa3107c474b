"""The transport experiment of scripts/experiments/experiments.py: MPI staged through host memory against
NCCL device to device, on the GPU (commbench's all-reduce bandwidth by size for mpi-host,
mpi-staged and nccl, and the step time of each layout with --comm mpi and --comm nccl)."""
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
import benchlib  # noqa: E402
from benchlib import ENVIRONMENT, PROGRAM  # noqa: E402
from experimentlib import run_all, train  # noqa: E402


# --------------------------------------------------------------------------------------- transport
def gpu_count():
    """GPUs nvidia-smi lists (0 without a driver)."""
    try:
        listing = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    return sum(line.startswith("GPU ") for line in listing.stdout.splitlines()) if listing.returncode == 0 else 0


def device_problem(arguments):
    """Why mlptrain cannot train one tiny step with these extra arguments, or None if it can."""
    result = subprocess.run([PROGRAM, "--layers", "2", "--hidden", "8", "--input-dim", "8", "--output-dim", "2",
                             "--global-batch", "8", "--steps", "1", "--log-every", "0"] + arguments,
                            capture_output=True, text=True, env=ENVIRONMENT, timeout=300)
    lines = (result.stderr + result.stdout).strip().splitlines()
    return None if result.returncode == 0 else (lines[-1] if lines else f"exit {result.returncode}")


def transport(settings):
    device = settings.transport_device
    nccl_problem = device_problem(["--device", device, "--comm", "nccl"])
    if nccl_problem:
        print(f"transport: no NCCL runs: {nccl_problem}", flush=True)
    gpus = 0 if nccl_problem else max(1, gpu_count())
    width, batch, layers = (16, 16, 4) if settings.tiny else (4096, 1024, 8)
    model = ["--dataset", "mixture", "--layers", layers, "--hidden", width, "--input-dim", width,
             "--output-dim", 10, "--global-batch", batch, "--steps", settings.steps, "--device", device]
    layouts = [("one process", 1, []), ("dp 2", 2, ["--dp", 2]), ("ZeRO-3 dp 2", 2, ["--zero", 3]),
               ("tp 2", 2, ["--tp", 2]), ("pp 2", 2, ["--pp", 2, "--micro-batches", 4])]
    runs = []
    sizes = ("1K", "64K") if settings.tiny else ("8", "256M")
    staged_ranks = [1, 2] if settings.tiny else [1, 2, 4]
    for path, ranks_list in (("mpi-host", [1, 2]), ("mpi-staged", staged_ranks),
                             ("nccl", [n for n in (1, 2, 4, 8) if n <= gpus])):
        for ranks in ranks_list:
            runs.append((f"commbench {path} at {ranks} rank(s)", ranks, [path], {"part": "commbench", "path": path}))
    for label, ranks, flags in layouts:
        for comm_path in ("mpi", "nccl"):
            if comm_path == "mpi" or ranks <= gpus:
                runs.append((f"{label}, --comm {comm_path}", ranks, model + flags + ["--comm", comm_path],
                             {"part": "training", "layout": label, "comm": comm_path}))

    def measure(ranks, arguments, fields):
        if fields["part"] == "training":
            return {"step_ms": train(settings, ranks, arguments)[0]}
        path = arguments[0]
        command = ["mpiexec.mpich", "-n", str(ranks), os.path.join(os.path.dirname(PROGRAM), "commbench"),
                   "--path", path, "--device", device, "--collectives", "all_reduce", "--min-bytes", sizes[0],
                   "--max-bytes", sizes[1], "--step-factor", "4", "--json"]
        if settings.tiny:
            command += ["--iterations", "3", "--warmup", "1"]
        points = benchlib.run_json(command)
        return {"points": [{k: p[k] for k in ("bytes", "time_us", "algbw_gbps", "busbw_gbps", "correct")}
                           for p in points]}

    rows = run_all(settings, "transport", runs, measure)
    figure, axes = plt.subplots(1, 2, figsize=(13, 4.2))
    for row in (r for r in rows if r["part"] == "commbench"):
        # Algorithm bandwidth (size / time): the bus bandwidth of one rank is zero by definition.
        axes[0].plot([p["bytes"] for p in row["points"]], [p["algbw_gbps"] for p in row["points"]], marker=".",
                     label=f"{row['path']}, {row['ranks']} rank(s)")
    axes[0].set_xscale("log", base=2)
    axes[0].set_yscale("log")
    axes[0].set_xlabel("bytes")
    axes[0].set_ylabel("all-reduce algbw (GB/s)")
    axes[0].set_title(f"commbench all-reduce ({device})")
    axes[0].legend(fontsize=7)
    trained = [r for r in rows if r["part"] == "training"]
    labels = list(dict.fromkeys(r["layout"] for r in trained))
    for offset, comm_path in ((-0.2, "mpi"), (0.2, "nccl")):
        chosen = {r["layout"]: r["step_ms"] for r in trained if r["comm"] == comm_path}
        if chosen:
            axes[1].bar([i + offset for i, label in enumerate(labels) if label in chosen],
                        [chosen[label] for label in labels if label in chosen], 0.4, label=f"--comm {comm_path}")
    axes[1].set_xticks(range(len(labels)), labels, rotation=20, ha="right", fontsize=8)
    axes[1].set_ylabel("step time (ms)")
    axes[1].set_title(f"{layers} layers of width {width}, global batch {batch}")
    axes[1].legend(fontsize=8)
    figure.tight_layout()
    return rows, figure
