#!/usr/bin/python3
"""mlpplan's plans of GPU layouts against their measured steps: one process, and two ranks
(--ranks N: N) sharing the GPU over host-staged MPI (--comm mpi: each message copied to pinned
host memory in pieces, MPI on the host, copied back, on each rank's communication engine), data,
tensor and pipeline parallel and ZeRO-3, in fp32 and bf16.

The planner is calibrated on the same GPU just before: layerbench --device cuda at the rows a
rank's GEMMs get (the batch, a data-parallel rank's share of it, a micro-batch's), each with a
step's GEMMs in sequence and AdamW over the model's parameters, and commbench's host-staged
collectives at the layouts' ranks. Each layout's figure is the median of its steps after two
warm-up steps (the GPU's steps vary little; the host's staging does the varying); its memory
states (parameters, gradients, optimizer state, communication buffers) and bytes per step are
held against the run's own ledger (exact, and within 1 %); its communication is reported in the
operations' own times and in wall time (in flight, and waited for).

Writes OUTPUT_DIR/plan_vs_layouts.json (plan_vs_layouts_N_ranks.json for N other than 2), the
calibration's rows beside it. With --device loopback the same code runs without a GPU (the test
suite does: mlptrain on the device path's loopback, the plan calibrated as the CPU): that checks
the script and measures nothing about a GPU."""
import argparse
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
from benchlib import (ENVIRONMENT, PLANNER, PROGRAM, ROOT, ledger_disagreements, read_records, run_json,  # noqa: E402
                      train, write_result)

PROGRAMS = os.path.dirname(os.path.abspath(PROGRAM))

def layouts(ranks):
    """(ranks, layout options): one process, then `ranks` ranks sharing the GPU."""
    n = str(ranks)
    return [(1, []), (ranks, ["--dp", n]), (ranks, ["--dp", n, "--zero", "3"]), (ranks, ["--tp", n]),
            (ranks, ["--pp", n, "--micro-batches", str(2 * ranks)])]
PRECISIONS = {"fp32": [], "bf16": ["--param-dtype", "bf16"]}
# The states whose bytes the plan and the ledger both count exactly.
EXACT_STATES = ("params", "grads", "optimizer", "comm_buffers")


def device_options(device):
    """(mlptrain's, layerbench's, commbench's and mlpplan's device options): on loopback the
    plan is the CPU's, calibrated by benches on the host."""
    if device == "cuda":
        return (["--device", "cuda"], ["--device", "cuda"], ["--path", "mpi-staged", "--device", "cuda"],
                ["--device", "cuda", "--comm", "mpi"])
    return ["--device", "loopback"], ["--device", "cpu"], ["--path", "mpi-host"], ["--device", "cpu"]


def model_options(args):
    """The model every layout trains (mlptrain's and mlpplan's options alike)."""
    return ["--dataset", "mixture", "--layers", args.layers, "--hidden", args.hidden, "--input-dim", args.hidden,
            "--output-dim", 10, "--global-batch", args.batch]


