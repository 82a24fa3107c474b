#!/usr/bin/python3
"""The GPU path's speed figures, each measured side by side in one run (only ratios measured
together mean anything):

  step     one process, 16 layers of 8192, batch 8192, `mixture` data (generated on the GPU), in
           fp32, TF32 (--tf32) and bf16 (--param-dtype bf16): mlptrain's step time against the
           time of the same GEMMs alone (build/layerbench on the same GPU, the same shapes;
           target: the GEMMs at least 0.85 of the step), the share of the step waiting for data
           (target: at most 0.02), the share taken by the other kernels (GELU forward and
           backward with the bias gradient, AdamW), the model FLOP utilization against the GPU's
           dense peak (the trainer's own figure), and PyTorch's step on the same GPU, model and
           precision, eager and torch.compile'd (scripts/bench/torch_peer.py --device cuda [--compile];
           targets: bf16 at most 0.90x eager and 1.0x compiled, fp32 and TF32 at most 1.0x eager)
  fp8      the same step with fp8 products (--fp8 tensorwise, rowwise, and tensorwise with
           --fp8-fast-accumulation) against the bf16 step of the same run (target: tensorwise at
           most 0.65x bf16's), and each run's last loss against bf16's (target: within 2 %)

Every run trains the model as a user would (training_flags: a learning rate for its width,
warm-up, clipping) and its losses are kept beside its times; a run whose loss is not finite,
rises tenfold over its first or ends no lower than it began gives no figure (`refused`).
  kernels  every kernel besides the GEMMs on a layer of 8192 x 8192 (layerbench's kernel table):
           its time, the bytes it moves and their rate against a device copy of as many bytes
           (target: at least 0.7), and the built-in samples generated per second
  staging  the host-staged all-reduce of 256 MiB at 1 to 4 ranks on one GPU (commbench
           mpi-staged), its chunk size chosen from a sweep (256 KiB to 64 MiB), against the
           bound of its slowest stage, each measured alone in the same run: the pinned copy
           down and up streaming the whole message, MPI's host all-reduce in place (as staging
           runs it on its slot) of one chunk-sized message (target >= 0.8); and against
           unchunked staging (target >= 1.5x). On loopback the copies are memcpys through the
           CPU's caches, on the cores MPI uses: the script runs there, the bound holds on a GPU
  commbench every collective from 4 KiB to 256 MiB on mpi-staged (2 ranks sharing the GPU) and
           NCCL (one rank: NCCL refuses two ranks on one GPU), with their bus bandwidths

Writes OUTPUT_DIR/step.json (with the fp8 figures), kernels.json, staging.json and
commbench.json (default results/gpu/). With --device loopback and --tiny it runs the same code without a GPU (the test
suite does): that checks the script, and measures nothing about a GPU."""
import argparse
import math
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
from benchlib import BUILD, ROOT, read_records, run_json, train, write_result  # noqa: E402

PROGRAMS = os.path.dirname(os.environ.get("MLPTRAIN", os.path.join(BUILD, "mlptrain")))


# How each precision is asked of mlptrain, layerbench and the PyTorch peer.
PRECISIONS = {
    "fp32": {"mlptrain": [], "layerbench": ["--dtype", "fp32"], "torch": []},
    "tf32": {"mlptrain": ["--tf32"], "layerbench": ["--dtype", "fp32", "--tf32"], "torch": ["--tf32"]},
    "bf16": {"mlptrain": ["--param-dtype", "bf16"], "layerbench": ["--dtype", "bf16"],
             "torch": ["--autocast", "bf16"]},
}


# fp8 recipes, each on top of bf16.
FP8_RECIPES = {
    "tensorwise": ["--fp8", "tensorwise"],
    "rowwise": ["--fp8", "rowwise"],
    "tensorwise fast accumulation": ["--fp8", "tensorwise", "--fp8-fast-accumulation"],
}


def layer_times(args, width, out, precision):
    return run_json([os.path.join(PROGRAMS, "layerbench"), str(args.batch), str(width), str(out), str(args.repeats),
                     "--device", args.device] + PRECISIONS[precision]["layerbench"])[0]


