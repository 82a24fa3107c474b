#!/usr/bin/python3
"""The CPU path's speed, everything measured side by side in one run (these machines are shared
and noisy, and the CPU behind them changes: only ratios measured together mean anything):

  * build/layerbench on the three GEMM shapes of each layer (forward, weight gradient, input
    gradient), fp32 and bf16: mlptrain's kernels beside oneDNN's own matmul primitive on the same
    shapes, and from the library's timings the GEMM time of a whole training step, twice: with
    each shape repeated on the same buffers (the library's best case), and with the hidden layers'
    GEMMs run in a step's order over buffers of their own (layerbench --sequence), where the
    library is slower because its operands stream from memory;
  * mlptrain at 1 and 2 ranks (batch 256 per rank, one GEMM thread per rank): step time against
    that GEMM time, the share of the step outside the GEMMs, the data-parallel speed-up;
  * the PyTorch peer (scripts/bench/torch_peer.py; DDP over gloo at 2 ranks) on the same model;
  * one traced run at 1 rank: where the step's time goes (forward, backward, optimizer spans
    beside their GEMMs' share at the library's rate).

Model: 10 layers, width 1024, input 1024, 10 classes, fp32, AdamW. Runs are interleaved over
--rounds rounds and medians reported. Writes results/cpu_speed.json with the CPU model and the
kernels oneDNN chose."""
import collections
import json
import os
import statistics
import sys

from benchlib import BUILD, PROGRAM, ROOT, arguments, cpu_model, run_json, train, write_result

GEMMS = ("forward", "weight_grad", "input_grad")


def layer_gemms(rows, width, out, dtypes, sequence=0):
    """layerbench's objects for the dtypes, keyed by dtype."""
    command = [os.path.join(BUILD, "layerbench"), str(rows), str(width), str(out), "20", "--dtype", ",".join(dtypes),
               "--sequence", str(sequence)]
    return {result["dtype"]: result for result in run_json(command)}


def model_arguments(args, ranks):
    """The benchmark's model and data at `ranks` ranks, batch 256 per rank."""
    return ["--dataset", "mixture", "--layers", args.layers, "--hidden", args.width, "--input-dim", args.width,
            "--output-dim", 10, "--global-batch", 256 * ranks, "--steps", args.steps]


def mlptrain_step_ms(ranks, args, extra=(), name="cpu", program=PROGRAM):
    return train(ranks, model_arguments(args, ranks) + list(extra), f"{name}-{ranks}", program=program)[0]


def torch_step_ms(ranks, args, extra=()):
    command = [sys.executable, os.path.join(ROOT, "scripts", "bench", "torch_peer.py"), "--layers", str(args.layers),
               "--hidden", str(args.width), "--input-dim", str(args.width), "--steps", str(args.steps)] + list(extra)
    if ranks > 1:
        command = ["mpiexec.mpich", "-n", str(ranks)] + command
    return run_json(command)[0]["step_ms"]


def traced_phases(args, extra=(), name="cpu-trace"):
    """Median milliseconds per step of each computation span of one traced 1-rank run."""
    trace = os.path.join(BUILD, f"bench-{name}.json")
    train(1, model_arguments(args, 1) + list(extra) + ["--trace", trace], name)
    with open(trace) as handle:
        events = json.load(handle)["traceEvents"]
    per_step = collections.defaultdict(lambda: collections.defaultdict(float))
    for event in events:
        step = event.get("args", {}).get("step")
        if event.get("ph") == "X" and step is not None and step >= 2:  # after the warm-up steps
            per_step[event["name"]][step] += event["dur"] / 1000
    return {name: statistics.median(steps.values()) for name, steps in per_step.items()}


def step_gemm_ms(hidden, last, layers, prefix):
    """The GEMM time of one step: layer 0 needs no input gradient; the last maps to the classes."""
    hidden_ms = sum(hidden[f"{prefix}{gemm}_gemm_ms"] for gemm in GEMMS)
    last_ms = sum(last[f"{prefix}{gemm}_gemm_ms"] for gemm in GEMMS)
    return hidden_ms * (layers - 1) - hidden[f"{prefix}input_grad_gemm_ms"] + last_ms


def model_parser(doc, result_file):
    """The options of the benchmarks on this model: rounds, steps, the model's size, the peer."""
    parser = arguments(doc, rounds=3, steps=12, result_file=result_file)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--no-torch", action="store_true", help="skip the PyTorch peer")
    return parser


def torch_peer_available(args):
    """Whether the PyTorch peer runs: installed, and not turned off."""
    try:
        import torch  # noqa: F401
    except ImportError:
        print("bench: PyTorch not installed (apt-get install python3-torch): peer skipped")
        return False
    return not args.no_torch


