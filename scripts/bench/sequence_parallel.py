#!/usr/bin/python3
"""Sequence parallelism against plain tensor parallelism at T = 2 and 4, measured side by side in
one run. On an MLP of 8 layers of 2048 (global batch 512, fp32, one micro-batch), for --tp T with
and without --sequence-parallel, interleaved over --rounds rounds:

  * the activation peak per rank (the ledger's), against the prediction, and the part of it the
    rows between a row-parallel layer and the next column-parallel one hold: whole on every rank
    under plain tensor parallelism (each such layer's pre-activation and GELU output, [R, 2048]),
    a block of R / T rows split (goal: that part divided by T);
  * the tensor group's bytes per step by operation, and the last step's time in collectives;
  * the step time (median over the rounds' medians; goal: within 5 % of plain tensor parallelism).

Writes results/sequence_parallel.json and a picture of what moves where with the figures,
results/sequence_parallel.png."""
import os
import statistics

from benchlib import arguments, interleaved_rounds, read_records, train, write_result

LAYERS, HIDDEN, BATCH = 8, 2048, 512
MODEL = ["--dataset", "mixture", "--layers", LAYERS, "--hidden", HIDDEN, "--input-dim", HIDDEN,
         "--output-dim", 16, "--global-batch", BATCH]
GROUP_SIZES = (2, 4)


def split_layers():
    """Row-parallel layers (odd indices) followed by a column-parallel one: all but the last."""
    return [layer for layer in range(1, LAYERS - 1, 2)]


def replicated_bytes():
    """What those layers hold whole on every rank under plain tensor parallelism: a pre-activation
    and a GELU output of [R, HIDDEN] in fp32 each."""
    return len(split_layers()) * 2 * BATCH * HIDDEN * 4


