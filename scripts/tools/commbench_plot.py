#!/usr/bin/python3
"""Plots commbench's --json output: bus bandwidth against message size, one panel per collective,
one line per path (mpi-host, mpi-staged, nccl), device, element type and world size found in the
files (out of place; the identity rows are left out).

usage: commbench_plot.py RESULTS.jsonl [MORE.jsonl ...] [--output commbench.png]"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

ORDER = ["all_reduce", "mpi_all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce",
         "gather", "scatter", "send_recv"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", nargs="+")
    parser.add_argument("--output", default="commbench.png")
    args = parser.parse_args()
    rows = []
    for name in args.results:
        with open(name) as handle:
            rows += [json.loads(line) for line in handle if line.startswith("{")]
    collectives = [c for c in ORDER if any(r["collective"] == c for r in rows)]
    columns = min(3, len(collectives))
    lines = (len(collectives) + columns - 1) // columns
    figure, axes = plt.subplots(lines, columns, figsize=(4.6 * columns, 3.4 * lines), squeeze=False)
    for axis, collective in zip(axes.flat, collectives):
        def key(r):  # older files have no device or dtype field: they are fp32 host runs
            return r["path"], r.get("device", "cpu"), r.get("dtype", "fp32"), r["ranks"]
        series = sorted({key(r) for r in rows if r["collective"] == collective})
        for path, device, dtype, ranks in series:
            chosen = sorted((r for r in rows if r["collective"] == collective and key(r) == (path, device, dtype, ranks)),
                            key=lambda r: r["bytes"])
            where = "" if device == "cpu" else f" ({device})"
            axis.plot([r["bytes"] for r in chosen], [r["busbw_gbps"] for r in chosen], marker=".",
                      label=f"{path}{where} {dtype}, {ranks} ranks")
        axis.set_xscale("log", base=2)
        axis.set_title(collective)
        axis.set_xlabel("bytes")
        axis.set_ylabel("busbw (GB/s)")
        axis.legend(fontsize=7)
    for axis in list(axes.flat)[len(collectives):]:
        axis.set_visible(False)
    figure.tight_layout()
    figure.savefig(args.output, dpi=110)
    print(f"commbench_plot: wrote {args.output}")


if __name__ == "__main__":
    main()
