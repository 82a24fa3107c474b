#!/usr/bin/python3
"""The ZeRO paper's bytes per parameter by stage (Rajbhandari et al. 2020, figure 1: 2 + 2 + K
with K = 12 for mixed-precision AdamW), reproduced by the program: for each stage 0-3, a run of
one step at --ranks ranks with bf16 parameters and bf16 (or fp32) gradient reductions, whose
rank 0 predicted and measured params, grads and optimizer bytes are divided by the model's
parameter count and set beside the paper's formulas:

  stage 0: P + G + K      stage 1: P + G + K/N      stage 2: P + (G + K)/N      stage 3: (P + G + K)/N

with P = 2 (bf16 compute copy), G = 2 (bf16 gradients; 4 with fp32 reduction), K = 12 (fp32
master, exp_avg, exp_avg_sq). The layer widths are multiples of N, so padding is negligible.
Writes results/zero_bytes.json."""
from benchlib import arguments, train, write_result

MODEL = ["--dataset", "teacher", "--layers", "6", "--hidden", "512", "--input-dim", "512", "--output-dim", "8",
         "--global-batch", "64", "--param-dtype", "bf16"]


def paper_bytes(stage, ranks, gradient_bytes):
    param, optimizer = 2, 12
    return {0: param + gradient_bytes + optimizer,
            1: param + gradient_bytes + optimizer / ranks,
            2: param + (gradient_bytes + optimizer) / ranks,
            3: (param + gradient_bytes + optimizer) / ranks}[stage]


def main():
    parser = arguments(__doc__, rounds=1, steps=1, result_file="zero_bytes.json")
    parser.add_argument("--ranks", type=int, default=8)
    args = parser.parse_args()
    table = []
    for reduce_dtype, gradient_bytes in (("bf16", 2), ("fp32", 4)):
        for stage in range(4):
            _, summary = train(args.ranks, MODEL + ["--reduce-dtype", reduce_dtype, "--zero", stage,
                                                    "--steps", args.steps], f"zero-bytes-{stage}", warm_up_steps=0)
            placement = summary["placement"]
            parameters = summary["parameters"]
            row = {"reduce_dtype": reduce_dtype, "stage": stage, "ranks": args.ranks, "parameters": parameters,
                   "paper_bytes_per_parameter": paper_bytes(stage, args.ranks, gradient_bytes)}
            for kind in ("predicted", "measured"):
                by_state = {state: placement[state][f"{kind}_bytes"] / parameters
                            for state in ("params", "grads", "optimizer")}
                row[f"{kind}_bytes_per_parameter"] = {**by_state, "total": sum(by_state.values())}
            table.append(row)
            print(f"reduce {reduce_dtype}, stage {stage}: paper {row['paper_bytes_per_parameter']:.3f}, "
                  f"predicted {row['predicted_bytes_per_parameter']['total']:.3f}, "
                  f"measured {row['measured_bytes_per_parameter']['total']:.3f} bytes per parameter", flush=True)
    write_result(args.output, {"model": " ".join(MODEL), "bytes_per_parameter": table})


if __name__ == "__main__":
    main()
