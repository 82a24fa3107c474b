#!/usr/bin/python3
"""Mixed precision's speed and convergence on the CPU, measured side by side in one run (ratios
only: these machines are shared and noisy, and the CPU behind them changes):

  * the benchmark model of scripts/bench/cpu.py (10 layers, width 1024, batch 256 per rank, one GEMM
    thread per rank): mlptrain's step at --param-dtype bf16 against fp32 at 1 rank, bf16 at 2
    ranks against 1 (data-parallel speed-up), fp16 at 1 rank (its GEMMs are widened to fp32 on
    this CPU), and bf16 against the time of the step's bf16 GEMMs at oneDNN's own rate (layerbench:
    each shape repeated, and the step's GEMMs in its order);
  * the PyTorch peer under torch.autocast("cpu", torch.bfloat16) on the same model, at 1 and 2
    ranks;
  * one traced bf16 run: where its step's time goes;
  * with --baseline PROGRAM: another build of mlptrain (an earlier commit's, say) at bf16 and 1
    rank in the same rounds, and this build's bf16 step over its;
  * unless --no-convergence: --convergence-steps steps of the classification data (the mixture
    dataset, the same model) at fp32 and at bf16, the final test loss and the mean training loss of
    the last 100 steps of each.

Runs are interleaved over --rounds rounds and medians reported. Writes
results/precision_speed.json."""
import statistics

from cpu import (GEMMS, layer_gemms, mlptrain_step_ms, model_arguments, model_parser,
                       torch_peer_available, torch_step_ms, traced_phases)
from benchlib import cpu_model, read_records, train, write_result

BF16, FP16 = ["--param-dtype", "bf16"], ["--param-dtype", "fp16"]


def convergence(args, dtype):
    """Final test loss and the mean training loss of the last 100 steps of a long run."""
    steps = args.convergence_steps
    model = model_arguments(args, 1)[:-2] + ["--steps", steps, "--eval-every", steps, "--lr", "3e-4"]
    name = f"precision-convergence-{dtype}"
    _, summary = train(1, model + ["--param-dtype", dtype], name, warm_up_steps=0)
    records = read_records(name)
    losses = [record["loss"] for record in records if not record.get("summary")]
    evaluated = [record["eval_loss"] for record in records if "eval_loss" in record]
    return {"final_eval_loss": evaluated[-1], "mean_loss_last_100_steps": statistics.mean(losses[-100:]),
            "final_loss": summary["final_loss"]}