def draw(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import FancyArrowPatch, Rectangle
    figure = plt.figure(figsize=(15, 4.6))
    scheme = figure.add_axes([0.01, 0.05, 0.46, 0.85])
    scheme.set_xlim(0, 10)
    scheme.set_ylim(0, 6)
    scheme.axis("off")
    ranks = 2
    colours = ["#4878a8", "#cc4125"]

    def box(x, y, width, height, text, colour, alpha=0.85):
        scheme.add_patch(Rectangle((x, y), width, height, facecolor=colour, alpha=alpha, edgecolor="black"))
        scheme.text(x + width / 2, y + height / 2, text, ha="center", va="center", fontsize=7, color="white")

    def arrow(x0, y0, x1, y1, text=""):
        scheme.add_patch(FancyArrowPatch((x0, y0), (x1, y1), arrowstyle="->", mutation_scale=10))
        if text:
            scheme.text((x0 + x1) / 2, (y0 + y1) / 2 + 0.15, text, ha="center", fontsize=7)

    for rank in range(ranks):
        y = 3.3 - rank * 2.8
        scheme.text(0.0, y + 1.9, f"tensor rank {rank}", fontsize=8, weight="bold")
        box(0.0, y, 1.6, 1.6, "row-parallel\nx W_r^T\npartial sum\n[R, out]", colours[rank], 0.5)
        box(3.0, y + 0.8 * rank, 1.6, 0.8, f"rows {rank}/{ranks}\n+ b, GELU\n(kept)", colours[rank])
        box(6.0, y, 1.6, 1.6, "gathered\ninput [R, in]\n(transient)", "#6aa84f", 0.6)
        box(8.3, y, 1.6, 1.6, "column-parallel\nx W_c^T\n[R, out / T]", colours[rank], 0.5)
        arrow(1.6, y + 0.8, 3.0, y + 0.4 + 0.8 * rank, "reduce-scatter")
        arrow(4.6, y + 0.4 + 0.8 * rank, 6.0, y + 0.8, "all-gather")
        arrow(7.6, y + 0.8, 8.3, y + 0.8)
    scheme.text(5, 5.75, "forward; backward mirrors it: gather the kept rows again for W_c's gradient, reduce-"
                "scatter\nthe column layer's input gradient, all-gather d pre before the row layer's products",
                ha="center", fontsize=7)
    bars = figure.add_axes([0.53, 0.14, 0.2, 0.7])
    times = figure.add_axes([0.79, 0.14, 0.2, 0.7])
    names, peaks, steps = [], [], []
    for size in GROUP_SIZES:
        for split in (False, True):
            row = result["layouts"][f"tp{size}{' sp' if split else ''}"]
            names.append(f"T={size}\n{'sequence par.' if split else 'plain'}")
            peaks.append(row["activation_peak_bytes"] / 2**20)
            steps.append(row["step_ms"])
    positions = range(len(names))
    colour = ["#999999", "#4878a8"] * len(GROUP_SIZES)
    bars.bar(positions, peaks, color=colour)
    bars.set_title("activation peak per rank (MiB)", fontsize=9)
    times.bar(positions, steps, color=colour)
    times.set_title("step time (ms)", fontsize=9)
    for axis in (bars, times):
        axis.set_xticks(list(positions))
        axis.set_xticklabels(names, fontsize=7)
    figure.suptitle(f"sequence parallelism, {LAYERS} x {HIDDEN} MLP, batch {BATCH}, fp32: {result['cpu']}", fontsize=9)
    figure.savefig(path, dpi=110)


def main():
    args = arguments(__doc__, rounds=3, steps=8, result_file="sequence_parallel.json").parse_args()
    layouts = {f"tp{size}{' sp' if split else ''}": ["--tp", size] + (["--sequence-parallel"] if split else [])
               for size in GROUP_SIZES for split in (False, True)}
    comm_ms = {}

    def run(name, flags):
        measured = train(flags[1], MODEL + flags + ["--steps", args.steps], "sequence")
        # Where the last step's time in collectives went (blocking: it includes waiting for peers).
        comm_ms[name] = {op: ms for op, ms in read_records("sequence")[-2]["comm_ms"].items() if ms > 0}
        return measured

    step_ms, summaries = interleaved_rounds(args.rounds, layouts, run)
    rows = {}
    for name, flags in layouts.items():
        activations = summaries[name]["placement"]["activations"]
        rows[name] = {"flags": [str(flag) for flag in flags],
                      "activation_peak_bytes": activations["measured_bytes"],
                      "predicted_activation_peak_bytes": activations["predicted_bytes"],
                      "tensor_group_bytes_per_step": summaries[name]["comm_bytes_by_group"]["tp"],
                      "comm_ms_last_step": comm_ms[name],
                      "step_ms": statistics.median(step_ms[name]),
                      "step_ms_by_round": step_ms[name]}
    replicated = replicated_bytes()
    ratios = {}
    for size in GROUP_SIZES:
        plain, split = rows[f"tp{size}"], rows[f"tp{size} sp"]
        saved = plain["activation_peak_bytes"] - split["activation_peak_bytes"]
        # What the replicated rows still hold split, over what they held whole (goal: 1 / T).
        ratios[f"T={size}: replicated part held, split over whole"] = (replicated - saved) / replicated
        ratios[f"T={size}: activation peak, split over plain"] = split["activation_peak_bytes"] / plain["activation_peak_bytes"]
        ratios[f"T={size}: step time, split over plain"] = split["step_ms"] / plain["step_ms"]
    result = {"setup": f"T ranks on {os.cpu_count()} cores, one micro-batch of {BATCH} rows",
              "model": " ".join(map(str, MODEL)),
              "replicated_bytes_under_plain_tensor_parallelism": replicated,
              "layouts": rows,
              "ratios": ratios,
              "goals": {"replicated part held, split over whole": "1 / T", "step time, split over plain": "<= 1.05"}}
    for name, row in rows.items():
        print(f"{name:>7}: activation peak {row['activation_peak_bytes'] / 2**20:7.1f} MiB "
              f"(predicted {row['predicted_activation_peak_bytes'] / 2**20:.1f}), step {row['step_ms']:.1f} ms")
    for name, value in ratios.items():
        print(f"{name}: {value:.3f}")
    write_result(args.output, result)
    draw(result, os.path.splitext(args.output)[0] + ".png")


if __name__ == "__main__":
    main()