def calibrate(args, folder):
    """The files mlpplan --calibrate reads: layerbench at each row count a rank's GEMMs get, and
    commbench at the layouts' ranks."""
    _, bench_device, comm_path, _ = device_options(args.device)
    parameters = args.layers * (args.hidden * args.hidden + args.hidden)
    suffix = "" if args.ranks == 2 else f"_{args.ranks}_ranks"
    layers = os.path.join(folder, f"calibration_layerbench{suffix}.jsonl")
    with open(layers, "w") as handle:
        for rows in sorted({args.batch, args.batch // args.ranks, args.batch // (2 * args.ranks)}):
            command = [os.path.join(PROGRAMS, "layerbench"), rows, args.hidden, args.hidden, 5, "--dtype", "fp32,bf16",
                       "--sequence", args.layers, "--optimizer-parameters", parameters] + bench_device
            for row in run_json([str(part) for part in command]):
                handle.write(json.dumps(row) + "\n")
    comm = os.path.join(folder, f"calibration_commbench{suffix}.jsonl")
    with open(comm, "w") as handle:
        for collective in ("all_reduce", "reduce_scatter", "all_gather", "send_recv"):
            command = ["mpiexec.mpich", "-n", str(args.ranks), os.path.join(PROGRAMS, "commbench"), "--json", "--max-bytes",
                       args.max_bytes, "--step-factor", "4", "--collectives", collective]
            for row in run_json(command + comm_path):
                handle.write(json.dumps(row) + "\n")
            handle.flush()
            print(f"plan_vs_layouts: commbench {collective} done", flush=True)
    return [layers, comm]


def planned(args, ranks, options, files):
    _, _, _, plan_device = device_options(args.device)
    command = [PLANNER, "--world", ranks, "--calibrate"] + files + plan_device + model_options(args) + options + ["--json"]
    output = subprocess.run([str(part) for part in command], capture_output=True, text=True, env=ENVIRONMENT)
    if output.returncode != 0:
        sys.exit(f"plan_vs_layouts: mlpplan {' '.join(map(str, options))} failed: {output.stderr.strip()}")
    return json.loads(output.stdout.splitlines()[0])


def gpu_name():
    """The GPU's name and driver, as nvidia-smi gives them."""
    query = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version", "--format=csv,noheader"],
                           capture_output=True, text=True)
    return query.stdout.strip().splitlines()[0] if query.returncode == 0 and query.stdout.strip() else "cuda"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["cuda", "loopback"], default="cuda")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=4096, help="hidden and input width")
    parser.add_argument("--batch", type=int, default=8192, help="global batch")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--max-bytes", default="64M", help="commbench's largest message")
    parser.add_argument("--ranks", type=int, default=2, help="ranks sharing the GPU in the parallel layouts")
    parser.add_argument("--output-dir", default=os.path.join(ROOT, "results", "gpu"))
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    files = calibrate(args, args.output_dir)
    train_device = device_options(args.device)[0]
    rows = []
    for precision, precision_options in PRECISIONS.items():
        for ranks, layout in layouts(args.ranks):
            options = layout + precision_options
            arguments = model_options(args) + options + train_device + ["--steps", args.steps]
            name = f"plan-vs-layouts-{precision}-{ranks}-{'-'.join(layout) or 'one-process'}"
            step_ms, summary = train(ranks, arguments, name)
            # A step's communication (medians over the same steps): each operation's own time, from
            # its start to its completion (started ones overlap each other and the computation, so
            # these may sum past the step); in wall time, the step's time with any operation in
            # flight, and the time the launching thread waited for one (what the step exposed).
            steps = [record for record in read_records(name) if not record.get("summary")][2:]
            comm_ms = {op: statistics.median(step["comm_ms"][op] for step in steps) for op in steps[0]["comm_ms"]}
            measured_comm = {"operations_ms": {op: ms for op, ms in comm_ms.items() if ms > 0},
                             "operations_sum_ms": statistics.median(sum(step["comm_ms"].values()) for step in steps),
                             "busy_ms": statistics.median(step["comm_busy_ms"] for step in steps),
                             "wait_ms": statistics.median(step["comm_wait_ms"] for step in steps)}
            plan = planned(args, ranks, options, files)
            problems = ledger_disagreements(plan, summary, EXACT_STATES)
            rows.append({"precision": precision, "ranks": ranks, "layout": layout, "measured_step_ms": step_ms,
                         "planned_step_ms": plan["step_ms"],
                         "measured_comm": measured_comm,
                         "step_time_ratio": plan["step_ms"]["total"] / step_ms,
                         "memory_and_bytes_agree": not problems, "problems": problems})
            print(f"plan_vs_layouts: {precision} {ranks} rank(s) {' '.join(layout)}: planned "
                  f"{plan['step_ms']['total']:.1f} ms (exposed communication {plan['step_ms']['exposed_comm']:.1f}), "
                  f"measured {step_ms:.1f} ms ({rows[-1]['step_time_ratio']:.2f}; communication in flight "
                  f"{measured_comm['busy_ms']:.1f}, waited for {measured_comm['wait_ms']:.1f}); "
                  f"{'memory and bytes agree' if not problems else '; '.join(problems)}", flush=True)
    ratios = [row["step_time_ratio"] for row in rows]
    summary = {"device": gpu_name() if args.device == "cuda" else "loopback (no GPU)", "layouts": len(rows),
               "within_10_percent": sum(abs(ratio - 1) <= 0.10 for ratio in ratios),
               "mean_absolute_error": statistics.fmean(abs(ratio - 1) for ratio in ratios),
               "memory_and_bytes_agree": sum(row["memory_and_bytes_agree"] for row in rows)}
    print(json.dumps(summary))
    name = "plan_vs_layouts.json" if args.ranks == 2 else f"plan_vs_layouts_{args.ranks}_ranks.json"
    write_result(os.path.join(args.output_dir, name),
                 {"model": {"layers": args.layers, "hidden": args.hidden, "batch": args.batch, "steps": args.steps},
                  "calibration": [os.path.basename(path) for path in files], "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
