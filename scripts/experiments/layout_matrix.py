#!/usr/bin/python3
"""Every layout against one process: the generated matrix of dp, tp, pp (each schedule), ep,
ZeRO 0-3, recomputation and MoE layers on or off, at world sizes 1, 2, 4 and 8, on a tiny model.
Each layout trains a few steps and is checked against the one-process run with the same global
batch and micro-batches: losses and gradient norms within 1e-5 (relative), final weights within
1e-5 (relative L2 norm of each tensor's difference), and rank 0's placement and traffic as
predicted (parameters, gradients and optimizer bytes exactly, activations within 5 %, each
collective's bytes within 1 %). Every combination runs: a refusal is recorded with its line and
fails the matrix as a wrong result does.

--covering runs the subset the end-to-end tests run (every pair of option values up to 4 ranks,
and the three- and four-dimensional layouts at 8 ranks); --pairs every pair at every world size; the full matrix writes
results/layout_matrix.json."""
import argparse
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import h5py
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
from benchlib import PROGRAM, valid_layouts  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MPIEXEC = shutil.which("mpiexec.mpich") or "mpiexec"
TOLERANCE = 1e-5

MODEL = ["--dataset", "teacher", "--layers", 6, "--hidden", 16, "--input-dim", 8, "--output-dim", 4,
         "--global-batch", 32, "--steps", 3, "--log-every", 0, "--lr", "3e-3"]
MOE = ["--moe-every", 2, "--experts", 8, "--top-k", 2]
FACTORS = ("world", "dp", "tp", "pp", "ep", "zero", "schedule", "recompute", "moe")


def divisors(number):
    return [value for value in range(1, number + 1) if number % value == 0]


def candidates(world):
    """The layouts of `world` ranks the matrix would run, valid or not: the product of every
    factor's values, less the matrix's own choices (which are not validity rules: mlptrain accepts
    what they leave out). The choices: at most 6 stages; ZeRO only where there is a data-parallel
    group to shard over (mlptrain accepts ZeRO at dp 1, where it has nothing to shard); 1F1B and
    GPipe for the pipeline (the other schedules have tests of their own) and no schedule without
    one (mlptrain accepts one and ignores it)."""
    sizes = divisors(world)
    for tp, pp, dp in itertools.product(sizes, sizes, sizes):
        if pp > 6:
            continue
        for moe, zero, recompute in itertools.product((False, True), range(4), (False, True)):
            if zero and dp == 1:
                continue
            for ep in sizes:
                for schedule in ("1f1b", "gpipe") if pp > 1 else (None,):
                    yield dict(world=world, dp=dp, tp=tp, pp=pp, ep=ep, zero=zero, schedule=schedule,
                               recompute=recompute, moe=moe)


def planned(layout):
    """The layout as mlpplan --layouts all --json writes it (its `layout` object), as a hashable key.
    The options the matrix leaves at their defaults are named with those; without a pipeline the
    schedule is left out, as mlpplan lists one layout there whatever the schedule."""
    fields = dict(dp=layout["dp"], tp=layout["tp"], pp=layout["pp"], ep=layout["ep"], zero=layout["zero"],
                  zero_shard_size=0, schedule=layout["schedule"] if layout["pp"] > 1 else None, virtual_stages=1,
                  micro_batches=layout["micro_batches"], recompute=layout["recompute"],
                  sequence_parallel=False, offload=False)
    return tuple(sorted(fields.items()))


def layouts(worlds=(1, 2, 4, 8)):
    """Every candidate layout (candidates()) that mlptrain accepts for the model the matrix trains.
    Validity is mlptrain's alone, asked of mlpplan: one --layouts all call per world and model lists
    every valid layout, and a candidate is kept when it is among them (the same answer as asking
    layout_problem() of each candidate, at one process launch per world and model instead of
    thousands)."""
    found = []
    for world in worlds:
        counts = sorted({micro_batches(dict(pp=pp)) for pp in divisors(world)})
        accepted = {moe: {planned(layout) for layout in valid_layouts(world, model_options(moe), counts)}
                    for moe in (False, True)}
        for layout in candidates(world):
            if planned(dict(layout, micro_batches=micro_batches(layout))) in accepted[layout["moe"]]:
                found.append(layout)
    return found


