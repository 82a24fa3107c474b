#!/usr/bin/env python3
"""The pipeline's speed benchmark at P = 2 stages and M = 8 micro-batches on 2 ranks, everything
measured side by side in one run (these machines are shared and noisy, so only ratios measured
together mean anything):

  * one process with the same global batch and micro-batches: the step time an ideal pipeline
    divides by P and stretches by its bubble, (T1 / P) x (M + P - 1) / M;
  * 1F1B and GPipe at --pp 2 with --trace: step time, the measured bubble against the ideal
    (P-1)/(M+P-1) (scripts/trace_timeline.py, which also gives the bubble the stages' measured
    compute times alone explain), stage 0's peak activation memory.

Model: 10 layers, width 1024, input 64, 10 classes (the cheap first and last layers balance the
two stages at 5 layers each), global batch 512, fp32, one BLAS thread per rank, each rank pinned
to a core. The runs are interleaved over --rounds rounds and medians reported. Writes
results/pipeline.json and the timelines results/pipeline_1f1b.png and results/pipeline_gpipe.png."""
import json
import os
import shutil
import statistics
import subprocess
import sys

from benchlib import BUILD, ROOT, arguments, train, write_result

STAGES, MICRO_BATCHES = 2, 8


def model(args):
    return ["--dataset", "mixture", "--layers", args.layers, "--hidden", args.width, "--input-dim", 64,
            "--output-dim", 10, "--global-batch", args.batch, "--micro-batches", MICRO_BATCHES,
            "--steps", args.steps]


def timeline(trace, picture):
    output = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "trace_timeline.py"), trace,
                             "--output", picture, "--json"], capture_output=True, text=True, check=True)
    return json.loads(output.stdout)


def main():
    parser = arguments(__doc__, rounds=5, steps=12, result_file="pipeline.json")
    parser.add_argument("--layers", type=int, default=10)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=512)
    args = parser.parse_args()

    samples = {key: [] for key in ("one", "one_m1", "1f1b", "gpipe", "bubble_1f1b", "bubble_gpipe",
                                   "stage_times_1f1b", "stage_times_gpipe", "activations_1f1b",
                                   "activations_gpipe")}
    for round_index in range(args.rounds):
        print(f"bench: round {round_index + 1} of {args.rounds}", flush=True)
        samples["one"].append(train(1, model(args), "pipeline-one", bind_to_cores=True)[0])
        one_m1 = model(args)
        one_m1[one_m1.index("--micro-batches") + 1] = 1
        samples["one_m1"].append(train(1, one_m1, "pipeline-one-m1", bind_to_cores=True)[0])
        for schedule in ("1f1b", "gpipe"):
            trace = os.path.join(BUILD, f"bench-pipeline-{schedule}.trace.json")
            step_ms, summary = train(STAGES, model(args) + ["--pp", STAGES, "--schedule", schedule,
                                                             "--trace", trace],
                                     f"pipeline-{schedule}", bind_to_cores=True)
            samples[schedule].append(step_ms)
            report = timeline(trace, os.path.join(BUILD, f"bench-pipeline-{schedule}.png"))
            samples["bubble_" + schedule].append(report["bubble"])
            samples["stage_times_" + schedule].append(report["bubble_from_stage_times"])
            samples["activations_" + schedule].append(summary["peak_mem_bytes_by_rank"][0]["activations"])
    for schedule in ("1f1b", "gpipe"):  # the last round's timelines
        shutil.copy(os.path.join(BUILD, f"bench-pipeline-{schedule}.png"),
                    os.path.join(os.path.dirname(args.output), f"pipeline_{schedule}.png"))

    median = {key: statistics.median(values) for key, values in samples.items()}
    ideal_bubble = (STAGES - 1) / (MICRO_BATCHES + STAGES - 1)
    ideal_step_ms = median["one"] / STAGES * (MICRO_BATCHES + STAGES - 1) / MICRO_BATCHES
    result = {
        "model": {"layers": args.layers, "width": args.width, "input": 64, "classes": 10,
                  "global_batch": args.batch, "micro_batches": MICRO_BATCHES, "stages": STAGES},
        "rounds": args.rounds,
        "steps_per_run": args.steps,
        "samples": samples,
        "one_process_step_ms": median["one"],
        "one_process_one_micro_batch_step_ms": median["one_m1"],
        "ideal_pipeline_step_ms": ideal_step_ms,
        "ideal_bubble": ideal_bubble,
        "target": {"bubble_within": 0.05, "step_over_ideal_at_most": 1.15},
    }
    for schedule in ("1f1b", "gpipe"):
        result[schedule] = {
            "step_ms": median[schedule],
            "step_over_ideal": median[schedule] / ideal_step_ms,
            "speedup_over_one_process": median["one"] / median[schedule],
            "bubble": median["bubble_" + schedule],
            "bubble_minus_ideal": median["bubble_" + schedule] - ideal_bubble,
            "bubble_from_stage_compute_times": median["stage_times_" + schedule],
            "stage0_peak_activation_bytes": median["activations_" + schedule],
        }
    write_result(args.output, result)
    for schedule in ("1f1b", "gpipe"):
        entry = result[schedule]
        print(f"{schedule}: step {entry['step_ms']:.1f} ms = {entry['step_over_ideal']:.3f} x ideal "
              f"{ideal_step_ms:.1f} ms (one process {median['one']:.1f} ms); bubble {entry['bubble']:.3f} "
              f"vs ideal {ideal_bubble:.3f} ({entry['bubble_from_stage_compute_times']:.3f} from the stages' "
              f"compute times); stage 0 activations {entry['stage0_peak_activation_bytes'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