def torch_step_ms(args, precision, compiled=False):
    """PyTorch's median step on the same GPU, model and precision, eager or torch.compile'd (None
    where it cannot run)."""
    command = [sys.executable, os.path.join(ROOT, "scripts", "bench", "torch_peer.py"), "--device", "cuda",
               "--layers", str(args.layers), "--hidden", str(args.hidden), "--input-dim", str(args.hidden),
               "--batch-per-rank", str(args.batch), "--steps", str(args.steps)] + PRECISIONS[precision]["torch"] + \
        (["--compile", "--warmup", "5"] if compiled else [])
    try:
        return run_json(command)[0]["step_ms"]
    except (subprocess.CalledProcessError, IndexError) as error:
        print(f"bench: the PyTorch peer did not run ({error})", flush=True)
        return None


def training_flags(args):
    """How the benchmark's model is trained. A deep MLP without residuals or norms, in PyTorch's
    initialization, takes AdamW's per-element steps of about lr on weights of about 1 / sqrt(width)
    summed over `width` inputs: lr x width sets how far a step moves a layer's output. At 1e-3 the
    8192-wide model diverges within 6 steps (lr x width = 8); near 1 it leaves its initial loss
    after a few dozen steps (16 layers of 512 and 1024 on the CPU, mixture data) and then falls.
    Warm-up and clipping keep the first steps from overshooting."""
    lr = args.lr if args.lr is not None else 1.0 / args.hidden
    # A diverging run goes on (its steps skipped) so that its losses say why it gives no figure.
    return ["--lr", f"{lr:.4g}", "--warmup-steps", "10", "--grad-clip", "1", "--on-nan", "skip"]


def loss_verdict(losses):
    """Why a run's speed is no figure (None where its model trained): a loss that is not finite,
    one that rises tenfold over the first, or a last loss no lower than the first."""
    if not losses or not all(math.isfinite(loss) for loss in losses):
        return "a loss is not finite"
    if max(losses) > 10 * losses[0]:
        return f"the loss rose tenfold ({losses[0]:.4g} to {max(losses):.4g})"
    if losses[-1] >= losses[0]:
        return f"the loss did not fall ({losses[0]:.4g} to {losses[-1]:.4g})"
    return None


def timed_step(args, name, flags):
    """mlptrain's median step, its median wait for data, its summary and its losses on the
    benchmark's model, trained (training_flags); the times are None where loss_verdict refuses
    them."""
    ms, summary = train(1, ["--dataset", "mixture", "--layers", args.layers, "--hidden", args.hidden,
                            "--input-dim", args.hidden, "--output-dim", 10, "--global-batch", args.batch,
                            "--steps", args.steps, "--device", args.device] + training_flags(args) + flags, name)
    records = [r for r in read_records(name) if not r.get("summary")]
    losses = {"every_step": [r["loss"] for r in records]}
    refused = loss_verdict(losses["every_step"])
    losses.update({"first": losses["every_step"][0], "last": losses["every_step"][-1]} if records else {})
    if refused:
        print(f"bench: {name}: no figure: {refused}", flush=True)
        return None, None, summary, dict(losses, refused=refused)
    return ms, statistics.median(r["data_ms"] for r in records), summary, losses


def step_figures(args, precision):
    """mlptrain's step against its GEMMs and other kernels, timed on the same device, and
    against PyTorch's."""
    width, layers = args.hidden, args.layers
    hidden = layer_times(args, width, width, precision)
    last = layer_times(args, width, 10, precision)
    gemms = ("forward_gemm_ms", "weight_grad_gemm_ms", "input_grad_gemm_ms")
    # Layer 0 needs no input gradient; the last layer maps to the 10 classes (no GELU).
    gemm_ms = (sum(hidden[k] for k in gemms) * (layers - 1) - hidden["input_grad_gemm_ms"] +
               sum(last[k] for k in gemms))
    other_ms = ((hidden["gelu_forward_ms"] + hidden["gelu_backward_ms"] + hidden["adamw_ms"]) * (layers - 1)
                + last["adamw_ms"])
    step_ms, data_ms, summary, losses = timed_step(args, f"gpu-step-{precision}", PRECISIONS[precision]["mlptrain"])
    if step_ms is None:
        return {"losses": losses, "refused": losses["refused"]}
    figures = {"gemm_ms_per_step": gemm_ms, "other_kernels_ms_per_step": other_ms, "step_ms": step_ms, "losses": losses,
               "data_wait_ms": data_ms, "data_wait_share_of_step": data_ms / step_ms,
               "gemm_share_of_step": gemm_ms / step_ms, "other_kernels_share_of_step": other_ms / step_ms,
               "mfu": summary.get("mfu"), "layerbench_hidden_layer": hidden, "layerbench_last_layer": last}
    if args.device == "cuda":
        eager, compiled = torch_step_ms(args, precision), torch_step_ms(args, precision, compiled=True)
        figures.update({"pytorch_step_ms": eager, "step_over_pytorch": step_ms / eager if eager else None,
                        "pytorch_compiled_step_ms": compiled,
                        "step_over_pytorch_compiled": step_ms / compiled if compiled else None})
    return figures


