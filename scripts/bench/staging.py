#!/usr/bin/python3
"""Host staging against its anchors, every collective, blocking and started, each round measuring
everything side by side: commbench on `mpi-staged` (device buffers: `--device loopback` here, or
`cuda` on a GPU machine, ranks sharing the GPU) beside the same collective on `mpi-host` (host
buffers, the same sizes), and the staging bound of each: a pipeline of pieces runs no faster than
its slowest stage, the pinned copies down and up (at the share of the operation's size a rank
copies each way) or the host's MPI on a piece (the same collective at the piece size).
The figure of a collective is the median over the rounds; its ratios are staged over host (the
CPU goal: >= 0.6 at 16-64 MiB) and, on a GPU, staged over the bound (the GPU goal: >= 0.8 at 64
MiB). On loopback there is no bound to hold it to: the copies are memcpys on the cores MPI uses,
so the stages take turns on them rather than running beside each other.

Writes OUTPUT_DIR/staging_<device>_<ranks>_ranks.json (default results/commbench/).

usage: scripts/bench/staging.py [--device loopback|cuda] [--ranks 2] [--rounds 3] [--sizes 16M,64M]"""
import argparse
import os
import shutil
import statistics
import sys

from benchlib import BUILD, ROOT, cpu_model, run_json, write_result

MPIEXEC = shutil.which("mpiexec.mpich") or "mpiexec"
PROGRAMS = os.path.dirname(os.environ.get("MLPTRAIN", os.path.join(BUILD, "mlptrain")))
ISSUES = ("blocking", "started")


def copy_shares(collective, ranks):
    """(down, up): the shares of an operation's size (nccl-tests' size) the busiest rank copies
    down and up, as host staging moves them: a rank copies down what it sends and up what it
    keeps (a reduce-scatter everything down and its block up, an all-gather the reverse; a rooted
    operation's root, or a ring's ranks, copy their whole message)."""
    block = 1 / ranks
    if collective in ("reduce_scatter", "scatter"):
        return 1, block
    if collective in ("all_gather", "gather"):
        return block, 1
    return 1, 1


def commbench(args, path, collectives, sizes, issues, extra=()):
    """commbench's measurement rows, keyed (collective, issue, bytes)."""
    command = [MPIEXEC, "-n", str(args.ranks), os.path.join(PROGRAMS, "commbench"), "--path", path,
               "--collectives", ",".join(collectives), "--min-bytes", sizes[0], "--max-bytes", sizes[-1],
               "--step-factor", str(args.step_factor), "--issue", ",".join(issues), "--iterations",
               str(args.iterations), "--warmup", "2", "--json", *extra]
    if path == "mpi-staged":
        command += ["--device", args.device, "--chunk-bytes", args.chunk]
    rows = [row for row in run_json(command) if row["collective"] != "identity"]
    wrong = [row for row in rows if not row["correct"]]
    if wrong:
        sys.exit(f"staging: commbench gave wrong results: {wrong}")
    return {(row["collective"], row.get("issue", "blocking"), row["bytes"]): row for row in rows}


def one_round(args):
    """Every measurement once, side by side: the copies, the host's MPI at the piece size, then
    each collective host-staged and on host memory at every size."""
    sizes = args.sizes.split(",")
    copies = commbench(args, "mpi-staged", ["copy_to_host", "copy_to_device"], (sizes[-1],), ("blocking",))
    pieces = commbench(args, "mpi-host", args.collectives, (args.chunk,), ("blocking",))
    staged = commbench(args, "mpi-staged", args.collectives, sizes, ISSUES)
    host = commbench(args, "mpi-host", args.collectives, sizes, ISSUES)
    copy_rate = {name: next(row["algbw_gbps"] for key, row in copies.items() if key[0] == name)
                 for name in ("copy_to_host", "copy_to_device")}
    piece_rate = {key[0]: row["algbw_gbps"] for key, row in pieces.items()}
    return {"copy_rate": copy_rate, "piece_rate": piece_rate,
            "staged": {key: row["algbw_gbps"] for key, row in staged.items()},
            "host": {key: row["algbw_gbps"] for key, row in host.items()}}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("loopback", "cuda"), default="loopback")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sizes", default="16M,64M", help="smallest and largest message (a factor of --step-factor apart)")
    parser.add_argument("--step-factor", type=int, default=2)
    parser.add_argument("--chunk", default="4M", help="the piece size staging runs at")
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--collectives", default="all_reduce,reduce_scatter,all_gather,all_to_all,broadcast,reduce,"
                                                 "gather,scatter,send_recv")
    parser.add_argument("--output-dir", default=os.path.join(ROOT, "results", "commbench"))
    args = parser.parse_args()
    args.collectives = args.collectives.split(",")
    rounds = [one_round(args) for _ in range(args.rounds)]
    median = lambda values: statistics.median(list(values))  # noqa: E731
    copy_down = median(r["copy_rate"]["copy_to_host"] for r in rounds)
    copy_up = median(r["copy_rate"]["copy_to_device"] for r in rounds)
    rows = []
    for key in sorted(rounds[0]["staged"], key=lambda key: (args.collectives.index(key[0]), key[1], key[2])):
        collective, issue, size = key
        staged = median(r["staged"][key] for r in rounds)
        host = median(r["host"][key] for r in rounds)
        row = {"collective": collective, "issue": issue, "bytes": size, "staged_algbw_gbps": staged,
               "host_algbw_gbps": host, "staged_over_host": staged / host,
               "rounds_staged_over_host": [r["staged"][key] / r["host"][key] for r in rounds]}
        verdict = f"{row['staged_over_host']:.2f} of host"
        if args.device == "cuda":
            down, up = copy_shares(collective, args.ranks)
            piece = median(r["piece_rate"][collective] for r in rounds)
            row["bound_algbw_gbps"] = min(copy_down / down, copy_up / up, piece)
            row["staged_over_bound"] = staged / row["bound_algbw_gbps"]
            verdict += f", {row['staged_over_bound']:.2f} of the bound"
        rows.append(row)
        print(f"staging: {collective:15s} {issue:8s} {size >> 20:4d} MiB: staged {staged:6.2f} GB/s, {verdict}", flush=True)
    summary = {"rows": len(rows), "lowest_staged_over_host": min(row["staged_over_host"] for row in rows),
               "at_least_0_6_of_host": sum(row["staged_over_host"] >= 0.6 for row in rows)}
    if args.device == "cuda":
        summary["lowest_staged_over_bound"] = min(row["staged_over_bound"] for row in rows)
        summary["at_least_0_8_of_bound"] = sum(row["staged_over_bound"] >= 0.8 for row in rows)
    print(f"staging: {summary}")
    write_result(os.path.join(args.output_dir, f"staging_{args.device}_{args.ranks}_ranks.json"),
                 {"machine": cpu_model(), "device": args.device, "ranks": args.ranks, "rounds": args.rounds,
                  "chunk_bytes": args.chunk, "copy_to_host_gbps": copy_down, "copy_to_device_gbps": copy_up,
                  "summary": summary, "rows": rows})


if __name__ == "__main__":
    main()
