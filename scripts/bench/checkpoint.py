#!/usr/bin/python3
"""Checkpoints at the disk's speed, and training going on while they are written, measured as
ratios in one run (these machines are shared and noisy: the disk's own rate is measured beside).

The model is --layers 26 --hidden 2048 (100.8M parameters: a checkpoint of 1.21 GB).

  bandwidth  Each layout saves --saves times in each mode. sync: the save has the time to itself
             (on the CPU it writes straight from the state); its rate is the file's bytes over
             the save's time, from its start until the file is in place, as the metrics give it.
             async: the state is copied to host memory first, then written while training goes
             on; its rate is the file's bytes over the writes' time (the first rank's start to
             the last rank's end, from the trace), and the pause is given apart. Medians of the
             saves (async: but the run's last, which no step follows and so is written as sync
             writes). Right before each run `dd conv=fsync` (through the page cache, as the target
             is stated) and `dd oflag=direct` (around it, as the saves write whole pages) write
             as many bytes to the same directory; the ratios are save / dd (target >= 0.7).
             Layouts: 1 rank; dp 2, ZeRO 1, 2, 3 and tp 2 at 2 ranks; dp 4, ZeRO 3 and tp 2 x
             dp 2 at 4 ranks.
  ends       At 1 and 2 ranks (data parallel), the saves a user meets first: a run that ends with
             its only save (--steps 1), its whole wall time against the same run without a
             checkpoint, the extra time set against the file's bytes at dd conv=fsync's rate (target:
             extra <= bytes / (0.7 x dd)); and a run's first asynchronous save (at step 4 of 5): its
             pause against a memcpy of the rank's share timed here, as many copies side by side as
             ranks (target <= 2x), its write rate against dd (target >= 0.7), beside the run's
             final save (no step follows it: written straight from the state).
  overlap    At 1 and 2 ranks (data parallel), an asynchronous save every --every steps: the
             median step time of the steps during which a save was in flight (from the step
             after it started to the step that ended it) over the median of the other steps of
             the same run (target <= 1.05 where ranks <= cores). One GEMM thread a rank. At the
             default global batch (128: a step's GEMMs bound by the core) and at 16 (a step
             bound by memory bandwidth, which the writes' transfers share).

--parts runs some parts only; the others' figures are kept from the output file.

Memory is touched once first (--warm-memory-gb): on a virtual machine whose host backs the
guest's memory on first use, that first touch (~0.4 GB/s here) would otherwise be charged to
whichever run, or dd, happens to take fresh pages. Rounds interleave the runs; medians over
rounds. Writes results/checkpoint_speed.json."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np

from benchlib import BUILD, arguments, read_records, train, write_result

MODEL = ["--layers", 26, "--hidden", 2048, "--global-batch", 16]
LAYOUTS = {"1 rank": (1, []), "dp 2": (2, ["--dp", 2]), "zero 1 x2": (2, ["--dp", 2, "--zero", 1]),
           "zero 2 x2": (2, ["--dp", 2, "--zero", 2]), "zero 3 x2": (2, ["--dp", 2, "--zero", 3]),
           "tp 2": (2, ["--tp", 2]), "dp 4": (4, ["--dp", 4]), "zero 3 x4": (4, ["--dp", 4, "--zero", 3]),
           "tp 2 x dp 2": (4, ["--tp", 2, "--dp", 2])}


def dd_rate(directory, size_bytes, flag):
    """GB/s of dd writing `size_bytes` with `flag` (conv=fsync or oflag=direct), as dd reports."""
    target = os.path.join(directory, "dd.tmp")
    result = subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=1M", f"count={size_bytes >> 20}", flag],
                            capture_output=True, text=True, check=True)
    os.remove(target)
    last = result.stderr.splitlines()[-1]
    return int(last.split(" bytes")[0]) / float(last.split(" copied, ")[1].split(" s")[0]) / 1e9


def write_rates(trace_path, file_bytes):
    """Per save (in order): the file's bytes over its writes' time, first rank's start to last
    rank's end, from a trace's storage spans; and rank 0's pauses (ms)."""
    with open(trace_path) as handle:
        events = json.load(handle)["traceEvents"]
    begins = {event["id"]: event["ts"] for event in events if event.get("cat") == "storage" and event["ph"] == "b"}
    spans = {}
    for event in events:
        if event.get("cat") == "storage" and event["ph"] == "e":
            spans.setdefault(event["pid"], []).append((begins[event["id"]], event["ts"]))
    saves = len(spans[0])
    rates = [file_bytes / ((max(spans[rank][save][1] for rank in spans) - min(spans[rank][save][0] for rank in spans))
                           / 1e6) / 1e9 for save in range(saves)]
    pauses = [event["dur"] / 1000 for event in events if event.get("ph") == "X" and event["name"] == "checkpoint"
              and event["pid"] == 0]
    return rates, pauses