def covering(candidates, strength=2, chosen=()):
    """Adds to `chosen` layouts of `candidates` until every combination of `strength` factor values
    that occurs in `candidates` occurs in the result (greedy: each next layout covers the most
    combinations not yet covered)."""
    def combinations(layout):
        return set(itertools.combinations(((factor, layout[factor]) for factor in FACTORS), strength))
    uncovered = set().union(*(combinations(layout) for layout in candidates))
    chosen = list(chosen)
    for layout in chosen:
        uncovered -= combinations(layout)
    while uncovered:
        best = max(candidates, key=lambda layout: (len(combinations(layout) & uncovered), -layout["world"]))
        chosen.append(best)
        uncovered -= combinations(best)
    return chosen


# The three-dimensional layout of the literature and its MoE counterpart, always in the tested subset.
THREE_D = dict(world=8, dp=2, tp=2, pp=2, ep=1, zero=1, schedule="1f1b", recompute=False, moe=False)
MOE_THREE_D = dict(world=8, dp=4, tp=2, pp=1, ep=2, zero=0, schedule=None, recompute=False, moe=True)


def tested_subset(candidates):
    """What the end-to-end tests run: every pair of values up to 4 ranks, and at 8 ranks dp 2 x tp
    2 x pp 2 and dp 4 (ep 2) x tp 2 with MoE layers (8 oversubscribed ranks run slowly on a small
    machine; --pairs covers every pair at 8 ranks too, the full matrix everything)."""
    small = [layout for layout in candidates if layout["world"] <= 4]
    return covering(small) + [THREE_D, MOE_THREE_D]


def micro_batches(layout):
    return 2 * layout["pp"] if layout["pp"] > 1 else 2


def model_options(moe):
    """The model the matrix trains, with or without MoE layers."""
    return [str(value) for value in MODEL + (MOE if moe else [])]


def arguments(layout):
    """The layout's options; the one-process reference drops the parallel ones."""
    common = model_options(layout["moe"]) + ["--micro-batches", micro_batches(layout)]
    parallel = ["--dp", layout["dp"], "--tp", layout["tp"], "--pp", layout["pp"], "--ep", layout["ep"],
                "--zero", layout["zero"]] + (["--recompute"] if layout["recompute"] else [])
    if layout["schedule"]:
        parallel += ["--schedule", layout["schedule"]]
    return [str(value) for value in common], [str(value) for value in parallel]


def train(options, ranks, directory, name):
    """Runs mlptrain; returns (return code, last line of stderr, step records, summary, weights)."""
    metrics, checkpoints = os.path.join(directory, name + ".jsonl"), os.path.join(directory, name)
    command = [MPIEXEC, "-n", str(ranks), PROGRAM]
    try:
        result = subprocess.run(command + options + ["--metrics", metrics, "--checkpoint-dir", checkpoints],
                                capture_output=True, text=True, timeout=600, env=dict(os.environ, OMP_NUM_THREADS="1"))
    except subprocess.TimeoutExpired:
        return 124, "did not finish within 600 s", None, None, None
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        return result.returncode, lines[-1] if lines else "", None, None, None
    with open(metrics) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    with open(os.path.join(checkpoints, "latest")) as handle:
        final = os.path.join(checkpoints, handle.read().strip())
    weights = {}
    with h5py.File(final, "r") as file:
        file["model"].visititems(lambda key, item: weights.__setitem__(key, item[()])
                                 if isinstance(item, h5py.Dataset) else None)
    return 0, "", [r for r in records if not r.get("summary")], next(r for r in records if r.get("summary")), weights


def differences(steps, weights, reference_steps, reference_weights):
    """What does not match the one-process run, as sentences."""
    found = []
    if len(steps) != len(reference_steps):
        found.append(f"{len(steps)} step records, one process {len(reference_steps)}")
    if sorted(weights) != sorted(reference_weights):
        found.append(f"the checkpoint's tensors differ: {sorted(set(weights) ^ set(reference_weights))}")
    for mine, theirs in zip(steps, reference_steps):
        for key in ("loss", "grad_norm"):
            if abs(mine[key] - theirs[key]) > TOLERANCE * abs(theirs[key]):
                found.append(f"step {mine['step']} {key}: {mine[key]} vs {theirs[key]}")
    for name, expected in reference_weights.items():
        if name not in weights:
            continue
        error = np.linalg.norm(weights[name].astype(np.float64) - expected) / (np.linalg.norm(expected) or 1.0)
        if error > TOLERANCE:
            found.append(f"{name}: relative error {error:.3g}")
    return found


