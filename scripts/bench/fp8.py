#!/usr/bin/python3
"""fp8 against bf16 on the CPU's exact emulation (DESIGN.md §2.7): what the format does to
accuracy, in the layouts it runs in, and what the emulation costs beside bf16.

  mixture   the built-in mixture data, 16 layers of 1024, 500 steps: the loss (the mean of the last
            50 steps' losses, averaged over --seeds seeds) of bf16 and of fp8 tensorwise, rowwise
            and tensorwise with e5m2 gradients, one process; and the median step of each
  fashion   Fashion-MNIST, fashion_mnist.py's recipe (784-512-512-10, --epochs epochs), held-out
            accuracy after each epoch for bf16 and fp8 (tensorwise, rowwise) in one process, dp 2,
            tp 2, pp 2 (4 micro-batches) and ZeRO-3 (dp 2)

Goals (issue: fp8 training): the mixture loss within 2 % of bf16's; Fashion-MNIST within 0.3
points of bf16 in every layout. Writes results/fp8.json with the CPU model and the date."""
import json
import os
import statistics

from benchlib import arguments, read_records, stamp, train, write_result
from data import fashion_mnist_file
from fashion_mnist import fashion_model

RECIPES = {"bf16": [], "fp8 tensorwise": ["--fp8", "tensorwise"], "fp8 rowwise": ["--fp8", "rowwise"],
           "fp8 tensorwise, e5m2 gradients": ["--fp8", "tensorwise", "--fp8-grad-format", "e5m2"]}
LAYOUTS = {"one process": (1, []), "dp 2": (2, ["--dp", 2]), "tp 2": (2, ["--tp", 2]),
           "pp 2": (2, ["--pp", 2, "--micro-batches", 4]), "ZeRO-3": (2, ["--dp", 2, "--zero", 3])}


def tag_of(*names):
    return "fp8-" + "-".join("".join(c if c.isalnum() else "-" for c in name) for name in names)


def mixture(steps, seeds):
    """Each recipe from the same `seeds` (one step's loss on fresh samples varies by about 10 %,
    and two runs that round differently part ways: a single pair of runs cannot resolve 2 %)."""
    model = ["--dataset", "mixture", "--layers", 16, "--hidden", 1024, "--steps", steps, "--param-dtype", "bf16"]
    runs = {}
    for recipe, flags in RECIPES.items():
        by_seed = []
        for seed in range(1, seeds + 1):
            tag = tag_of("mixture", recipe, str(seed))
            step_ms, summary = train(1, model + flags + ["--seed", seed], tag, bind_to_cores=True)
            losses = [record["loss"] for record in read_records(tag) if not record.get("summary")]
            by_seed.append({"seed": seed, "last_50_mean_loss": statistics.fmean(losses[-50:]),
                            "final_loss": summary["final_loss"], "step_ms": step_ms})
        runs[recipe] = {"flags": [str(flag) for flag in flags], "seeds": by_seed,
                        "loss": statistics.fmean(run["last_50_mean_loss"] for run in by_seed),
                        "step_ms": statistics.median(run["step_ms"] for run in by_seed)}
    bf16 = runs["bf16"]
    for recipe, run in runs.items():
        run["loss_over_bf16"] = run["loss"] / bf16["loss"]
        run["loss_over_bf16_by_seed"] = [mine["last_50_mean_loss"] / theirs["last_50_mean_loss"]
                                         for mine, theirs in zip(run["seeds"], bf16["seeds"])]
        run["step_over_bf16"] = run["step_ms"] / bf16["step_ms"]
        print(f"fp8: mixture {recipe}: loss {run['loss']:.4f} (last 50 steps, mean of {seeds} seeds), "
              f"{run['loss_over_bf16']:.4f} of bf16's (by seed {', '.join(f'{r:.3f}' for r in run['loss_over_bf16_by_seed'])}); "
              f"{run['step_ms']:.1f} ms a step, {run['step_over_bf16']:.2f}x bf16's", flush=True)
    return {"model": "16 x 1024, mixture, default batch", "steps": steps, "seeds": seeds,
            "measure": "mean over the seeds of the mean loss of the last 50 steps",
            "goal": "loss within 2 % of bf16's", "runs": runs}


def fashion(data, epochs):
    model = fashion_model(data, epochs) + ["--param-dtype", "bf16"]
    runs = {}
    for layout, (ranks, layout_flags) in LAYOUTS.items():
        for recipe in ("bf16", "fp8 tensorwise", "fp8 rowwise"):
            tag = tag_of("fashion", layout, recipe)
            step_ms, _ = train(ranks, model + layout_flags + RECIPES[recipe], tag, bind_to_cores=True)
            accuracy = [r["eval_accuracy"] for r in read_records(tag) if "eval_accuracy" in r and not r.get("summary")]
            runs.setdefault(layout, {})[recipe] = {"accuracy_by_epoch": accuracy, "final_accuracy": accuracy[-1],
                                                   "step_ms": step_ms}
        bf16 = runs[layout]["bf16"]["final_accuracy"]
        for recipe, run in runs[layout].items():
            run["points_from_bf16"] = 100 * (run["final_accuracy"] - bf16)
            print(f"fp8: Fashion-MNIST {layout}, {recipe}: {100 * run['final_accuracy']:.2f} % after {epochs} "
                  f"epochs ({run['points_from_bf16']:+.2f} points from bf16)", flush=True)
    return {"recipe": "scripts/bench/fashion_mnist.py's, --param-dtype bf16", "epochs": epochs,
            "goal": "within 0.3 points of bf16 in every layout", "layouts": runs}


def main():
    parser = arguments(__doc__.split("\n\n")[0], rounds=1, steps=500, result_file="fp8.json")
    parser.add_argument("--parts", default="mixture,fashion")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--seeds", type=int, default=3, help="mixture: runs of each recipe, from seeds 1 to N")
    parser.add_argument("--data", help="an HDF5 file of the Fashion-MNIST layout")
    args = parser.parse_args()
    parts = args.parts.split(",")
    # The parts run now replace theirs in the file; each part keeps the command, machine and date
    # that made it.
    result = {}
    if os.path.exists(args.output):
        with open(args.output) as handle:
            result = {key: value for key, value in json.load(handle).items() if key in ("mixture", "fashion_mnist")}
    if "mixture" in parts:
        result["mixture"] = {**stamp(), **mixture(args.steps, args.seeds)}
    if "fashion" in parts:
        result["fashion_mnist"] = {**stamp(), **fashion(fashion_mnist_file(args.data), args.epochs)}
    write_result(args.output, result)


if __name__ == "__main__":
    main()
