#!/usr/bin/python3
"""Scaling experiments, one command each. Every experiment runs mlptrain over a list of layouts
(printing "run n of m" with the time spent and an estimate of the time left), writes one JSON
object per run to DIR/NAME.jsonl and a plot to DIR/NAME.png.

  scaling    strong (fixed global batch) and weak (fixed batch per rank) scaling of every
             strategy and the main combinations, over world sizes up to the cores present
             (--max-ranks): speed-up and efficiency against one process
  memory     rank 0's peak memory by state against ZeRO stage and world size, the predicted
             bytes beside the measured ones
  comm       communication per step by collective against layout, predicted and measured
  pipeline   1F1B against GPipe at 2 stages: the bubble measured from the trace against the
             ideal (P-1)/(M+P-1), step time and stage 0's activation memory against micro-batches
  recompute  peak activation memory and step time with and without --recompute against depth
  pytorch    mlptrain's step time against PyTorch's on the same model (needs python3-torch)
  transport  MPI staged through host memory against NCCL device to device, on the GPU: commbench's
             all-reduce bandwidth by size for mpi-host, mpi-staged and nccl, and the step time
             of each layout with --comm mpi and --comm nccl (NCCL at most one rank per GPU). Needs
             a GPU, and is skipped with the reason where there is none; --transport-device
             loopback runs its MPI half on the loopback device instead
  all        all of the above

--tiny shrinks every model and list to a smoke run of a few seconds (the test suite runs it).
Timings come from medians of the steps after a warm-up, ranks pinned to cores when they fit;
the machines are shared and noisy, so compare ratios within one run of an experiment."""
import argparse
import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the file-only backend)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
from benchlib import ENVIRONMENT, PROGRAM, ROOT, layout_problem, stamp  # noqa: E402

from transport import device_problem, transport  # noqa: E402
from experimentlib import MIB, STATES, Settings, placement_row, run_all, train  # noqa: E402

