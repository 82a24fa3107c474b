#!/usr/bin/python3
"""commbench's results on this machine's MPI host path at 2 and 4 ranks: every collective in fp32
and bf16, in place and out of place, beside MPI_Allreduce called directly on the same sizes in the
same run (the baseline), written to results/commbench/: the JSON rows per world size, a plot of
busbw against size, and summary.json with the CPU, the 16 MiB all-reduce's busbw against the
baseline's, bf16 against fp32 and the identity all-reduce = reduce-scatter + all-gather.

usage: scripts/bench/commbench.py [--worlds 2,4] [--max-bytes 64M] [--iterations 20]"""
import argparse
import json
import os
import shutil
import subprocess
import sys

from benchlib import cpu_model
from benchlib import BUILD, ROOT, run_json, write_result

MPIEXEC = shutil.which("mpiexec.mpich") or "mpiexec"
COMMBENCH = os.path.join(BUILD, "commbench")
SIXTEEN_MIB = 16 << 20


def row(rows, collective, dtype, size):
    return next(r for r in rows if r["collective"] == collective and r["dtype"] == dtype and r["bytes"] == size)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--max-bytes", default="64M")
    parser.add_argument("--iterations", default="20")
    parser.add_argument("--output-dir", default=os.path.join(ROOT, "results", "commbench"))
    args = parser.parse_args()
    os.makedirs(args.output_dir, exist_ok=True)
    common = ["--max-bytes", args.max_bytes, "--iterations", args.iterations, "--json"]
    summary = {"cpu": cpu_model(), "mpi": "MPICH 4.0.2 (ch4:ucx), one node", "worlds": {}}
    files = []
    for ranks in (int(world) for world in args.worlds.split(",")):
        launch = [MPIEXEC, "-n", str(ranks), COMMBENCH]
        # The baseline and the communicator's collectives in one run, in the same process.
        rows = run_json(launch + ["--collectives", "mpi_all_reduce," + "all", "--dtype", "fp32"] + common)
        rows += run_json(launch + ["--dtype", "bf16"] + common)
        path = os.path.join(args.output_dir, f"mpi_host_{ranks}_ranks.jsonl")
        with open(path, "w") as handle:
            handle.writelines(json.dumps(r) + "\n" for r in rows)
        files.append(path)
        measured = [r for r in rows if r["collective"] != "identity"]
        identity = [r for r in rows if r["collective"] == "identity" and r["bytes"] == SIXTEEN_MIB]
        ours, raw = row(measured, "all_reduce", "fp32", SIXTEEN_MIB), row(measured, "mpi_all_reduce", "fp32", SIXTEEN_MIB)
        half = row(measured, "all_reduce", "bf16", SIXTEEN_MIB)
        summary["worlds"][str(ranks)] = {
            "measurements": len(measured),
            "wrong": sum(r["wrong"] + r.get("in_place_wrong", 0) for r in measured),
            "all_reduce_16MiB_busbw_gbps": ours["busbw_gbps"],
            "mpi_allreduce_16MiB_busbw_gbps": raw["busbw_gbps"],
            "all_reduce_over_mpi_allreduce": ours["busbw_gbps"] / raw["busbw_gbps"],
            "all_reduce_16MiB_in_place_busbw_gbps": ours["in_place_busbw_gbps"],
            "bf16_all_reduce_16MiB_busbw_gbps": half["busbw_gbps"],
            "bf16_over_fp32_busbw": half["busbw_gbps"] / ours["busbw_gbps"],
            "identity_16MiB": {r["dtype"]: r["ratio"] for r in identity},
        }
        print(f"bench_commbench: {ranks} ranks: 16 MiB all-reduce {ours['busbw_gbps']:.2f} GB/s busbw, "
              f"MPI_Allreduce {raw['busbw_gbps']:.2f} ({ours['busbw_gbps'] / raw['busbw_gbps']:.2f}x), "
              f"bf16 {half['busbw_gbps']:.2f}", flush=True)
    subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "tools", "commbench_plot.py"), *files, "--output",
                    os.path.join(args.output_dir, "mpi_host.png")], check=True)
    write_result(os.path.join(args.output_dir, "summary.json"), summary)


if __name__ == "__main__":
    main()
