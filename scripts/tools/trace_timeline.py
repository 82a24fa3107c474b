#!/usr/bin/python3
"""Draws a trace written by `mlptrain --trace FILE` as a timeline (PNG, one row per pipeline
stage, forward and backward passes numbered by micro-batch, like the figures of the pipeline
papers; with model chunks, a pass on chunk c is labelled "m.c" and drawn darker per chunk; a split
backward's B and W apart) and measures the pipeline bubble.

The bubble of a step is the idle share of the stages' time between the step's first computation
and its last: 1 - (sum over stages of computation time) / (P x that window). It is set beside the
schedule's ideal with equal stages and no transfer cost, as the run's own trace records it (the
schedule's table entry: its value and formula), as it records whether backward splits into B and
W and which global chunk each stage's chunks are. The figure shows one data-parallel replica
(dp 0) and one tensor-parallel rank (tp 0) per stage; the bubble is the median over the steps
after the first (which includes warm-up costs). Beside both, the bubble the same schedule would
have with free transfers and each stage's measured compute times: the part of the measured bubble
that stages of unequal speed explain.

usage: trace_timeline.py TRACE [--output timeline.png] [--step N] [--json]"""
import argparse
import json
import statistics
import sys


def load(path):
    with open(path) as handle:
        trace = json.load(handle)
    run = trace.get("otherData", {})
    places = {}  # pid -> process_name args (rank, stage, dp, tp)
    spans = []
    for event in trace["traceEvents"]:
        if event.get("ph") == "M" and event.get("name") == "process_name":
            places[event["pid"]] = event["args"]
        elif event.get("ph") == "X":
            spans.append(event)
    return run, places, spans


def stage_ranks(places):
    """The rank drawn for each stage: the one at dp 0 and tp 0."""
    chosen = {}
    for pid, place in places.items():
        if place.get("dp", 0) == 0 and place.get("tp", 0) == 0:
            chosen[place.get("stage", 0)] = pid
    return [chosen[stage] for stage in sorted(chosen)]


COMPUTATIONS = ("forward", "backward", "backward_input", "backward_weight")


def computations(spans, pid, step):
    return [span for span in spans if span["pid"] == pid and span["name"] in COMPUTATIONS
            and span["args"].get("step") == step]


def step_bubble(spans, ranks, step):
    """(bubble, window in ms) of one step, or None if a stage computed nothing in it."""
    per_stage = [computations(spans, pid, step) for pid in ranks]
    if any(not stage for stage in per_stage):
        return None
    start = min(span["ts"] for stage in per_stage for span in stage)
    end = max(span["ts"] + span["dur"] for stage in per_stage for span in stage)
    busy = sum(span["dur"] for stage in per_stage for span in stage)
    window = end - start
    return 1.0 - busy / (len(ranks) * window), window / 1000.0


def simulated_bubble(spans, ranks, step, global_chunks):
    """The bubble the step's own schedule would have with free transfers and every stage's
    computations taking their median measured time: it separates what the stages' speeds cost
    (an imbalance the FLOP-balanced split cannot see) from what transfers and waiting cost.
    `global_chunks[stage][chunk]` is the global chunk a stage's local chunk is (the trace's own
    record of the placement)."""
    orders, durations = [], []
    for pid in ranks:
        done = sorted(computations(spans, pid, step), key=lambda span: span["ts"])
        orders.append([(span["name"], span["args"]["micro_batch"], span["args"].get("chunk", 0)) for span in done])
        durations.append({name: statistics.median(span["dur"] for span in done if span["name"] == name)
                          for name in {span["name"] for span in done}})
    stages = len(ranks)
    # A forward waits for the previous global chunk's forward, a backward (or its B) for the
    # next one's. W waits for nothing else.
    last_global = max(chunk for chunks in global_chunks for chunk in chunks)
    finished = {}  # (global chunk, forward or backward, micro_batch) -> end time
    position = [0] * stages
    free_at = [0.0] * stages
    while any(position[stage] < len(orders[stage]) for stage in range(stages)):
        progressed = False
        for stage in range(stages):
            while position[stage] < len(orders[stage]):
                name, micro_batch, chunk = orders[stage][position[stage]]
                here = global_chunks[stage][chunk]
                direction = "forward" if name == "forward" else "backward"
                ready = 0.0
                if name != "backward_weight":
                    neighbour = here - 1 if name == "forward" else here + 1
                    if 0 <= neighbour <= last_global:
                        ready = finished.get((neighbour, direction, micro_batch))
                        if ready is None:
                            break
                start = max(free_at[stage], ready)
                free_at[stage] = start + durations[stage][name]
                if name != "backward_weight":
                    finished[(here, direction, micro_batch)] = free_at[stage]
                position[stage] += 1
                progressed = True
        if not progressed:
            return None  # not a pipeline schedule this simulation understands
    busy = sum(durations[stage][name] for stage in range(stages) for name, _, _ in orders[stage])
    return 1.0 - busy / (stages * max(free_at))