# ----------------------------------------------------------------------------------------- scaling
def scaling_layouts(settings):
    """(name, minimum ranks, arguments at n ranks, MoE model?) of every strategy and combination."""
    return [("dp", 2, lambda n: ["--dp", n], False),
            ("zero1", 2, lambda n: ["--dp", n, "--zero", 1], False),
            ("zero2", 2, lambda n: ["--dp", n, "--zero", 2], False),
            ("zero3", 2, lambda n: ["--dp", n, "--zero", 3], False),
            ("tp", 2, lambda n: ["--tp", n], False),
            ("pp", 2, lambda n: ["--pp", n, "--micro-batches", 2 * n], False),
            ("ep", 2, lambda n: ["--ep", n], True),
            ("dp x tp", 4, lambda n: ["--tp", 2], False),
            ("dp x pp", 4, lambda n: ["--pp", 2, "--micro-batches", 4], False),
            ("tp x pp", 4, lambda n: ["--tp", n // 2, "--pp", 2, "--micro-batches", 4], False)]


def fits(model, ranks, layout):
    """Whether mlptrain accepts the model under the layout at `ranks` ranks: asked of mlpplan, which
    validates as mlptrain does (a layer per stage, whole experts and width slices, whole
    micro-batches on every data-parallel rank, ...). A strategy's minimum ranks is the
    experiment's choice and checked apart."""
    return layout_problem(ranks, model + layout) is None


def scaling(settings):
    runs = []
    for kind in ("strong", "weak"):
        for moe in (False, True):
            model = settings.moe_model() if moe else settings.model()
            runs.append((f"{kind}: one process{' (MoE)' if moe else ''}", 1, model,
                         {"kind": kind, "strategy": "one process", "moe": moe}))
        for strategy, minimum, layout, moe in scaling_layouts(settings):
            for ranks in settings.world_sizes():
                batch = settings.batch * (ranks if kind == "weak" else 1)
                model = settings.moe_model(batch) if moe else settings.model(batch=batch)
                if ranks < minimum or not fits(model, ranks, layout(ranks)):
                    continue
                runs.append((f"{kind}: {strategy} at {ranks} ranks", ranks, model + layout(ranks),
                             {"kind": kind, "strategy": strategy, "moe": moe, "global_batch": batch}))
    for strategy, minimum, _, _ in scaling_layouts(settings):
        if minimum > settings.max_ranks:
            print(f"scaling: {strategy} needs {minimum} ranks, {settings.max_ranks} allowed "
                  f"(--max-ranks {minimum} runs it, oversubscribed if the cores are fewer)")

    def measure(ranks, arguments, fields):
        step_ms, summary = train(settings, ranks, arguments)
        return {"step_ms": step_ms, "samples_per_s": summary["samples_per_s"]}

    rows = run_all(settings, "scaling", runs, measure)
    for row in rows:  # against the one-process run of the same kind and model
        base = next(r for r in rows if r["kind"] == row["kind"] and r["ranks"] == 1 and r["moe"] == row["moe"])
        row["speedup"] = row["samples_per_s"] / base["samples_per_s"]
        row["efficiency"] = row["speedup"] / row["ranks"]
    figure, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for axis, kind, key in ((axes[0], "strong", "speedup"), (axes[1], "weak", "efficiency")):
        for strategy in dict.fromkeys(r["strategy"] for r in rows if r["ranks"] > 1):
            chosen = [r for r in rows if r["kind"] == kind and (r["strategy"] == strategy or
                      (r["ranks"] == 1 and r["moe"] == (strategy == "ep")))]
            chosen.sort(key=lambda r: r["ranks"])
            axis.plot([r["ranks"] for r in chosen], [r[key] for r in chosen], marker="o", label=strategy)
        sizes = settings.world_sizes()
        axis.plot(sizes, sizes if key == "speedup" else [1] * len(sizes), "k--", lw=1, label="ideal")
        axis.set_xlabel("ranks")
        axis.set_ylabel("samples/s over one process" if key == "speedup" else "speed-up / ranks")
        axis.set_title(f"{kind} scaling ({key})")
        axis.set_xticks(sizes)
    axes[1].legend(fontsize=8, ncol=2)
    return rows, figure


# ------------------------------------------------------------------------------------------ memory
def memory(settings):
    sizes = [1, 2] if settings.tiny else [1, 2, 4]  # bytes do not need a core per rank
    runs = [(f"ZeRO {stage} at {ranks} rank(s)", ranks, settings.model(steps=2) + ["--zero", stage],
             {"zero": stage}) for stage in (0, 1, 2, 3) for ranks in sizes if stage == 0 or ranks > 1]
    rows = run_all(settings, "memory", runs,
                   lambda ranks, arguments, fields: placement_row(train(settings, ranks, arguments)[1]))
    figure, axes = plt.subplots(1, 4, figsize=(14, 3.8), sharey=True)
    colors = dict(zip(STATES, ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple")))
    for axis, stage in zip(axes, (0, 1, 2, 3)):
        chosen = sorted((r for r in rows if r["zero"] == stage or r["ranks"] == 1), key=lambda r: r["ranks"])
        ranks = [r["ranks"] for r in chosen]
        for state in STATES:
            axis.plot(ranks, [r["measured_bytes"][state] / MIB for r in chosen], "o-", color=colors[state],
                      label=f"{state} measured")
            axis.plot(ranks, [r["predicted_bytes"][state] / MIB for r in chosen], "x--", color=colors[state],
                      ms=9, label=f"{state} predicted")
        axis.set_title(f"ZeRO stage {stage}" if stage else "plain DP")
        axis.set_xlabel("ranks")
        axis.set_xticks(sizes)
    axes[0].set_ylabel("rank 0 peak (MiB)")
    axes[-1].legend(fontsize=7)
    return rows, figure


# -------------------------------------------------------------------------------------------- comm
def comm(settings):
    layouts = [("dp 2", 2, ["--dp", 2]), ("ZeRO-1 dp 2", 2, ["--zero", 1]), ("ZeRO-2 dp 2", 2, ["--zero", 2]),
               ("ZeRO-3 dp 2", 2, ["--zero", 3]), ("tp 2", 2, ["--tp", 2]),
               ("pp 2", 2, ["--pp", 2, "--micro-batches", 4]), ("ep 2 (MoE)", 2, ["--ep", 2]),
               ("dp 2 (MoE)", 2, ["--dp", 2])]
    if not settings.tiny:
        layouts += [("dp 4", 4, ["--dp", 4]), ("ZeRO-3 dp 4", 4, ["--zero", 3]),
                    ("dp 2 x tp 2", 4, ["--tp", 2]), ("dp 2 x pp 2", 4, ["--pp", 2, "--micro-batches", 4]),
                    ("tp 2 x pp 2", 4, ["--tp", 2, "--pp", 2, "--micro-batches", 4]),
                    ("ep 2 x dp 4 (MoE)", 4, ["--ep", 2])]
    runs = [(label, ranks, (settings.moe_model(steps=3) if "MoE" in label else settings.model(steps=3)) + flags,
             {"layout": label}) for label, ranks, flags in layouts]
    rows = run_all(settings, "comm", runs,
                   lambda ranks, arguments, fields: placement_row(train(settings, ranks, arguments)[1]))
    ops = [op for op in ("all_reduce", "reduce_scatter", "all_gather", "all_to_all", "send", "recv")
           if any(r["comm_measured_bytes"].get(op) for r in rows)]
    figure, axis = plt.subplots(figsize=(12, 4.2))
    width = 0.8 / max(1, len(ops))
    for index, op in enumerate(ops):
        positions = [i + index * width for i in range(len(rows))]
        axis.bar(positions, [r["comm_measured_bytes"].get(op, 0) / MIB for r in rows], width, label=f"{op} measured")
        predicted = [r["comm_predicted_bytes"].get(op, 0) / MIB or float("nan") for r in rows]  # none: no mark
        axis.plot(positions, predicted, "kx", ms=7, label="predicted" if index == 0 else None)
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], [r["layout"] for r in rows],
                    rotation=30, ha="right", fontsize=8)
    axis.set_ylabel("rank 0 bytes per step (MiB)")
    axis.set_yscale("symlog", linthresh=0.01)
    axis.set_title("communication per step by layout")
    axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    return rows, figure


# ---------------------------------------------------------------------------------------- pipeline
def pipeline(settings):
    stages = 2
    counts = [1, 2, 4] if settings.tiny else [1, 2, 4, 8, 16]
    runs = [(f"{schedule} with {count} micro-batches", stages,
             settings.model() + ["--pp", stages, "--micro-batches", count, "--schedule", schedule],
             {"schedule": schedule, "micro_batches": count, "stages": stages})
            for count in counts for schedule in ("1f1b", "gpipe")]

    def measure(ranks, arguments, fields):
        trace = os.path.join(settings.scratch, "trace.json")
        step_ms, summary = train(settings, ranks, arguments, trace=trace)
        report = json.loads(subprocess.run(
            [sys.executable, os.path.join(ROOT, "scripts", "tools", "trace_timeline.py"), trace, "--json",
             "--output", os.path.join(settings.scratch, "timeline.png")],
            capture_output=True, text=True, check=True).stdout)
        return {"step_ms": step_ms, "bubble": report["bubble"],
                "ideal_bubble": report["ideal_bubble"],  # the schedule table's theory, from the trace
                "stage0_activation_bytes": summary["peak_mem_bytes_by_rank"][0]["activations"],
                "stage0_predicted_activation_bytes": summary["placement"]["activations"]["predicted_bytes"]}

    rows = run_all(settings, "pipeline", runs, measure)
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    for schedule, marker in (("1f1b", "o"), ("gpipe", "s")):
        chosen = [r for r in rows if r["schedule"] == schedule]
        counts_of = [r["micro_batches"] for r in chosen]
        axes[0].plot(counts_of, [r["bubble"] for r in chosen], marker=marker, label=f"{schedule} measured")
        axes[1].plot(counts_of, [r["step_ms"] for r in chosen], marker=marker, label=schedule)
        axes[2].plot(counts_of, [r["stage0_activation_bytes"] / MIB for r in chosen], marker=marker,
                     label=f"{schedule} measured")
        axes[2].plot(counts_of, [r["stage0_predicted_activation_bytes"] / MIB for r in chosen], "kx", ms=8,
                     label="predicted" if schedule == "gpipe" else None)
    axes[0].plot(counts, [(stages - 1) / (m + stages - 1) for m in counts], "k--", lw=1, label="(P-1)/(M+P-1)")
    for axis, title, label in ((axes[0], "bubble (idle share of the step)", "bubble"),
                               (axes[1], "step time", "ms"),
                               (axes[2], "stage 0 peak activations", "MiB")):
        axis.set_xscale("log", base=2)
        axis.set_xticks(counts, [str(m) for m in counts])
        axis.set_xlabel("micro-batches M")
        axis.set_ylabel(label)
        axis.set_title(title)
        axis.legend(fontsize=7)
    figure.tight_layout()
    return rows, figure


# --------------------------------------------------------------------------------------- recompute
def recompute(settings):
    depths = [4, 8] if settings.tiny else [4, 8, 16, 32]
    runs = [(f"{depth} layers{' recomputed' if flag else ''}", 1,
             settings.model(layers=depth) + (["--recompute"] if flag else []),
             {"layers": depth, "recompute": flag}) for depth in depths for flag in (False, True)]

    def measure(ranks, arguments, fields):
        step_ms, summary = train(settings, ranks, arguments)
        return {"step_ms": step_ms, "final_loss": summary["final_loss"],
                "activation_bytes": summary["placement"]["activations"]["measured_bytes"],
                "predicted_activation_bytes": summary["placement"]["activations"]["predicted_bytes"]}

    rows = run_all(settings, "recompute", runs, measure)
    figure, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    for flag, marker in ((False, "o"), (True, "s")):
        chosen = [r for r in rows if r["recompute"] == flag]
        label = "recompute" if flag else "store all"
        axes[0].plot(depths, [r["activation_bytes"] / MIB for r in chosen], marker=marker, label=f"{label} measured")
        axes[0].plot(depths, [r["predicted_activation_bytes"] / MIB for r in chosen], "kx", ms=8,
                     label="predicted" if flag else None)
    stored = {r["layers"]: r for r in rows if not r["recompute"]}
    axes[1].plot(depths, [r["step_ms"] / stored[r["layers"]]["step_ms"] for r in rows if r["recompute"]],
                 marker="s", label="step time, recompute / store all")
    axes[1].plot(depths, [r["activation_bytes"] / stored[r["layers"]]["activation_bytes"]
                          for r in rows if r["recompute"]], marker="o", label="peak activations, recompute / store all")
    axes[0].set_ylabel("peak activations (MiB)")
    axes[1].set_ylabel("ratio")
    for axis in axes:
        axis.set_xlabel("layers")
        axis.set_xticks(depths)
        axis.legend(fontsize=7)
    figure.tight_layout()
    return rows, figure


# ----------------------------------------------------------------------------------------- pytorch
def pytorch(settings):
    widths = [16, 32] if settings.tiny else [256, 512, 1024]
    per_rank = 16 if settings.tiny else 256
    layers = settings.layers
    runs = [(f"{peer} width {width} at {ranks} rank(s)", ranks, [width], {"peer": peer, "width": width})
            for width in widths for ranks in settings.world_sizes(limit=2) for peer in ("mlptrain", "pytorch")]

    def measure(ranks, arguments, fields):
        width = arguments[0]
        if fields["peer"] == "mlptrain":
            return {"step_ms": train(settings, ranks, ["--dataset", "mixture", "--layers", layers, "--hidden", width,
                                                       "--input-dim", width, "--output-dim", 10, "--global-batch",
                                                       per_rank * ranks, "--steps", settings.steps])[0]}
        output = subprocess.run(["mpiexec.mpich", "-n", str(ranks), sys.executable,
                                 os.path.join(ROOT, "scripts", "bench", "torch_peer.py"), "--layers", str(layers),
                                 "--hidden", str(width), "--input-dim", str(width), "--batch-per-rank",
                                 str(per_rank), "--steps", str(settings.steps), "--warmup", str(settings.warm_up)],
                                capture_output=True, text=True, check=True, env=ENVIRONMENT).stdout
        return {"step_ms": [json.loads(line) for line in output.splitlines() if line.startswith("{")][0]["step_ms"]}

    rows = run_all(settings, "pytorch", runs, measure)
    figure, axis = plt.subplots(figsize=(6.5, 4))
    for ranks in settings.world_sizes(limit=2):
        ratios = []
        for width in widths:
            ours, theirs = (next(r["step_ms"] for r in rows if r["ranks"] == ranks and r["width"] == width
                                 and r["peer"] == peer) for peer in ("mlptrain", "pytorch"))
            ratios.append(ours / theirs)
        axis.plot(widths, ratios, marker="o", label=f"{ranks} rank(s)")
    axis.axhline(1.0, color="k", ls="--", lw=1)
    axis.set_xscale("log", base=2)
    axis.set_xticks(widths, [str(w) for w in widths])
    axis.set_xlabel("width")
    axis.set_ylabel("mlptrain step time / PyTorch's")
    axis.set_title(f"{layers} layers, batch {per_rank} per rank")
    axis.legend()
    return rows, figure


def torch_available():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


EXPERIMENTS = {"scaling": scaling, "memory": memory, "comm": comm, "pipeline": pipeline,
               "recompute": recompute, "pytorch": pytorch, "transport": transport}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", choices=list(EXPERIMENTS) + ["all"])
    parser.add_argument("--tiny", action="store_true", help="a smoke run on tiny models")
    parser.add_argument("--output-dir", default=os.path.join(ROOT, "results", "experiments"))
    parser.add_argument("--max-ranks", type=int, default=os.cpu_count() or 1,
                        help="largest world size of the timed experiments (default: the cores present)")
    parser.add_argument("--steps", type=int, default=0, help="steps per run (default 8, tiny 3)")
    parser.add_argument("--transport-device", choices=("cuda", "loopback"), default="cuda",
                        help="device of the transport experiment (loopback: its MPI half without a GPU)")
    args = parser.parse_args()
    if not os.access(PROGRAM, os.X_OK):
        sys.exit(f"experiments: {PROGRAM} is not built (run scripts/build/setup.sh, or set MLPTRAIN)")
    names = list(EXPERIMENTS) if args.experiment == "all" else [args.experiment]
    if "pytorch" in names and not torch_available():
        if args.experiment == "pytorch":
            sys.exit("experiments: pytorch needs PyTorch for /usr/bin/python3 (apt-get install python3-torch)")
        print("experiments: skipping pytorch: PyTorch is not installed (apt-get install python3-torch)")
        names.remove("pytorch")
    if "transport" in names and args.transport_device == "cuda":
        problem = device_problem(["--device", "cuda"])
        if problem:
            if args.experiment == "transport":
                sys.exit(f"experiments: transport needs a GPU: {problem}")
            print(f"experiments: skipping transport: it needs a GPU: {problem}")
            names.remove("transport")
    settings = Settings(args)
    os.makedirs(args.output_dir, exist_ok=True)
    for name in names:
        rows, figure = EXPERIMENTS[name](settings)
        figure.savefig(os.path.join(args.output_dir, f"{name}.png"), dpi=110, bbox_inches="tight")
        plt.close(figure)
        with open(os.path.join(args.output_dir, f"{name}.jsonl"), "w") as handle:
            for row in rows:
                handle.write(json.dumps({"experiment": name, **stamp(), **row}) + "\n")
        print(f"experiments: wrote {name}.jsonl and {name}.png in {args.output_dir}", flush=True)


if __name__ == "__main__":
    main()
