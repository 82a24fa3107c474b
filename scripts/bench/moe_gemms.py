#!/usr/bin/python3
"""An MoE step against the same GEMMs at balanced row counts, at 1 rank and one GEMM thread:
E = 8 experts, top-2, hidden 1024, input 256, 10 classes, two MoE layers of four, global batch
512 (128 rows an expert when balanced; --batch sets it: an expert's update costs the same at any
batch, its GEMMs grow with the rows). For fp32 and bf16: mlptrain's median step, its router
giving each expert the rows it gives (each step's `expert_load`), against the time of the step's
GEMMs with those rows spread evenly, at oneDNN's own rate (layerbench: the dense layers and the
routers at their shapes, each expert's forward, input-gradient and weight-gradient GEMMs at 128
rows, each shape repeated, and in a step's order: the 16 experts' GEMMs each over operands of
their own). With --baseline PROGRAM, another build's step in the same rounds (an earlier
commit's, say). Writes results/moe_gemms.json.

The step is the median after --warm-up steps (20 of 40 by default): an expert's GEMMs get a
primitive for each row count the router gives it, made the first time that count occurs (about
400 on this model, 0.14 ms each), most of them in the first 20 steps. The median of steps 3-12,
which pays for them, is reported beside it (early_step_ms)."""
import os
import statistics

from cpu import GEMMS
from benchlib import BUILD, arguments, cpu_model, read_records, run_json, train, write_result

EXPERTS, TOP_K, HIDDEN, INPUT, CLASSES = 8, 2, 1024, 256, 10
MOE_LAYERS = 2


def model(batch):
    """The model's flags at a global batch."""
    return ["--dataset", "mixture", "--layers", 4, "--hidden", HIDDEN, "--input-dim", INPUT, "--output-dim", CLASSES,
            "--moe-every", 1, "--experts", EXPERTS, "--top-k", TOP_K, "--global-batch", batch]


def balanced_rows(batch):
    return batch * TOP_K // EXPERTS


def library_ms(rows, width, out, dtype, sequence=0):
    """oneDNN's own time of a Linear layer's three GEMMs (each shape repeated), by GEMM, and with
    `sequence` the mean time of one in a step's order over that many layers."""
    command = [os.path.join(BUILD, "layerbench"), str(rows), str(width), str(out), "20", "--dtype", dtype,
               "--sequence", str(sequence)]
    result = run_json(command)[0]
    return {gemm: result[f"library_{gemm}_gemm_ms"] for gemm in GEMMS} | (
        {"sequence": result["library_sequence_gemm_ms"]} if sequence else {})


def balanced_gemm_ms(dtype, batch):
    """The step's GEMMs with every expert given its balanced rows (layer 0 needs no input
    gradient): each shape repeated, and the experts' in a step's order."""
    first = library_ms(batch, INPUT, HIDDEN, dtype)
    last = library_ms(batch, HIDDEN, CLASSES, dtype)
    router = library_ms(batch, HIDDEN, EXPERTS, dtype)
    expert = library_ms(balanced_rows(batch), HIDDEN, HIDDEN, dtype, sequence=MOE_LAYERS * EXPERTS)
    dense = first["forward"] + first["weight_grad"] + sum(last.values()) + MOE_LAYERS * sum(router.values())
    experts = MOE_LAYERS * EXPERTS
    return {"repeated": dense + experts * sum(expert[gemm] for gemm in GEMMS),
            "in_step_order": dense + experts * len(GEMMS) * expert["sequence"]}