def misprediction(summary, moe):
    """Where rank 0's prediction and the ledger disagree, as sentences. MoE layers' activations
    follow the routing: the prediction charges every micro-batch in flight with the largest
    micro-batch's routed rows, so with MoE layers it is an upper bound (exact when one micro-batch
    is in flight or the routing is balanced)."""
    found = []
    for state, entry in summary["placement"].items():
        predicted, measured = entry["predicted_bytes"], entry["measured_bytes"]
        if state in ("params", "grads", "optimizer", "comm_buffers"):
            wrong = predicted != measured
        elif state == "activations":
            wrong = predicted < measured if moe else abs(predicted - measured) > 0.05 * measured
        else:
            continue
        if wrong:
            found.append(f"{state}: predicted {predicted}, measured {measured}")
    for op, entry in summary["comm_per_step"].items():
        if abs(entry["predicted_bytes"] - entry["measured_bytes"]) > 0.01 * max(entry["measured_bytes"], 1):
            found.append(f"{op}: predicted {entry['predicted_bytes']} bytes, measured {entry['measured_bytes']}")
    return found


def check(layout, directory, references):
    """The layout's outcome: passed, failed (with what differs) or refused (with the line)."""
    common, parallel = arguments(layout)
    key = tuple(common)
    if key not in references:
        code, line, steps, _, weights = train(common, 1, directory, f"reference{len(references)}")
        if code != 0:
            raise RuntimeError(f"the one-process run failed: {line}")
        references[key] = (steps, weights)
    name = "layout" + "_".join(f"{factor}{layout[factor]}" for factor in FACTORS)
    code, line, steps, summary, weights = train(common + parallel, layout["world"], directory, name)
    if code != 0:
        return {"outcome": "refused" if code == 2 else "failed", "line": line}
    problems = differences(steps, weights, *references[key]) + misprediction(summary, layout["moe"])
    return {"outcome": "failed" if problems else "passed", "problems": problems}


def run_matrix(chosen, progress=print):
    directory = tempfile.mkdtemp(prefix="mlptrain-matrix-")
    references, rows = {}, []
    try:
        for index, layout in enumerate(chosen):
            started = time.monotonic()
            row = dict(layout, **check(layout, directory, references), seconds=round(time.monotonic() - started, 2))
            rows.append(row)
            progress(f"{index + 1}/{len(chosen)} {row['outcome']:7s} " +
                     " ".join(f"{factor}={layout[factor]}" for factor in FACTORS) +
                     (f": {row.get('line') or '; '.join(row.get('problems', []))}" if row["outcome"] != "passed" else ""))
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--covering", action="store_true", help="only the subset the tests run")
    parser.add_argument("--pairs", action="store_true", help="only a subset with every pair of values")
    parser.add_argument("--worlds", default="1,2,4,8", help="world sizes, comma-separated")
    parser.add_argument("--output", default=os.path.join(ROOT, "results", "layout_matrix.json"))
    args = parser.parse_args()
    candidates = layouts(tuple(int(world) for world in args.worlds.split(",")))
    chosen = tested_subset(candidates) if args.covering else covering(candidates) if args.pairs else candidates
    print(f"matrix: {len(chosen)} of {len(candidates)} layouts", flush=True)
    rows = run_matrix(chosen, lambda line: print(line, flush=True))
    counts = {outcome: sum(row["outcome"] == outcome for row in rows) for outcome in ("passed", "failed", "refused")}
    with open(args.output, "w") as handle:
        json.dump({"date": time.strftime("%Y-%m-%d"), "command": " ".join(["scripts/experiments/layout_matrix.py"] + sys.argv[1:]),
                   "model": " ".join(map(str, MODEL)), "moe": " ".join(map(str, MOE)), "counts": counts,
                   "layouts": rows}, handle, indent=1)
    print(f"matrix: {counts['passed']} passed, {counts['failed']} failed, {counts['refused']} refused -> {args.output}")
    return 1 if counts["failed"] or counts["refused"] else 0


if __name__ == "__main__":
    sys.exit(main())