def analyse(run, places, spans):
    ranks = stage_ranks(places)
    stages = len(ranks)
    micro_batches = run.get("micro_batches", 1)
    steps = sorted({span["args"]["step"] for span in spans if span["name"] in COMPUTATIONS})
    measured = {step: step_bubble(spans, ranks, step) for step in steps}
    measured = {step: value for step, value in measured.items() if value is not None}
    counted = [step for step in measured if step != steps[0]] or list(measured)
    return {
        "stages": stages,
        "micro_batches": micro_batches,
        "schedule": run.get("schedule", ""),
        "virtual_stages": run.get("virtual_stages", 1),
        # The schedule's theory as the run's table entry gives it (src/schedule/schedule_table.cpp).
        "ideal_bubble": run["theoretical_bubble"],
        "bubble_formula": run.get("bubble_formula", ""),
        "bubble": statistics.median(measured[step][0] for step in counted),
        "window_ms": statistics.median(measured[step][1] for step in counted),
        "bubble_from_stage_times": statistics.median(
            value for value in (simulated_bubble(spans, ranks, step, run["global_chunks"]) for step in counted)
            if value is not None),
        "schedule_source": run.get("schedule_source", ""),
        "splits_backward": run.get("splits_backward", False),
        "bubble_by_step": {str(step): round(measured[step][0], 4) for step in sorted(measured)},
        "ranks_drawn": ranks,
    }


def draw(run, places, spans, report, step, output):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ranks = report["ranks_drawn"]
    rows = [computations(spans, pid, step) for pid in ranks]
    start = min(span["ts"] for row in rows for span in row)
    figure, axes = plt.subplots(figsize=(12, 0.6 * len(ranks) + 1.6))
    # Per kind, one shade per chunk (darker for later chunks).
    colors = {"forward": ("#6F93D0", "#2F4F8F", "#1F3560", "#101C33"),
              "backward": ("#7CC48D", "#3D8A50", "#285C35", "#14301B"),
              "backward_input": ("#7CC48D", "#3D8A50", "#285C35", "#14301B"),
              "backward_weight": ("#E1A35C", "#B0702A", "#7A4C1C", "#45290F")}
    chunked = report.get("virtual_stages", 1) > 1
    for row_index, row in enumerate(rows):
        for span in row:
            left = (span["ts"] - start) / 1000.0
            width = span["dur"] / 1000.0
            chunk = span["args"].get("chunk", 0)
            axes.broken_barh([(left, width)], (row_index - 0.4, 0.8),
                             facecolors=colors[span["name"]][min(chunk, 3)], edgecolors="white", linewidth=0.5)
            label = str(span["args"].get("micro_batch", "")) + (f".{chunk}" if chunked else "")
            axes.text(left + width / 2, row_index, label, ha="center", va="center", color="white", fontsize=7)
    axes.set_yticks(range(len(ranks)))
    axes.set_yticklabels([f"stage {places[pid].get('stage', 0)}" for pid in ranks])
    axes.invert_yaxis()
    axes.set_xlabel("time in step (ms)")
    # The schedule as the run named it, its chunks a stage where it has several.
    chunks = max(len(stage_chunks) for stage_chunks in run["global_chunks"])
    schedule = report["schedule"] + (f", {chunks} chunks a stage" if chunks > 1 else "")
    split = report["splits_backward"]
    axes.set_title(f"{schedule}, P = {report['stages']}, M = {report['micro_batches']}, step {step}: "
                   f"bubble {report['bubble_by_step'][str(step)]:.3f} measured, {report['ideal_bubble']:.3f} ideal; "
                   f"forward blue, {'B green, W orange' if split else 'backward green'}", fontsize=9)
    figure.tight_layout()
    figure.savefig(output, dpi=120)
    plt.close(figure)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("trace")
    parser.add_argument("--output", default="timeline.png", help="PNG to write")
    parser.add_argument("--step", type=int, help="0-based step to draw (default: the last)")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    run, places, spans = load(args.trace)
    if not any(span["name"] in COMPUTATIONS for span in spans):
        sys.exit(f"trace_timeline: {args.trace} has no forward or backward spans")
    report = analyse(run, places, spans)
    step = args.step if args.step is not None else max(int(step) for step in report["bubble_by_step"])
    if str(step) not in report["bubble_by_step"]:
        sys.exit(f"trace_timeline: step {step} is not in the trace")
    draw(run, places, spans, report, step, args.output)
    report["picture"] = args.output
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['schedule']} P={report['stages']} M={report['micro_batches']}: bubble "
              f"{report['bubble']:.3f} measured (median over steps), "
              f"{report['bubble_from_stage_times']:.3f} from the stages' compute times alone, "
              f"{report['ideal_bubble']:.3f} ideal; wrote {args.output}")


if __name__ == "__main__":
    main()