def fp8_figures(args, bf16):
    """Each fp8 recipe's step and last loss against the bf16 step measured in the same run
    (timed_step's four figures; one is timed here where the step part did not run)."""
    bf16_ms, _, _, bf16_losses = bf16 if bf16 else timed_step(args, "gpu-step-fp8-baseline-bf16",
                                                               PRECISIONS["bf16"]["mlptrain"])
    figures = {"bf16_step_ms": bf16_ms, "bf16_losses": bf16_losses}
    for recipe, flags in FP8_RECIPES.items():
        if "--fp8-fast-accumulation" in flags and args.device != "cuda":
            continue  # the tensor cores' accumulator: nothing to ask of the CPU's emulation
        ms, data_ms, _, losses = timed_step(args, "gpu-step-fp8-" + recipe.replace(" ", "-"),
                                            PRECISIONS["bf16"]["mlptrain"] + flags)
        figures[recipe] = {"step_ms": ms, "data_wait_ms": data_ms, "losses": losses,
                           "step_over_bf16": ms / bf16_ms if ms and bf16_ms else None,
                           "last_loss_over_bf16": losses["last"] / bf16_losses["last"]
                           if "last" in losses and "last" in bf16_losses else None}
        if ms and bf16_ms:
            print(f"bench: fp8 {recipe} step {ms:.2f} ms, {ms / bf16_ms:.2f}x bf16's {bf16_ms:.2f} ms; last loss "
                  f"{losses['last']:.4f} against bf16's {bf16_losses['last']:.4f}", flush=True)
    return figures


def kernel_figures(args):
    """layerbench's kernel table at the step's layer shape, for each precision the device runs."""
    tables = {}
    for precision in PRECISIONS if args.device == "cuda" else ("fp32",):
        row = layer_times(args, args.hidden, args.hidden, precision)
        tables[precision] = {"kernels": row["kernel_table"], "device": row["kernels"]}
        for kernel in row["kernel_table"]:
            if "of_copy_rate" in kernel:
                print(f"bench: {precision} {kernel['kernel']:>30}: {kernel['ms']:.3f} ms, "
                      f"{kernel['gbytes_per_s']:.0f} GB/s, {kernel['of_copy_rate']:.2f} of a copy's rate", flush=True)
    return tables


def every_collective(args):
    """commbench's rows for every collective over message sizes, host-staged at 2 ranks and
    through NCCL at one."""
    rows = []
    for path, ranks in (("mpi-staged", 2), ("nccl", 1)):
        if path != "nccl" or args.device == "cuda":
            rows += commbench_rows(args, ranks, path, ["all"], sizes=args.sweep, extra=[])
    return rows


def commbench_rows(args, ranks, path, collectives, sizes, extra):
    """commbench's JSON rows (the script ends if any result is wrong)."""
    command = ["mpiexec.mpich", "-n", str(ranks), os.path.join(PROGRAMS, "commbench"), "--path", path,
               "--collectives", ",".join(collectives), "--min-bytes", sizes[0], "--max-bytes", sizes[1],
               "--json"] + extra
    if path != "mpi-host":
        command += ["--device", args.device]
    rows = run_json(command)
    wrong = [row for row in rows if not row.get("correct", True)]  # the identity lines carry no verdict
    if wrong:
        sys.exit(f"bench: commbench gave wrong results: {wrong}")
    return rows