def warm_memory(gigabytes):
    """Touches `gigabytes` of memory once (then frees it)."""
    if gigabytes > 0:
        block = np.ones(int(gigabytes * 1e9), dtype=np.uint8)
        del block

MEMCPY = """
import statistics, sys, time
import numpy as np
source, target = np.ones(int(sys.argv[1]), dtype=np.uint8), np.zeros(int(sys.argv[1]), dtype=np.uint8)
times = []
for _ in range(5):
    start = time.perf_counter()
    np.copyto(target, source)
    times.append((time.perf_counter() - start) * 1000)
print(statistics.median(times))
"""


def memcpy_ms(size_bytes, copies):
    """Milliseconds one copy of `size_bytes` takes between two buffers already touched, with
    `copies` processes copying side by side as the ranks of a save do (the slowest one's median
    of 5): a save's copy into host memory made ready before it."""
    processes = [subprocess.Popen([sys.executable, "-c", MEMCPY, str(size_bytes)], stdout=subprocess.PIPE, text=True)
                 for _ in range(copies)]
    return max(float(process.communicate()[0]) for process in processes)


def timed_train(ranks, arguments, name):
    """The whole run's wall time (s), mpiexec included, and its summary."""
    start = time.perf_counter()
    _, summary = train(ranks, arguments, name)
    return time.perf_counter() - start, summary


# The step of the first asynchronous save measured: the host memory it copies into is touched from
# the run's start, behind the steps (1.2 GB took 0.65 s here, two steps of 1 rank).
FIRST_SAVE_STEP = 4


def run_ends(directory, trace, entry, ranks):
    """One round of the `ends` part at `ranks` ranks, appended to `entry`."""
    model = MODEL + ["--dp", ranks]
    dd = dd_rate(directory, 1210 << 20, "conv=fsync")
    bare_s, _ = timed_train(ranks, model + ["--steps", 1], "checkpoint-ends")
    saves = fresh(os.path.join(directory, "ends"))
    saved_s, summary = timed_train(ranks, model + ["--steps", 1, "--checkpoint-dir", saves], "checkpoint-ends")
    only = summary["checkpoints"][0]
    extra_s = saved_s - bare_s
    saves = fresh(os.path.join(directory, "ends"))
    _, summary = timed_train(ranks, model + ["--steps", FIRST_SAVE_STEP + 1, "--save-every", FIRST_SAVE_STEP,
                                             "--checkpoint-dir", saves, "--trace", trace], "checkpoint-ends")
    rates, pauses = write_rates(trace, only["bytes"])
    copy_ms = memcpy_ms(only["bytes"] // ranks, ranks)
    figures = {"dd_fsync_gb_per_s": dd, "only_save_extra_s": extra_s, "bound_s": only["bytes"] / 1e9 / (0.7 * dd),
               "only_save_of_dd": only["bytes"] / 1e9 / extra_s / dd, "first_pause_ms": pauses[0],
               "memcpy_ms": copy_ms, "first_pause_over_memcpy": pauses[0] / copy_ms,
               "first_write_of_dd": rates[0] / dd, "final_save_of_dd": summary["checkpoints"][-1]["gb_per_s"] / dd}
    for key, value in figures.items():
        entry.setdefault(key, []).append(value)
    print(f"{ranks} rank(s): the only save adds {extra_s:.2f} s (bound {figures['bound_s']:.2f} s: "
          f"{figures['only_save_of_dd']:.2f} of dd); first async save paused {pauses[0]:.0f} ms = "
          f"{figures['first_pause_over_memcpy']:.2f} memcpy, wrote at {figures['first_write_of_dd']:.2f} of dd; "
          f"final save {figures['final_save_of_dd']:.2f} of dd", flush=True)


def saves_of(name):
    """The saves a run's summary lists."""
    summary = [record for record in read_records(name) if record.get("summary")][0]
    return summary["checkpoints"]


def fresh(directory):
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)
    return directory