def main():
    args = model_parser(__doc__, "cpu_speed.json").parse_args()
    have_torch = torch_peer_available(args)

    rows, width = 256, args.width
    samples = {key: [] for key in ("hidden", "last", "ours_1", "ours_2", "torch_1", "torch_2")}
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        samples["hidden"].append(layer_gemms(rows, width, width, ["fp32", "bf16"], sequence=args.layers - 1))
        samples["last"].append(layer_gemms(rows, width, 10, ["fp32"])["fp32"])
        samples["ours_1"].append(mlptrain_step_ms(1, args))
        samples["ours_2"].append(mlptrain_step_ms(2, args))
        if have_torch:
            samples["torch_1"].append(torch_step_ms(1, args))
            samples["torch_2"].append(torch_step_ms(2, args))

    def median_layer(key, dtype=None):
        """The round-by-round median of every timing of one layerbench object."""
        objects = [sample[dtype] if dtype else sample for sample in samples[key]]
        return {field: statistics.median(o[field] for o in objects)
                for field, value in objects[0].items() if isinstance(value, float)}

    hidden_fp32, hidden_bf16, last = median_layer("hidden", "fp32"), median_layer("hidden", "bf16"), median_layer("last")
    gemm_ms = step_gemm_ms(hidden_fp32, last, args.layers, "library_")
    # In a step's order the hidden layers' GEMMs take the sequence rate (the last layer's are tiny).
    hidden_gemms = 3 * (args.layers - 1) - 1
    sequence_gemm_ms = hidden_fp32["library_sequence_gemm_ms"] * hidden_gemms + sum(
        last[f"library_{gemm}_gemm_ms"] for gemm in GEMMS)
    phases = traced_phases(args)
    # The GEMMs of each pass at the library's rate: forward (layer 0 and the last included),
    # backward (no input gradient for layer 0).
    forward_gemm_ms = hidden_fp32["library_forward_gemm_ms"] * (args.layers - 1) + last["library_forward_gemm_ms"]
    ours_1, ours_2 = statistics.median(samples["ours_1"]), statistics.median(samples["ours_2"])
    result = {
        "kernels": samples["hidden"][0]["fp32"]["kernels"],
        "model": {"layers": args.layers, "width": width, "input": width, "classes": 10, "batch_per_rank": rows},
        "onednn_fp32_gflops_layer_shapes": hidden_fp32["library_gemm_gflops"],
        "onednn_bf16_gflops_layer_shapes": hidden_bf16["library_gemm_gflops"],
        "ours_fp32_gemm_over_onednn": hidden_fp32["gemm_over_library"],
        "ours_bf16_gemm_rate_over_onednn": 1 / hidden_bf16["gemm_over_library"],
        "gemm_ms_per_step_at_onednn_fp32_rate": gemm_ms,
        "gemm_ms_per_step_at_onednn_fp32_rate_in_step_order": sequence_gemm_ms,
        "ours_step_ms_1_rank": ours_1,
        "ours_step_ms_2_ranks": ours_2,
        "step_over_gemm_time_1_rank": ours_1 / gemm_ms,
        "non_gemm_share_of_step": (ours_1 - gemm_ms) / ours_1,
        "step_over_gemm_time_in_step_order_1_rank": ours_1 / sequence_gemm_ms,
        "non_gemm_share_of_step_in_step_order": (ours_1 - sequence_gemm_ms) / ours_1,
        "step_over_gemm_time_in_step_order_2_ranks": ours_2 / sequence_gemm_ms,
        "data_parallel_speedup_2_ranks": 2 * ours_1 / ours_2,
        "phases_ms_1_rank": {"traced": phases, "forward_gemms_at_onednn_rate": forward_gemm_ms,
                             "backward_gemms_at_onednn_rate": gemm_ms - forward_gemm_ms,
                             "gelu_forward_per_layer": hidden_fp32["gelu_forward_ms"],
                             "gelu_backward_per_layer": hidden_fp32["gelu_backward_ms"]},
        "targets": {"step_over_gemm_time_1_rank": "<= 1.12", "non_gemm_share_of_step": "<= 0.10",
                    "step_over_gemm_time_in_step_order_1_rank": "<= 1.08",
                    "step_over_gemm_time_in_step_order_2_ranks": "<= 1.08",
                    "non_gemm_share_of_step_in_step_order": "<= 0.10",
                    "ours_bf16_gemm_rate_over_onednn": ">= 0.9", "data_parallel_speedup_2_ranks": ">= 1.8"},
        "samples": samples,
    }
    if have_torch:
        torch_1, torch_2 = statistics.median(samples["torch_1"]), statistics.median(samples["torch_2"])
        import torch
        result.update({"torch_version": torch.__version__, "torch_step_ms_1_rank": torch_1,
                       "torch_step_ms_2_ranks": torch_2, "ours_over_torch_1_rank": ours_1 / torch_1,
                       "ours_over_torch_2_ranks": ours_2 / torch_2})
    write_result(args.output, result)
    print(f"cpu: {cpu_model()}\nkernels: {result['kernels']}")
    for key, value in result.items():
        if isinstance(value, float):
            print(f"{key:40s} {value:10.3f}")


if __name__ == "__main__":
    main()