def commbench(args, ranks, path, collectives, chunk_bytes=None):
    """Each collective's algorithm bandwidth at the staging benchmark's message size."""
    extra = ["--iterations", str(args.repeats), "--warmup", "2"]
    if chunk_bytes is not None:
        extra += ["--chunk-bytes", chunk_bytes]
    rows = commbench_rows(args, ranks, path, collectives, sizes=(args.message, args.message), extra=extra)
    return {row["collective"]: row["algbw_gbps"] for row in rows if "algbw_gbps" in row}


def staging_round(args, ranks):
    """One round: the pinned copies each way streaming the whole message, the staged all-reduce
    unchunked and at each chunk size of the sweep, and MPI's host all-reduce in place (as
    staging runs it on its slot) of one chunk-sized message."""
    copies = commbench(args, ranks, "mpi-staged", ["copy_to_host", "copy_to_device"])
    sweep = {}
    for chunk in args.chunks:
        host = commbench_rows(args, ranks, "mpi-host", ["all_reduce"], sizes=(chunk, chunk),
                              extra=["--iterations", str(args.repeats), "--warmup", "2"])
        sweep[chunk] = {"staged_gbps": commbench(args, ranks, "mpi-staged", ["all_reduce"], chunk)["all_reduce"],
                        "mpi_host_all_reduce_gbps": next(row["in_place_algbw_gbps"] for row in host
                                                         if "in_place_algbw_gbps" in row)}
    return {"copy_to_host_gbps": copies["copy_to_host"], "copy_to_device_gbps": copies["copy_to_device"],
            "staged_unchunked_gbps": commbench(args, ranks, "mpi-staged", ["all_reduce"], "0")["all_reduce"],
            "sweep": sweep}


