#!/usr/bin/python3
"""The PyTorch peer of mlptrain's speed benchmark: the same MLP (Linear layers with exact GELU
between them), softmax cross-entropy, torch.optim.AdamW, one BLAS thread per process, and
DistributedDataParallel over gloo when started under `mpiexec.mpich -n N` (rank from PMI_RANK),
and with --autocast bf16 the forward and the loss under torch.autocast(device, torch.bfloat16)
(PyTorch's mixed precision: bf16 GEMMs, fp32 parameters and optimizer). With --device cuda the
model and data live on the GPU (one process; --tf32 lets fp32 GEMMs run in TF32, as mlptrain's
--tf32 does) and each step ends waiting for the GPU; --compile runs the model through
torch.compile (its default mode: Inductor's fused kernels), a second anchor beside eager PyTorch.
Prints one JSON object with the median step time. Inputs are generated once, outside the timing."""
import argparse
import json
import os
import statistics
import time

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--input-dim", type=int, default=1024)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-per-rank", type=int, default=256)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--port", type=int, default=29511)
    parser.add_argument("--autocast", choices=["off", "bf16"], default="off")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--tf32", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile(model) (default mode)")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.backends.cudnn.allow_tf32 = args.tf32

    torch.set_num_threads(1)
    rank = int(os.environ.get("PMI_RANK", "0"))
    world = int(os.environ.get("PMI_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                rank=rank, world_size=world)
    torch.manual_seed(1234)
    widths = [args.input_dim] + [args.hidden] * (args.layers - 1) + [args.classes]
    modules = []
    for index in range(args.layers):
        modules.append(torch.nn.Linear(widths[index], widths[index + 1]))
        if index < args.layers - 1:
            modules.append(torch.nn.GELU())
    model = torch.nn.Sequential(*modules).to(device)
    if world > 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
    parameters = sum(p.numel() for p in model.parameters())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
    loss_function = torch.nn.CrossEntropyLoss()
    if args.compile:  # compiled on the first steps, which the warm-up leaves out
        model = torch.compile(model)
    inputs = torch.randn(args.batch_per_rank, args.input_dim, device=device)
    labels = torch.randint(0, args.classes, (args.batch_per_rank,), device=device)
    # A step is over when the device is: GPU kernels run after their launch returns.
    synchronize = torch.cuda.synchronize if args.device == "cuda" else (lambda: None)

    times_ms = []
    for step in range(args.warmup + args.steps):
        if world > 1:
            dist.barrier()
        synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.autocast == "bf16"):
            loss = loss_function(model(inputs), labels)
        loss.backward()
        optimizer.step()
        synchronize()
        elapsed_ms = (time.perf_counter() - start) * 1000.0
        if step >= args.warmup:
            times_ms.append(elapsed_ms)
    if world > 1:
        # The slowest rank sets the pace of a synchronous step.
        slowest = torch.tensor(times_ms)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        times_ms = slowest.tolist()
    if rank == 0:
        print(json.dumps({"framework": "pytorch", "version": torch.__version__, "ranks": world,
                          "autocast": args.autocast, "device": args.device, "tf32": args.tf32,
                          "compiled": args.compile,
                          "device_name": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                          "parameters": parameters, "batch_per_rank": args.batch_per_rank,
                          "step_ms": statistics.median(times_ms),
                          "samples_per_s": args.batch_per_rank * world /
                          (statistics.median(times_ms) / 1000.0)}))
    if world > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
