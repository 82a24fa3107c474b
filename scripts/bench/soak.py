#!/usr/bin/python3
"""Soak run: trains for --steps steps (default 2000) at --ranks ranks (default 2) with a checkpoint
every --save-every steps (default 100), sampling every rank's resident memory (VmRSS) five times
a second, and reports whether resident memory and the memory ledger's totals stay flat after the
warm-up (--warmup-fraction of the steps, default 0.1): flat means the last sample exceeds the
first sample after the warm-up by less than --tolerance (default 2 %; the ledger must not grow at
all). Writes results/soak.json (or --output) and exits non-zero if either grew."""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

from benchlib import BUILD, ENVIRONMENT, rank_processes, write_result


def resident_bytes(pid):
    try:
        with open(f"/proc/{pid}/status") as handle:
            for line in handle:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--save-every", type=int, default=100)
    parser.add_argument("--warmup-fraction", type=float, default=0.1)
    parser.add_argument("--tolerance", type=float, default=0.02)
    parser.add_argument("--output", default=os.path.join(os.path.dirname(BUILD), "results", "soak.json"))
    parser.add_argument("extra", nargs="*", help="mlptrain's model and data options (after --)")
    args = parser.parse_args()
    if not args.extra:
        args.extra = ["--hidden", "512", "--layers", "6", "--global-batch", "128", "--micro-batches", "2",
                      "--shuffle", "--eval-every", "500"]

    scratch = tempfile.mkdtemp(prefix="mlptrain-soak-")
    checkpoints = os.path.join(scratch, "checkpoints")
    metrics = os.path.join(scratch, "metrics.jsonl")
    command = ["mpiexec.mpich", "-n", str(args.ranks), os.path.join(BUILD, "mlptrain"), "--steps", str(args.steps),
               "--save-every", str(args.save_every), "--checkpoint-dir", checkpoints, "--metrics", metrics,
               "--log-every", "0"] + args.extra
    launcher = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=ENVIRONMENT)
    samples = []  # (seconds since start, [rss of each rank])
    started = time.monotonic()
    last_report = started
    while launcher.poll() is None:
        ranks = rank_processes(checkpoints)
        if len(ranks) == args.ranks:
            sizes = [resident_bytes(pid) for pid in ranks]
            if None not in sizes:
                samples.append((time.monotonic() - started, sizes))
        if time.monotonic() - last_report > 10:
            last_report = time.monotonic()
            print(f"soak: {len(samples)} samples, {time.monotonic() - started:.0f} s", flush=True)
        time.sleep(0.2)
    if launcher.returncode != 0:
        sys.exit(f"soak: mlptrain failed ({launcher.returncode}): {launcher.stderr.read().decode()}")

    with open(metrics) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    steps = [record for record in records if not record.get("summary")]
    warm = max(1, int(args.warmup_fraction * len(steps)))
    ledger_first = sum(steps[warm]["mem_bytes"].values())
    ledger_last = sum(steps[-1]["mem_bytes"].values())
    ledger_peak_first = sum(steps[warm]["peak_mem_bytes"].values())
    ledger_peak_last = max(sum(step["peak_mem_bytes"].values()) for step in steps[warm:])
    # Resident memory after the warm-up: the samples in the later 90 % of the run's time.
    duration = samples[-1][0] if samples else 0
    later = [sizes for seconds, sizes in samples if seconds >= args.warmup_fraction * duration]
    if len(later) < 2:
        sys.exit("soak: too few memory samples (run longer with --steps)")
    rss_first = [size for size in later[0]]
    rss_last = [size for size in later[-1]]
    rss_peak = [max(sizes[rank] for sizes in later) for rank in range(args.ranks)]
    rss_growth = max((last - first) / first for first, last in zip(rss_first, rss_last))
    result = {
        "steps": args.steps, "ranks": args.ranks, "save_every": args.save_every, "options": args.extra,
        "memory_samples": len(samples), "seconds": duration,
        "rss_bytes_after_warmup_by_rank": rss_first, "rss_bytes_at_end_by_rank": rss_last,
        "rss_peak_bytes_after_warmup_by_rank": rss_peak, "rss_growth": rss_growth,
        "ledger_bytes_after_warmup": ledger_first, "ledger_bytes_at_end": ledger_last,
        "ledger_peak_bytes_after_warmup": ledger_peak_first, "ledger_peak_bytes_max": ledger_peak_last,
        "checkpoints_written": len([name for name in os.listdir(checkpoints) if name.endswith(".h5")]),
    }
    result["flat"] = (rss_growth < args.tolerance and ledger_last == ledger_first
                      and ledger_peak_last == ledger_peak_first)
    write_result(args.output, result)
    print(f"soak: {args.steps} steps at {args.ranks} ranks, {result['checkpoints_written']} checkpoints: resident "
          f"memory {[f'{b / 2**20:.1f}' for b in rss_first]} -> {[f'{b / 2**20:.1f}' for b in rss_last]} MiB "
          f"({rss_growth:+.2%}), ledger {ledger_first} -> {ledger_last} bytes (peak {ledger_peak_first} -> "
          f"{ledger_peak_last}): {'flat' if result['flat'] else 'GROWING'}")
    sys.exit(0 if result["flat"] else 1)


if __name__ == "__main__":
    main()
