#!/usr/bin/python3
"""The pipeline schedules' speed benchmark at P stages (2 by default) and M = 8 micro-batches on P
ranks, everything measured side by side in one run (these machines are shared and noisy, so only
ratios measured together mean anything):

  * one process with the same global batch and micro-batches: the step time an ideal pipeline
    divides by P and stretches by its schedule's bubble b, (T1 / P) / (1 - b);
  * every schedule mlptrain has (`mlpplan --list schedules`; a chunked one with V = 2) at --pp P
    with --trace: step time, the measured bubble against the schedule's theory (its table entry,
    src/schedule/schedule_table.cpp, which also gives its source; scripts/tools/trace_timeline.py
    measures it and also gives the bubble the stages' measured compute times alone explain),
    stage 0's peak activation memory against its prediction.

Model: 10 layers, width 1024, input 64, 10 classes (the cheap first and last layers balance the
two stages at 5 layers each, and four chunks of 2-3 layers), global batch 512, fp32, one BLAS
thread per rank, each rank pinned to a core. The runs are interleaved over --rounds rounds and
medians reported. Writes results/pipeline.json (--stages 4 on a smaller model: pass --output) and
the timelines of the last round on one page, results/pipeline_schedules.png (P = 2)."""
import json
import os
import statistics
import subprocess
import sys

from benchlib import BUILD, ROOT, arguments, program_list, train, write_result

MICRO_BATCHES = 8
# Every schedule the programs know, with the options it runs on: two chunks a stage where chunked.
SCHEDULES = {schedule["name"]: ["--virtual-stages", 2] if schedule["chunked"] else []
             for schedule in program_list("schedules")}


def model(args):
    return ["--dataset", "mixture", "--layers", args.layers, "--hidden", args.width, "--input-dim", 64,
            "--output-dim", 10, "--global-batch", args.batch, "--micro-batches", MICRO_BATCHES,
            "--steps", args.steps]


def timeline(trace, picture):
    output = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "tools", "trace_timeline.py"), trace,
                             "--output", picture, "--json"], capture_output=True, text=True, check=True)
    return json.loads(output.stdout)


def main():
    parser = arguments(__doc__, rounds=5, steps=12, result_file="pipeline.json")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--picture", default=os.path.join(ROOT, "results", "pipeline_schedules.png"))
    args = parser.parse_args()
    stages = args.stages
    pinned = stages <= (os.cpu_count() or 1)  # one core per rank, where there are enough

    samples = {"one": [], "one_m1": []}
    for schedule in SCHEDULES:
        for key in ("", "bubble_", "ideal_bubble_", "stage_times_", "activations_", "predicted_activations_"):
            samples[key + schedule] = []
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        samples["one"].append(train(1, model(args), "pipeline-one", bind_to_cores=pinned)[0])
        one_m1 = model(args)
        one_m1[one_m1.index("--micro-batches") + 1] = 1
        samples["one_m1"].append(train(1, one_m1, "pipeline-one-m1", bind_to_cores=pinned)[0])
        for schedule, flags in SCHEDULES.items():
            trace = os.path.join(BUILD, f"bench-pipeline-{schedule}.trace.json")
            step_ms, summary = train(stages, model(args) + ["--pp", stages, "--schedule", schedule, "--trace", trace]
                                     + flags, f"pipeline-{schedule}", bind_to_cores=pinned)
            samples[schedule].append(step_ms)
            report = timeline(trace, os.path.join(BUILD, f"bench-pipeline-{schedule}.png"))
            samples["bubble_" + schedule].append(report["bubble"])
            samples["ideal_bubble_" + schedule].append(report["ideal_bubble"])  # the schedule table's theory
            samples["stage_times_" + schedule].append(report["bubble_from_stage_times"])
            samples["activations_" + schedule].append(summary["peak_mem_bytes_by_rank"][0]["activations"])
            samples["predicted_activations_" + schedule].append(summary["placement"]["activations"]["predicted_bytes"])
    one_page(args.picture, [os.path.join(BUILD, f"bench-pipeline-{schedule}.png") for schedule in SCHEDULES])

    median = {key: statistics.median(values) for key, values in samples.items()}
    result = {
        "model": {"layers": args.layers, "width": args.width, "input": 64, "classes": 10,
                  "global_batch": args.batch, "micro_batches": MICRO_BATCHES, "stages": stages},
        "rounds": args.rounds,
        "steps_per_run": args.steps,
        "samples": samples,
        "one_process_step_ms": median["one"],
        "one_process_one_micro_batch_step_ms": median["one_m1"],
        "target": {"bubble_within": 0.05},
    }
    for schedule in SCHEDULES:
        bubble = median["ideal_bubble_" + schedule]
        ideal_step_ms = median["one"] / stages / (1 - bubble)
        result[schedule] = {
            "step_ms": median[schedule],
            "ideal_step_ms": ideal_step_ms,
            "step_over_ideal": median[schedule] / ideal_step_ms,
            "speedup_over_one_process": median["one"] / median[schedule],
            "ideal_bubble": bubble,
            "bubble": median["bubble_" + schedule],
            "bubble_minus_ideal": median["bubble_" + schedule] - bubble,
            "bubble_from_stage_compute_times": median["stage_times_" + schedule],
            "stage0_peak_activation_bytes": median["activations_" + schedule],
            "stage0_predicted_activation_bytes": median["predicted_activations_" + schedule],
        }
    write_result(args.output, result)
    for schedule in SCHEDULES:
        entry = result[schedule]
        print(f"{schedule}: step {entry['step_ms']:.1f} ms = {entry['step_over_ideal']:.3f} x ideal "
              f"{entry['ideal_step_ms']:.1f} ms (one process {median['one']:.1f} ms); bubble {entry['bubble']:.3f} "
              f"vs theory {entry['ideal_bubble']:.3f} ({entry['bubble_from_stage_compute_times']:.3f} from the "
              f"stages' compute times); stage 0 activations {entry['stage0_peak_activation_bytes'] / 2**20:.2f} MiB, "
              f"predicted {entry['stage0_predicted_activation_bytes'] / 2**20:.2f} MiB")


def one_page(picture, timelines):
    """The schedules' timelines stacked on one page."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.image as image
    import matplotlib.pyplot as plt
    figure, axes = plt.subplots(len(timelines), 1, figsize=(12, 2.2 * len(timelines)))
    for axis, path in zip(axes, timelines):
        axis.imshow(image.imread(path))
        axis.axis("off")
    figure.tight_layout()
    figure.savefig(picture, dpi=110)
    plt.close(figure)


if __name__ == "__main__":
    main()