def main():
    parser = arguments(__doc__.split("\n\n")[0], rounds=2, steps=24, result_file="checkpoint_speed.json")
    parser.add_argument("--saves", type=int, default=3, help="saves per bandwidth run")
    parser.add_argument("--every", type=int, default=4, help="steps between asynchronous saves in the overlap runs")
    parser.add_argument("--directory", default=os.path.join(BUILD, "bench-checkpoints"),
                        help="where checkpoints (and dd's file) are written: the disk measured")
    parser.add_argument("--layouts", nargs="*", default=list(LAYOUTS), choices=list(LAYOUTS))
    parser.add_argument("--warm-memory-gb", type=float, default=16)
    parser.add_argument("--parts", nargs="*", default=["bandwidth", "ends", "overlap"],
                        choices=["bandwidth", "ends", "overlap"])
    args = parser.parse_args()
    if "bandwidth" not in args.parts:
        args.layouts = []
    warm_memory(args.warm_memory_gb)
    os.makedirs(args.directory, exist_ok=True)
    modes = ("sync", "async")
    figures = {(layout, mode): {"save": [], "dd_fsync": [], "dd_direct": [], "pause_ms": []}
               for layout in args.layouts for mode in modes}
    batches = {"batch 128": [], "batch 16": ["--global-batch", 16]} if "overlap" in args.parts else {}
    overlap = {(batch, ranks): {"ratio": [], "writing": [], "quiet": []} for batch in batches for ranks in (1, 2)}
    ends = {ranks: {} for ranks in ((1, 2) if "ends" in args.parts else ())}
    file_bytes = None
    trace = os.path.join(BUILD, "bench-checkpoint.trace.json")
    for round_index in range(args.rounds):
        for layout in args.layouts:
            ranks, options = LAYOUTS[layout]
            for mode in modes:
                entry = figures[(layout, mode)]
                directory = fresh(os.path.join(args.directory, "saves"))
                entry["dd_fsync"].append(dd_rate(args.directory, 1210 << 20, "conv=fsync"))
                entry["dd_direct"].append(dd_rate(args.directory, 1210 << 20, "oflag=direct"))
                # One step more than saves: the last save, which no step follows, is written as sync.
                train(ranks, MODEL + options + ["--steps", args.saves + 1, "--save-every", 1, "--save-mode", mode,
                                                "--checkpoint-dir", directory, "--trace", trace], "checkpoint-saves")
                saves = saves_of("checkpoint-saves")[:args.saves]
                file_bytes = saves[0]["bytes"]
                if mode == "sync":
                    rates, pauses = [save["gb_per_s"] for save in saves], [save["paused_ms"] for save in saves]
                else:
                    rates, pauses = (figures[:args.saves] for figures in write_rates(trace, file_bytes))
                entry["save"].append(statistics.median(rates))
                entry["pause_ms"].append(statistics.median(pauses))
                print(f"round {round_index + 1} {layout} {mode}: {entry['save'][-1]:.2f} GB/s, dd fsync "
                      f"{entry['dd_fsync'][-1]:.2f}, dd direct {entry['dd_direct'][-1]:.2f}", flush=True)
        for ranks, entry in ends.items():
            run_ends(args.directory, trace, entry, ranks)
        for (batch, ranks), entry in overlap.items():
            directory = fresh(os.path.join(args.directory, "overlap"))
            name = f"checkpoint-overlap-{ranks}"
            model = ["--layers", 26, "--hidden", 2048] + batches[batch]
            train(ranks, model + ["--dp", ranks, "--steps", args.steps, "--save-every", args.every,
                                  "--checkpoint-dir", directory], name)
            records = [record for record in read_records(name) if not record.get("summary")]
            in_flight, writing, quiet = False, [], []
            for record in records[2:]:
                (writing if in_flight else quiet).append(record["step_ms"])
                if "checkpoint" in record:
                    in_flight = False
                if record["step"] % args.every == 0 and record["step"] < args.steps:
                    in_flight = True
            entry["ratio"].append(statistics.median(writing) / statistics.median(quiet))
            entry["writing"].append(statistics.median(writing))
            entry["quiet"].append(statistics.median(quiet))
            print(f"round {round_index + 1} async, {batch}, {ranks} rank(s): step while writing / without "
                  f"{entry['ratio'][-1]:.3f} ({len(writing)} and {len(quiet)} steps)", flush=True)
    shutil.rmtree(args.directory, ignore_errors=True)
    median = statistics.median
    bandwidth = {}
    for (layout, mode), entry in figures.items():
        bandwidth.setdefault(layout, {"ranks": LAYOUTS[layout][0]})[mode] = {
            "save_gb_per_s": median(entry["save"]), "paused_ms": median(entry["pause_ms"]),
            "dd_fsync_gb_per_s": median(entry["dd_fsync"]), "dd_direct_gb_per_s": median(entry["dd_direct"]),
            "of_dd_fsync": median(s / d for s, d in zip(entry["save"], entry["dd_fsync"])),
            "of_dd_direct": median(s / d for s, d in zip(entry["save"], entry["dd_direct"]))}
    previous = {}
    if os.path.exists(args.output):
        with open(args.output) as handle:
            previous = json.load(handle)
    result = {"model": " ".join(map(str, MODEL)), "file_bytes": file_bytes or previous.get("file_bytes"),
              "bandwidth": bandwidth or previous.get("bandwidth", {}),
              "async_step_ratio": {f"{batch}, {ranks} rank(s)": {"writing_over_quiet": median(entry["ratio"]),
                                                                 "writing_step_ms": median(entry["writing"]),
                                                                 "quiet_step_ms": median(entry["quiet"])}
                                   for (batch, ranks), entry in overlap.items()} or previous.get("async_step_ratio", {}),
              "ends": {f"{ranks} rank(s)": {key: median(values) for key, values in entry.items()}
                       for ranks, entry in ends.items()} or previous.get("ends", {})}
    for layout, by_mode in bandwidth.items():
        for mode in modes:
            entry = by_mode[mode]
            print(f"{layout:>12} {mode:>5}: {entry['save_gb_per_s']:.2f} GB/s, {entry['of_dd_fsync']:.2f} of dd fsync, "
                  f"{entry['of_dd_direct']:.2f} of dd direct; paused {entry['paused_ms']:.0f} ms")
    for ranks, figures in result["ends"].items():
        print(f"ends, {ranks}: " + ", ".join(f"{key} {value:.3g}" for key, value in figures.items()))
    for (batch, ranks), entry in overlap.items():
        print(f"async, {batch}, {ranks} rank(s): step while writing / without {median(entry['ratio']):.3f}")
    write_result(args.output, result)


if __name__ == "__main__":
    main()
