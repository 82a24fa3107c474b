#!/usr/bin/env python3
"""The foundation's speed benchmark, everything measured side by side in one run (these machines
are shared and noisy, so only ratios measured together mean anything):

  * OpenBLAS SGEMM on the three GEMM shapes of each layer (build/layerbench), and from it the
    GEMM time of a whole training step;
  * mlptrain at 1 and 2 ranks (batch 256 per rank): step time, achieved FLOP/s against SGEMM's,
    non-GEMM share of the step, data-parallel speed-up;
  * the PyTorch peer (scripts/torch_peer.py; DDP over gloo at 2 ranks) on the same model.

Model: 10 layers, width 1024, input 1024, 10 classes, fp32, one BLAS thread per rank. The runs are
interleaved over --rounds rounds and medians reported. Writes results/foundation_speed.json."""
import os
import statistics
import sys

from benchlib import BUILD, ROOT, arguments, run_json, train, write_result


def mlptrain_step_ms(ranks, args):
    return train(ranks, ["--dataset", "mixture", "--layers", args.layers, "--hidden", args.width,
                         "--input-dim", args.width, "--output-dim", 10, "--global-batch", 256 * ranks,
                         "--steps", args.steps], f"foundation-{ranks}")[0]


def torch_step_ms(ranks, args):
    command = [sys.executable, os.path.join(ROOT, "scripts", "torch_peer.py"), "--layers",
               str(args.layers), "--hidden", str(args.width), "--input-dim", str(args.width),
               "--steps", str(args.steps)]
    if ranks > 1:
        command = ["mpiexec.mpich", "-n", str(ranks)] + command
    return run_json(command)[0]["step_ms"]


def main():
    parser = arguments(__doc__, rounds=3, steps=12, result_file="foundation_speed.json")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    args = parser.parse_args()
    try:
        import torch  # noqa: F401
        have_torch = not args.no_torch
    except ImportError:
        have_torch = False
        print("bench: PyTorch not installed (apt-get install python3-torch): peer skipped")

    rows, width = 256, args.width
    samples = {"gemm": [], "gemm_last": [], "ours_1": [], "ours_2": [], "torch_1": [], "torch_2": []}
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        samples["gemm"].append(run_json([os.path.join(BUILD, "layerbench"), str(rows), str(width), str(width)])[0])
        samples["gemm_last"].append(run_json([os.path.join(BUILD, "layerbench"), str(rows), str(width), "10"])[0])
        samples["ours_1"].append(mlptrain_step_ms(1, args))
        samples["ours_2"].append(mlptrain_step_ms(2, args))
        if have_torch:
            samples["torch_1"].append(torch_step_ms(1, args))
            samples["torch_2"].append(torch_step_ms(2, args))

    def median_of(key, field):
        return statistics.median(sample[field] for sample in samples[key])

    forward = median_of("gemm", "forward_gemm_ms")
    weight_grad = median_of("gemm", "weight_grad_gemm_ms")
    input_grad = median_of("gemm", "input_grad_gemm_ms")
    last = sum(median_of("gemm_last", key) for key in ("forward_gemm_ms", "weight_grad_gemm_ms", "input_grad_gemm_ms"))
    hidden_layers = args.layers - 2
    # Layer 0 needs no input gradient; the last layer maps to the 10 classes.
    gemm_step_ms = (forward + weight_grad) + hidden_layers * (forward + weight_grad + input_grad) + last
    flops = 2 * rows * width * width * (2 + 3 * hidden_layers) + 6 * rows * width * 10
    sgemm_gflops = 3 * 2 * rows * width * width / (forward + weight_grad + input_grad) / 1e6
    ours_1 = statistics.median(samples["ours_1"])
    ours_2 = statistics.median(samples["ours_2"])
    result = {
        "model": {"layers": args.layers, "width": width, "input": width, "classes": 10,
                  "batch_per_rank": rows},
        "sgemm_gflops_layer_shapes": sgemm_gflops,
        "gemm_ms_per_step": gemm_step_ms,
        "ours_step_ms_1_rank": ours_1,
        "ours_step_ms_2_ranks": ours_2,
        "ours_gflops_1_rank": flops / ours_1 / 1e6,
        "flops_efficiency_vs_sgemm": flops / ours_1 / 1e6 / sgemm_gflops,
        "non_gemm_share_of_step": (ours_1 - gemm_step_ms) / ours_1,
        "data_parallel_speedup_2_ranks": 2 * ours_1 / ours_2,
        "targets": {"flops_efficiency_vs_sgemm": ">= 0.90", "non_gemm_share_of_step": "<= 0.10",
                    "ours_over_torch_1_rank": "<= 0.80", "ours_over_torch_2_ranks": "<= 0.62",
                    "data_parallel_speedup_2_ranks": ">= 1.8"},
        "samples": samples,
    }
    if have_torch:
        torch_1 = statistics.median(samples["torch_1"])
        torch_2 = statistics.median(samples["torch_2"])
        result.update({"torch_step_ms_1_rank": torch_1, "torch_step_ms_2_ranks": torch_2,
                       "ours_over_torch_1_rank": ours_1 / torch_1,
                       "ours_over_torch_2_ranks": ours_2 / torch_2})
    write_result(args.output, result)
    for key, value in result.items():
        if isinstance(value, float):
            print(f"{key:34s} {value:10.3f}")


if __name__ == "__main__":
    main()