def main():
    parser = arguments(__doc__, rounds=3, steps=40, result_file="moe_gemms.json")
    parser.add_argument("--warm-up", type=int, default=20, help="steps before the median (default 20)")
    parser.add_argument("--baseline", help="another mlptrain build to time beside this one")
    parser.add_argument("--batch", type=int, default=512, help="global batch (default 512)")
    args = parser.parse_args()
    one_thread = {"OMP_NUM_THREADS": "1"}
    programs = {"this_build": None} | ({"baseline": args.baseline} if args.baseline else {})
    steps = {(dtype, name): [] for dtype in ("fp32", "bf16") for name in programs}
    early_steps = {dtype: [] for dtype in ("fp32", "bf16")}
    gemms = {"fp32": [], "bf16": []}
    loads = []
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        for dtype in gemms:
            gemms[dtype].append(balanced_gemm_ms(dtype, args.batch))
            for name, program in programs.items():
                flags = model(args.batch) + ["--param-dtype", dtype, "--steps", args.steps]
                run_name = f"moe-gemms-{dtype}-{name}"
                kwargs = {"program": program} if program else {}
                steps[(dtype, name)].append(train(1, flags, run_name, warm_up_steps=args.warm_up,
                                                  environment=one_thread, **kwargs)[0])
                if name == "this_build":
                    records = [record for record in read_records(run_name) if not record.get("summary")]
                    early_steps[dtype].append(statistics.median(record["step_ms"] for record in records[2:12]))
                    loads += [layer for record in records[2:] if "expert_load" in record
                              for layer in record["expert_load"]]
    step_ms = {f"{dtype}_{name}": statistics.median(values) for (dtype, name), values in steps.items()}
    gemm_ms = {dtype: {order: statistics.median(sample[order] for sample in values) for order in values[0]}
               for dtype, values in gemms.items()}
    result = {
        "model": {"experts": EXPERTS, "top_k": TOP_K, "hidden": HIDDEN, "input": INPUT, "classes": CLASSES,
                  "global_batch": args.batch, "moe_layers": MOE_LAYERS,
                  "balanced_rows_per_expert": balanced_rows(args.batch)},
        "step_ms": step_ms,
        "warm_up_steps": args.warm_up,
        "early_step_ms": {dtype: statistics.median(values) for dtype, values in early_steps.items()},
        "balanced_gemm_ms": gemm_ms,
        "step_over_balanced_gemms": {dtype: {order: step_ms[f"{dtype}_this_build"] / ms for order, ms in orders.items()}
                                     for dtype, orders in gemm_ms.items()},
        "early_step_over_balanced_gemms_in_step_order": {
            dtype: statistics.median(values) / gemm_ms[dtype]["in_step_order"] for dtype, values in early_steps.items()},
        "expert_rows": {"largest_over_mean": statistics.mean(max(layer) / statistics.mean(layer) for layer in loads),
                        "smallest_over_mean": statistics.mean(min(layer) / statistics.mean(layer) for layer in loads)},
        "targets": {"step_over_balanced_gemms": "<= 1.15"},
        "samples": {"steps": {f"{dtype}_{name}": values for (dtype, name), values in steps.items()}, "gemms": gemms},
    }
    if args.baseline:
        result["baseline"] = args.baseline
        result["step_over_baseline"] = {dtype: step_ms[f"{dtype}_this_build"] / step_ms[f"{dtype}_baseline"]
                                        for dtype in gemm_ms}
    write_result(args.output, result)
    print(f"cpu: {cpu_model()}")
    for dtype, orders in gemm_ms.items():
        ratios = result["step_over_balanced_gemms"][dtype]
        print(f"{dtype}: step {step_ms[f'{dtype}_this_build']:.1f} ms; its GEMMs at balanced rows "
              f"{orders['repeated']:.1f} ms each shape repeated ({ratios['repeated']:.3f}), "
              f"{orders['in_step_order']:.1f} ms in a step's order ({ratios['in_step_order']:.3f})"
              + f"; steps 3-12 {result['early_step_over_balanced_gemms_in_step_order'][dtype]:.3f}"
              + (f"; {result['step_over_baseline'][dtype]:.3f} of the baseline's step" if args.baseline else ""))


if __name__ == "__main__":
    main()