def main():
    parser = model_parser(__doc__, "precision_speed.json")
    parser.add_argument("--convergence-steps", type=int, default=2000)
    parser.add_argument("--no-convergence", action="store_true")
    parser.add_argument("--baseline", help="another mlptrain build to time beside this one at bf16, 1 rank")
    args = parser.parse_args()
    have_torch = torch_peer_available(args)

    keys = ("hidden", "last", "fp32_1", "bf16_1", "bf16_2", "fp16_1", "torch_bf16_1", "torch_bf16_2", "baseline_bf16_1")
    samples = {key: [] for key in keys}
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        samples["hidden"].append(layer_gemms(256, args.width, args.width, ["bf16"], sequence=args.layers - 1)["bf16"])
        samples["last"].append(layer_gemms(256, args.width, 10, ["bf16"])["bf16"])
        samples["fp32_1"].append(mlptrain_step_ms(1, args, name="precision-fp32"))
        samples["bf16_1"].append(mlptrain_step_ms(1, args, BF16, name="precision-bf16"))
        samples["bf16_2"].append(mlptrain_step_ms(2, args, BF16, name="precision-bf16"))
        samples["fp16_1"].append(mlptrain_step_ms(1, args, FP16, name="precision-fp16"))
        if args.baseline:
            samples["baseline_bf16_1"].append(mlptrain_step_ms(1, args, BF16, name="precision-baseline",
                                                               program=args.baseline))
        if have_torch:
            samples["torch_bf16_1"].append(torch_step_ms(1, args, ["--autocast", "bf16"]))
            samples["torch_bf16_2"].append(torch_step_ms(2, args, ["--autocast", "bf16"]))

    def median_field(key, field):
        return statistics.median(sample[field] for sample in samples[key])

    # The step's bf16 GEMMs at the library's rate: every hidden layer's three (layer 0 has no input
    # gradient) and the last layer's, each shape repeated on its buffers, or in the step's order.
    hidden_gemms = 3 * (args.layers - 1) - 1
    last_ms = sum(median_field("last", f"library_{gemm}_gemm_ms") for gemm in GEMMS)
    hidden = {gemm: median_field("hidden", f"library_{gemm}_gemm_ms") for gemm in GEMMS}
    gemm_ms = sum(hidden.values()) * (args.layers - 1) - hidden["input_grad"] + last_ms
    sequence_gemm_ms = median_field("hidden", "library_sequence_gemm_ms") * hidden_gemms + last_ms
    step = {key: statistics.median(samples[key]) for key in ("fp32_1", "bf16_1", "bf16_2", "fp16_1")}
    result = {
        "kernels": samples["hidden"][0]["kernels"],
        "model": {"layers": args.layers, "width": args.width, "input": args.width, "classes": 10,
                  "batch_per_rank": 256},
        "step_ms": step,
        "bf16_over_fp32_1_rank": step["bf16_1"] / step["fp32_1"],
        "fp16_over_fp32_1_rank": step["fp16_1"] / step["fp32_1"],
        "bf16_gemm_ms_per_step_at_onednn_rate": gemm_ms,
        "bf16_gemm_ms_per_step_at_onednn_rate_in_step_order": sequence_gemm_ms,
        "bf16_step_over_gemm_time": step["bf16_1"] / gemm_ms,
        "bf16_step_over_gemm_time_in_step_order": step["bf16_1"] / sequence_gemm_ms,
        "bf16_data_parallel_speedup_2_ranks": 2 * step["bf16_1"] / step["bf16_2"],
        "bf16_phases_ms_1_rank": {"traced": traced_phases(args, BF16, "precision-trace"),
                                  "gelu_forward_per_layer": median_field("hidden", "gelu_forward_ms"),
                                  "gelu_backward_per_layer": median_field("hidden", "gelu_backward_ms"),
                                  "adamw_per_million_parameters": median_field("hidden", "adamw_ms")},
        "targets": {"bf16_over_fp32_1_rank": "<= 0.55", "bf16_step_over_gemm_time_in_step_order": "<= 1.15",
                    "bf16_data_parallel_speedup_2_ranks": ">= 1.8",
                    "bf16 final loss within 2 % of fp32's after the convergence run": "<= 0.02"},
        "samples": samples,
    }
    if args.baseline:
        baseline = statistics.median(samples["baseline_bf16_1"])
        result.update({"baseline": args.baseline, "baseline_bf16_step_ms_1_rank": baseline,
                       "bf16_step_over_baseline_1_rank": step["bf16_1"] / baseline})
    if have_torch:
        torch_1, torch_2 = statistics.median(samples["torch_bf16_1"]), statistics.median(samples["torch_bf16_2"])
        import torch
        result.update({"torch_version": torch.__version__, "torch_autocast_bf16_step_ms_1_rank": torch_1,
                       "torch_autocast_bf16_step_ms_2_ranks": torch_2,
                       "ours_bf16_over_torch_autocast_1_rank": step["bf16_1"] / torch_1,
                       "ours_bf16_over_torch_autocast_2_ranks": step["bf16_2"] / torch_2})
    if not args.no_convergence:
        print(f"bench: {args.convergence_steps} steps at fp32 and at bf16", flush=True)
        runs = {dtype: convergence(args, dtype) for dtype in ("fp32", "bf16")}
        result["convergence"] = {
            "steps": args.convergence_steps, "runs": runs,
            "bf16_final_eval_loss_relative_difference":
                abs(runs["bf16"]["final_eval_loss"] - runs["fp32"]["final_eval_loss"]) / runs["fp32"]["final_eval_loss"],
            "bf16_mean_loss_last_100_steps_relative_difference":
                abs(runs["bf16"]["mean_loss_last_100_steps"] - runs["fp32"]["mean_loss_last_100_steps"]) /
                runs["fp32"]["mean_loss_last_100_steps"]}
    write_result(args.output, result)
    print(f"cpu: {cpu_model()}\nkernels: {result['kernels']}")
    for key, value in result.items():
        if isinstance(value, float):
            print(f"{key:48s} {value:10.3f}")
    if "convergence" in result:
        for key, value in result["convergence"].items():
            if isinstance(value, float):
                print(f"{key:48s} {value:10.4f}")


if __name__ == "__main__":
    main()
