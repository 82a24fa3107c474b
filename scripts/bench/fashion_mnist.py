#!/usr/bin/python3
"""Fashion-MNIST in every layout: held-out accuracy by epoch, and each layout's losses against one
process on the real data.

The model 784-512-512-10 (--layers 3 --hidden 512), global batch 128, --shuffle, AdamW at 1e-3
with a cosine schedule after 200 warm-up steps, --epochs epochs of the 60,000 training images,
evaluated on the 10,000 test images after each epoch, in each layout:

  one process; dp 2; tp 2; pp 2 (4 micro-batches); ep 2 (the hidden layer an MoE layer of 4
  experts, top-2, dp 2); ZeRO-3 (dp 2); bf16 (dp 2, --param-dtype bf16)

For the fp32 layouts, the largest relative difference of the first --compare-steps losses from one
process's is recorded (they agree within 1e-5; later steps drift apart by rounding, as any two
orders of summation do). Writes results/fashion_mnist.json and results/fashion_mnist.png (accuracy
by epoch for each layout). The data come from Debian's dataset-fashion-mnist through
scripts/datasets/idx_to_hdf5.py (see data.py), or --data FILE."""
import os

from data import fashion_mnist_file
from benchlib import arguments, read_records, train, write_result

# An epoch rounded up to whole steps (60,000 / 128 = 468.75), as docs/data.md's command counts it.
STEPS_PER_EPOCH = -(-60000 // 128)
LAYOUTS = {
    "one process": (1, []),
    "dp 2": (2, ["--dp", 2]),
    "tp 2": (2, ["--tp", 2]),
    "pp 2": (2, ["--pp", 2, "--micro-batches", 4]),
    "ep 2 (MoE)": (2, ["--dp", 2, "--ep", 2, "--moe-every", 1, "--experts", 4, "--top-k", 2]),
    "ZeRO-3": (2, ["--dp", 2, "--zero", 3]),
    "bf16": (2, ["--dp", 2, "--param-dtype", "bf16"]),
}
FP32_LAYOUTS = ("dp 2", "tp 2", "pp 2", "ZeRO-3")


def plot(result, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(7, 4.5))
    for name, layout in result["layouts"].items():
        epochs = range(1, len(layout["accuracy_by_epoch"]) + 1)
        axis.plot(epochs, [100 * a for a in layout["accuracy_by_epoch"]], marker="o", markersize=3, label=name)
    axis.axhline(89.5, color="grey", linestyle=":", linewidth=1, label="89.5 %")
    axis.set_xlabel("epoch")
    axis.set_ylabel("held-out accuracy (%)")
    axis.set_ylim(84, 92)
    axis.set_title("Fashion-MNIST, 784-512-512-10, by layout")
    axis.legend(fontsize=8, ncol=2)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"fashion_mnist: wrote {path}")


def fashion_model(data, epochs):
    """The recipe's options: the model, the batch, the schedule and an evaluation each epoch."""
    return ["--dataset", "hdf5", "--data-path", data, "--layers", 3, "--hidden", 512, "--global-batch", 128,
            "--shuffle", "--lr", "1e-3", "--lr-schedule", "cosine", "--warmup-steps", 200,
            "--steps", epochs * STEPS_PER_EPOCH, "--eval-every", STEPS_PER_EPOCH]


def main():
    parser = arguments(__doc__.split("\n\n")[0], rounds=1, steps=0, result_file="fashion_mnist.json")
    parser.add_argument("--data", help="an HDF5 file of the Fashion-MNIST layout")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--compare-steps", type=int, default=50)
    args = parser.parse_args()
    data = fashion_mnist_file(args.data)
    steps = args.epochs * STEPS_PER_EPOCH
    model = fashion_model(data, args.epochs)
    layouts = {}
    losses = {}
    for name, (ranks, flags) in LAYOUTS.items():
        tag = "fashion-" + "".join(c if c.isalnum() else "-" for c in name)
        step_ms, summary = train(ranks, model + flags, tag, bind_to_cores=True)
        records = [record for record in read_records(tag) if not record.get("summary")]
        losses[name] = [record["loss"] for record in records]
        accuracy = [record["eval_accuracy"] for record in records if "eval_accuracy" in record]
        layouts[name] = {"ranks": ranks, "flags": [str(flag) for flag in flags], "accuracy_by_epoch": accuracy,
                         "final_accuracy": accuracy[-1], "final_loss": summary["final_loss"], "step_ms": step_ms,
                         "data_ms": summary.get("data_ms")}
        print(f"fashion_mnist: {name}: held-out accuracy {100 * accuracy[-1]:.2f} % after {args.epochs} epochs, "
              f"{step_ms:.2f} ms a step", flush=True)
    reference = losses["one process"][:args.compare_steps]
    for name in FP32_LAYOUTS:
        mine = losses[name][:args.compare_steps]
        layouts[name]["first_losses_max_relative_difference"] = max(
            abs(a - b) / abs(b) for a, b in zip(mine, reference))
    result = {"model": "784-512-512-10", "epochs": args.epochs, "steps": steps,
              "schedule": "AdamW 1e-3, cosine, 200 warm-up steps, global batch 128, --shuffle",
              "compare_steps": args.compare_steps, "target_accuracy": 0.895, "layouts": layouts}
    write_result(args.output, result)
    plot(result, os.path.splitext(args.output)[0] + ".png")


if __name__ == "__main__":
    main()
