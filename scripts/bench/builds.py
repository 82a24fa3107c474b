#!/usr/bin/python3
"""Two builds of mlptrain side by side on the CPU: each layout's median step (after two warm-up
steps) in this tree's build and in a baseline build (`--baseline`, another tree's mlptrain), the
two alternated over --rounds rounds, so a change meant to leave the speed alone is held to the
ratio of the medians (these machines are shared and noisy: only runs measured together compare).

Model: 6 layers of 1024, input 256, 16 classes, mixture data, global batch 512. Appends a run to
results/build_comparisons.jsonl (one line a run: command, machine, CPU, date, both trees)."""
import os
import statistics
import subprocess

from benchlib import PROGRAM, ROOT, append_result, arguments, train

MODEL = ["--layers", 6, "--hidden", 1024, "--input-dim", 256, "--output-dim", 16, "--dataset", "mixture",
         "--global-batch", 512]
# (ranks, options) of each layout compared.
LAYOUTS = [(1, []), (2, ["--dp", 2]), (2, ["--dp", 2, "--zero", 3]), (2, ["--tp", 2]),
           (2, ["--pp", 2, "--micro-batches", 4]), (2, ["--dp", 2, "--device", "loopback"]),
           (1, ["--param-dtype", "bf16"]), (1, ["--param-dtype", "bf16", "--fp8", "tensorwise"]),
           (1, ["--param-dtype", "bf16", "--fp8", "rowwise"])]


def source_tree(program):
    """The commit of the tree a build lies in (its folder's parent), where git knows it."""
    folder = os.path.dirname(os.path.dirname(os.path.abspath(program)))
    head = subprocess.run(["git", "-C", folder, "describe", "--always", "--dirty"], capture_output=True, text=True)
    return head.stdout.strip() if head.returncode == 0 else None


def main():
    parser = arguments(__doc__.split("\n\n")[0], rounds=3, steps=14, result_file="build_comparisons.jsonl")
    parser.add_argument("--baseline", required=True, help="the other build's mlptrain")
    parser.add_argument("--layouts", type=int, default=len(LAYOUTS), help="compare the first N layouts only")
    args = parser.parse_args()
    builds = {"this": PROGRAM, "baseline": os.path.abspath(args.baseline)}
    steps = {}
    for round_index in range(args.rounds):
        for build, program in builds.items():
            for ranks, options in LAYOUTS[:args.layouts]:
                label = " ".join(map(str, options)) or "one process"
                ms, _ = train(ranks, MODEL + ["--steps", args.steps] + options, f"builds-{build}", program=program)
                steps.setdefault(label, {"ranks": ranks, "this": [], "baseline": []})[build].append(ms)
    rows = []
    for label, measured in steps.items():
        ratio = statistics.median(measured["this"]) / statistics.median(measured["baseline"])
        rows.append({"layout": label, **measured, "this_over_baseline": ratio})
        print(f"builds: {label:45s} this {statistics.median(measured['this']):7.2f} ms, baseline "
              f"{statistics.median(measured['baseline']):7.2f} ms: {ratio:.3f}")
    append_result(args.output, {"baseline": builds["baseline"], "baseline_tree": source_tree(builds["baseline"]),
                                "model": " ".join(map(str, MODEL)), "steps": args.steps, "rounds": args.rounds,
                                "layouts": rows})


if __name__ == "__main__":
    main()