def staging_figures(args, ranks):
    """The rounds' medians, the chunk size whose median staged rate is best, and the bound at it:
    a pipeline of the three stages runs no faster than its slowest, min(copy down, copy up, MPI's
    host all-reduce at the chunk size)."""
    rounds = [staging_round(args, ranks) for _ in range(args.rounds)]
    median = lambda values: statistics.median(list(values))  # noqa: E731
    copy_down = median(r["copy_to_host_gbps"] for r in rounds)
    copy_up = median(r["copy_to_device_gbps"] for r in rounds)
    sweep = {chunk: {key: median(r["sweep"][chunk][key] for r in rounds) for key in rounds[0]["sweep"][chunk]}
             for chunk in args.chunks}
    for row in sweep.values():
        row["bound_gbps"] = min(copy_down, copy_up, row["mpi_host_all_reduce_gbps"])
        row["of_bound"] = row["staged_gbps"] / row["bound_gbps"]
    best = max(args.chunks, key=lambda chunk: sweep[chunk]["staged_gbps"])
    whole = median(r["staged_unchunked_gbps"] for r in rounds)
    return {"ranks": ranks, "copy_to_host_gbps": copy_down, "copy_to_device_gbps": copy_up,
            "staged_unchunked_gbps": whole, "best_chunk_bytes": best,
            "staged_chunked_gbps": sweep[best]["staged_gbps"], "bound_gbps": sweep[best]["bound_gbps"],
            "chunked_over_bound": sweep[best]["of_bound"],
            "chunked_over_unchunked": sweep[best]["staged_gbps"] / whole, "sweep": sweep, "rounds": rounds}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cuda", "loopback"), default="cuda")
    parser.add_argument("--tiny", action="store_true", help="small sizes: a smoke run of the script")
    parser.add_argument("--rounds", type=int, default=3, help="staging measurements per world size (median)")
    parser.add_argument("--steps", type=int, default=60,
                        help="steps of each run (the model leaves its initial loss after a few dozen)")
    parser.add_argument("--lr", type=float, default=None, help="learning rate (default: 1 / width, training_flags)")
    parser.add_argument("--output-dir", default=os.path.join(ROOT, "results", "gpu"))
    parser.add_argument("--parts", default="step,fp8,kernels,staging,commbench",
                        help="which measurements, comma-separated (a GPU lent for minutes may not hold them all: "
                             "on an H200 the step took about 4 minutes, staging over 5)")
    parser.add_argument("--world-sizes", default=None, help="staging's world sizes (default 1,2,3,4; --tiny 1,2)")
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    unknown = parts - {"step", "fp8", "kernels", "staging", "commbench"}
    if unknown:
        parser.error(f"--parts: unknown {', '.join(sorted(unknown))} (choose step, fp8, kernels, staging, commbench)")
    args.hidden, args.batch, args.layers = (64, 64, 3) if args.tiny else (8192, 8192, 16)
    args.message = "1M" if args.tiny else "256M"
    args.chunks = ["64K", "256K"] if args.tiny else ["256K", "1M", "4M", "16M", "64M"]
    args.sweep = ("4K", "64K") if args.tiny else ("4K", "256M")
    args.repeats = 3 if args.tiny else 10
    world_sizes = [int(n) for n in args.world_sizes.split(",")] if args.world_sizes else [1, 2] if args.tiny else [1, 2, 3, 4]

    step = {"model": {"layers": args.layers, "hidden": args.hidden, "input": args.hidden, "classes": 10,
                      "batch": args.batch, "device": args.device},
            "targets": {"gemm_share_of_step": ">= 0.85", "data_wait_share_of_step": "<= 0.02",
                        "step_over_pytorch": "bf16 <= 0.90, fp32 and tf32 <= 1.0",
                        "step_over_pytorch_compiled": "bf16 <= 1.0", "fp8_tensorwise_over_bf16": "<= 0.65"}}
    if "step" in parts:
        for precision in PRECISIONS if args.device == "cuda" else ("fp32",):
            step[precision] = step_figures(args, precision)
    if "fp8" in parts:
        bf16 = step.get("bf16", {})
        step["fp8"] = fp8_figures(args, (bf16["step_ms"], None, None, bf16["losses"]) if bf16.get("step_ms") else None)
    if "step" in parts or "fp8" in parts:
        write_result(os.path.join(args.output_dir, "step.json"), step)
    if "kernels" in parts:
        write_result(os.path.join(args.output_dir, "kernels.json"),
                     {"layer": {"rows": args.batch, "in": args.hidden, "out": args.hidden, "device": args.device},
                      "targets": {"of_copy_rate": ">= 0.7"}, "precisions": kernel_figures(args)})

    rows = []
    for ranks in world_sizes if "staging" in parts else []:
        rows.append(staging_figures(args, ranks))
        print(f"bench: staging at {ranks} rank(s): best chunk {rows[-1]['best_chunk_bytes']}, "
              f"{rows[-1]['chunked_over_bound']:.2f} of the bound, "
              f"{rows[-1]['chunked_over_unchunked']:.2f}x unchunked", flush=True)
    if "staging" in parts:
        write_result(os.path.join(args.output_dir, "staging.json"),
                     {"message_bytes": args.message, "chunk_sweep": args.chunks, "device": args.device,
                      "world_sizes": rows,
                      "targets": {"chunked_over_bound": ">= 0.8", "chunked_over_unchunked": ">= 1.5"}})
    if "commbench" in parts:
        write_result(os.path.join(args.output_dir, "commbench.json"),
                     {"device": args.device, "rows": every_collective(args)})
    for precision in PRECISIONS:
        if precision in step and step[precision].get("step_ms"):
            figures = step[precision]
            versus = (f", PyTorch {figures['pytorch_step_ms']:.2f} ms ({figures['step_over_pytorch']:.2f}x)"
                      if figures.get("step_over_pytorch") else "")
            versus += (f", compiled {figures['pytorch_compiled_step_ms']:.2f} ms "
                       f"({figures['step_over_pytorch_compiled']:.2f}x)" if figures.get("step_over_pytorch_compiled") else "")
            mfu = f", MFU {100 * figures['mfu']:.1f} %" if figures.get("mfu") else ""
            print(f"bench: {precision} step {figures['step_ms']:.2f} ms, GEMMs {figures['gemm_ms_per_step']:.2f} ms "
                  f"({100 * figures['gemm_share_of_step']:.0f} % of the step), data wait "
                  f"{100 * figures['data_wait_share_of_step']:.1f} %, other kernels "
                  f"{100 * figures['other_kernels_share_of_step']:.1f} %{mfu}{versus}")


if __name__ == "__main__":
    main()
