#!/usr/bin/python3
"""mlpplan against measured runs on this machine: for every layout of the placement test's list
(data, tensor, pipeline and expert parallelism, ZeRO 1-3, recompute, MoE, at 1, 2 and 4 ranks)
and the interleaved and zero-bubble (H1, V) pipeline schedules,
mlpplan calibrated on this machine (layerbench and commbench output made here, just before
every measured run) is held against mlptrain's own ledger and step times: parameters, gradients,
optimizer state and communication buffers equal, activations within 5 % (with MoE layers, whose
rows follow the routing, the busiest rank's plan at the routing's most uneven step against the
largest rank's peak: at least it, and within 25 %), bytes per operation within 1 % (MoE
exchanges: 25 %), and the step time against the measured step (goal: within 10 %). MoE layouts
are planned with the routing's --expert-imbalance (its mean step: the pace) and
--expert-peak-imbalance (its most uneven step: the activations), from a calibration run of one
process.
Each of --rounds interleaved rounds measures every layout's steps (after two warm-up steps),
each run right after a calibration of its own world, whose plan it is held against (a host's
neighbours move its speed by a quarter within minutes: a calibration at the start of a round
planned the round's later runs from another machine than theirs). A run's figure is its steps'
lower quartile: the calibration's benches time the best of their repeats, the work as it runs
when the host leaves it alone, and a step's median counts the neighbours' share of the steps
besides (on a busy host the median planned 0.82-0.96 of most layouts' steps over five runs).
The layout's figure is the median of its rounds' ratios, over the quiet rounds: each round
records the share of the machine's cores its processes got, and a round with less than 0.85 of
the layout's best share waited for the host's other tenants (a round that waited ran up to 4.6x
slower on a shared host) and is set aside and said so; every round's plan, steps and CPU share
are written beside the figure, and the ratio at the steps' median beside the figure's.
Ranks beyond the cores share them; the rows say when they do. Appends the run to the history
results/plan_vs_measured_runs.jsonl (with its date, machine and tree) and draws it in
results/plan_vs_measured.png.

usage: scripts/experiments/plan_vs_measured.py [--steps N] [--rounds R] [--output FILE]"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
import benchlib  # noqa: E402
from benchlib import cpu_model  # noqa: E402

ROOT = benchlib.ROOT
PLAN = os.path.join(benchlib.BUILD, "mlpplan")
LAYERBENCH = os.path.join(benchlib.BUILD, "layerbench")
COMMBENCH = os.path.join(benchlib.BUILD, "commbench")
# The trainer as users run it: each rank takes its share of the cores (no OMP_NUM_THREADS).
ENVIRONMENT = {key: value for key, value in os.environ.items() if key != "OMP_NUM_THREADS"}

DENSE = ["--layers", 6, "--hidden", 1024, "--input-dim", 256, "--output-dim", 16, "--dataset", "mixture",
         "--global-batch", 512]
MOE = DENSE + ["--moe-every", 2, "--experts", 4, "--top-k", 2]
# The calibration run: the dense model at a batch no measured run has.
CALIBRATION_RUN = DENSE[:-2] + ["--global-batch", 128]
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from test_placement import LAYOUTS as PLACEMENT_LAYOUTS  # noqa: E402  (the same list of layouts)

# The pipeline schedules the placement test's list predates, at two stages on two cores.
NEWER_SCHEDULES = [
    (2, DENSE, ["--pp", 2, "--micro-batches", 4, "--schedule", "interleaved", "--virtual-stages", 2]),
    (2, DENSE, ["--pp", 2, "--micro-batches", 4, "--schedule", "zb-h1"]),
    (2, DENSE, ["--pp", 2, "--micro-batches", 4, "--schedule", "zb-v"]),
]
STATES_EXACT = ("params", "grads", "optimizer", "comm_buffers")
CALIBRATED_ROWS = (32, 64, 128, 256, 512)  # the GEMMs' rows the layouts below give (MoE experts: 64-256)


def run(command, environment=None):
    result = subprocess.run([str(part) for part in command], capture_output=True, text=True,
                            env=environment or ENVIRONMENT)
    if result.returncode != 0:
        sys.exit(f"plan_vs_measured: {' '.join(map(str, command))} failed:\n{result.stdout}{result.stderr}")
    return result.stdout


def launch(ranks):
    """mpiexec for `ranks` processes: where they are as many as the cores, each bound to its own
    core, the same one in the calibration and in the runs (this machine's cores differ: one
    process of a dp-2 rank's work ran 20-40 % slower on the second vCPU than on the first), so
    that the bench's slowest process is the core the slowest rank runs on. Fewer ranks than
    cores spread their GEMM threads over them; more share them: neither is bound."""
    bound = ["-bind-to", "core"] if ranks == (os.cpu_count() or 1) else []
    return ["mpiexec.mpich", "-n", ranks] + bound


def calibrate(directory, world):
    """The files mlpplan --calibrate reads for a world of `world` ranks, written to `directory`:
    layerbench at the model's shape, run as that world's ranks run (as many processes side by
    side, up to the cores, each on its share of the cores' GEMM threads: mlpplan scales the
    bench's rate per thread to the cores, and GEMMs on several threads do not run quite that
    many times faster; memory-bound kernels of ranks side by side share the memory), its GEMMs
    also timed in a step's sequence at several row counts (a micro-batch's, an MoE expert's) and
    AdamW over more parameters than the caches hold, as a rank's update is; commbench at that
    world; and a calibration run (the dense model at another batch, data parallel over as many
    processes as layerbench ran, 12 steps) whose metrics give the optimizer's update as the loop
    runs it."""
    cores = os.cpu_count() or 1
    ranks, threads = min(world, cores), max(1, cores // world)
    layer = os.path.join(directory, f"layerbench_{ranks}_ranks_{threads}_threads.jsonl")
    with open(layer, "w") as handle:
        for rows in CALIBRATED_ROWS:
            update = ["--optimizer-parameters", 8_000_000] if rows == 256 else []
            handle.write(run(launch(ranks) + [LAYERBENCH, rows, 1024, 1024, 10, "--dtype", "fp32",
                                              "--sequence", 6] + update,
                             environment=dict(ENVIRONMENT, OMP_NUM_THREADS=str(threads))))
    comm = os.path.join(directory, f"commbench_{world}.jsonl")
    with open(comm, "w") as handle:
        handle.write(run(launch(max(world, 2)) + [COMMBENCH, "--json", "--max-bytes", "32M",
                                                  "--step-factor", 4, "--collectives",
                                                  "all_reduce,reduce_scatter,all_gather,all_to_all,broadcast,"
                                                  "send_recv"]))
    loop = os.path.join(directory, f"calibration_run_{ranks}_ranks.jsonl")
    run(launch(ranks) + [benchlib.PROGRAM] + CALIBRATION_RUN +
        ["--dp", ranks, "--steps", 12, "--log-every", 0, "--metrics", loop])
    return [layer, comm, loop]


def expert_imbalance(scratch, splits, steps):
    """mlpplan's --expert-imbalance and --expert-peak-imbalance for each number of ranks that
    split an MoE layer's experts, from a calibration run's routing (one process of the MoE model,
    `steps` steps, as the measured runs take; every layout of it computes the same numbers, so
    it routes as they do), each rank holding a contiguous block of experts, as the layers place
    them: the mean over the steps and MoE layers of the busiest rank's rows over the mean rank's
    (the pace), and the most, over the steps, of a rank's rows summed over the MoE layers over
    the mean rank's (the activations a rank keeps at its peak)."""
    metrics = os.path.join(scratch, "routing.jsonl")
    run([benchlib.PROGRAM] + MOE + ["--steps", steps, "--log-every", 0, "--metrics", metrics])
    with open(metrics) as handle:
        loads = [record["expert_load"] for record in map(json.loads, handle)  # [step][layer][expert]
                 if not record.get("summary") and record.get("expert_load")]
    factors = {}
    for split in splits:
        def rows_by_rank(experts):
            share = len(experts) // split
            return [sum(experts[rank * share:(rank + 1) * share]) for rank in range(split)]
        pace = [max(rows_by_rank(experts)) * split / sum(experts)
                for layers in loads for experts in layers if sum(experts) > 0]
        peak = [max(map(sum, zip(*map(rows_by_rank, layers)))) * split / sum(map(sum, layers))
                for layers in loads if sum(map(sum, layers)) > 0]
        factors[split] = {"mean": statistics.fmean(pace), "peak": max(peak)}
    return factors


def expert_split(layout):
    """The ranks that split an MoE layer's experts: expert times tensor parallelism."""
    def degree(flag):
        return int(layout[layout.index(flag) + 1]) if flag in layout else 1
    return degree("--ep") * degree("--tp")


def measure(ranks, arguments, steps, scratch):
    """(the steps after two warm-up steps in ms, the summary record, the share of the cores the
    run got)."""
    metrics = os.path.join(scratch, "metrics.jsonl")
    _, share = benchlib.with_cpu_share(lambda: run(launch(ranks) + [benchlib.PROGRAM] + arguments +
                                                   ["--steps", steps, "--log-every", 0, "--metrics", metrics]))
    with open(metrics) as handle:
        records = [json.loads(line) for line in handle]
    step_ms = [r["step_ms"] for r in records if not r.get("summary") and "step_ms" in r][2:]
    return step_ms, records[-1], share


def lower_quartile(steps):
    """A run's figure: its steps' lower quartile (ms)."""
    return statistics.quantiles(steps, n=4)[0]


def planned(ranks, model, layout, files, imbalance):
    """mlpplan --calibrate's JSON for the layout, MoE layouts with the routing's imbalance."""
    split = expert_split(layout)
    routing = (["--expert-imbalance", imbalance[split]["mean"], "--expert-peak-imbalance", imbalance[split]["peak"]]
               if model is MOE and split > 1 else [])
    return json.loads(run([PLAN, "--world", ranks, "--calibrate"] + files + model + layout + routing +
                          ["--json"]).splitlines()[0])


def compare(ranks, model, layout, rounds, summary, imbalance):
    """The layout's row: memory and bytes planned against the ledger, and the step planned with
    each round's calibration against that round's steps' lower quartile; the figure is the median
    over the quiet rounds of their ratios (`rounds`: (steps in ms, calibration files, quiet) a
    round), the same at the steps' median beside it."""
    moe = model is MOE
    plans = [planned(ranks, model, layout, files, imbalance) for _, files, _ in rounds]
    plan = plans[0]
    problems = []
    if plan["memory_rank"] != 0:
        problems.append(f"the planner's largest rank is {plan['memory_rank']}, the summary's rank 0")
    problems += benchlib.ledger_disagreements(plan, summary, STATES_EXACT, ("all_to_all",) if moe else ())
    # An MoE layout's plan is its busiest rank's at the routing's most uneven step: held against
    # the largest rank's peak, from above (a bound on what a rank needs).
    planned_activations = plan["memory_bytes"]["activations"]
    if moe:
        actual = max(peaks["activations"] for peaks in summary["peak_mem_bytes_by_rank"])
        off = not actual <= planned_activations <= 1.25 * actual
    else:
        actual = summary["placement"]["activations"]["measured_bytes"]
        off = abs(planned_activations - actual) > 0.05 * actual
    if off:
        problems.append(f"activations: planned {planned_activations}, measured {actual}")
    quiet = [index for index, (_, _, kept) in enumerate(rounds) if kept]

    def ratios_at(statistic):
        ratios = [p["step_ms"]["total"] / statistic(steps) for p, (steps, _, _) in zip(plans, rounds)]
        return ratios, statistics.median(ratios[index] for index in quiet)
    ratios, ratio = ratios_at(lower_quartile)
    measured_by_round = [lower_quartile(steps) for steps, _, _ in rounds]
    middle = min(quiet, key=lambda index: abs(ratios[index] - ratio))  # the round the figure falls on
    return {"ranks": ranks, "moe": moe, "layout": [str(a) for a in layout],
            "expert_imbalance": imbalance[expert_split(layout)] if moe else {"mean": 1.0, "peak": 1.0},
            "oversubscribed": ranks > (os.cpu_count() or 1),
            "memory_and_bytes_agree": not problems, "problems": problems,
            "planned_step_ms": plans[middle]["step_ms"],
            "measured_step_ms": statistics.median(measured_by_round[index] for index in quiet),
            "measured_step_ms_by_round": measured_by_round,
            "measured_spread_ms": [min(measured_by_round), max(measured_by_round)],
            "measured_steps_ms_by_round": [steps for steps, _, _ in rounds],
            "planned_step_ms_by_round": [p["step_ms"]["total"] for p in plans],
            "step_time_ratio_by_round": ratios,
            "step_time_ratio_at_median_step": ratios_at(statistics.median)[1],
            "step_time_ratio": ratio, "within_10_percent": abs(ratio - 1) <= 0.10,
            "within_25_percent": abs(ratio - 1) <= 0.25}


def plot(rows, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    figure, axis = plt.subplots(figsize=(6.5, 6))
    for oversubscribed, color, label in ((False, "tab:blue", "ranks <= cores"), (True, "tab:red", "ranks > cores")):
        chosen = [r for r in rows if r["oversubscribed"] == oversubscribed]
        axis.scatter([r["measured_step_ms"] for r in chosen], [r["planned_step_ms"]["total"] for r in chosen],
                     color=color, label=label, zorder=3)
    top = max(max(r["measured_step_ms"], r["planned_step_ms"]["total"]) for r in rows) * 1.1
    axis.plot([0, top], [0, top], "k-", linewidth=0.8, label="planned = measured")
    axis.fill_between([0, top], [0, 0.75 * top], [0, 1.25 * top], color="0.85", label="within 25 %", zorder=0)
    axis.set(xlim=(0, top), ylim=(0, top), xlabel="measured step (ms, median)", ylabel="mlpplan --calibrate step (ms)",
             title=f"mlpplan against mlptrain: {cpu_model()}")
    axis.legend(loc="upper left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output", default=os.path.join(ROOT, "results", "plan_vs_measured_runs.jsonl"),
                        help="the run history this run is appended to (its plot goes beside it)")
    args = parser.parse_args()
    scratch = tempfile.mkdtemp(prefix="mlpplan-vs-measured-")
    layouts = [(ranks, MOE if "--moe-every" in model else DENSE, layout)
               for ranks, model, layout in PLACEMENT_LAYOUTS + NEWER_SCHEDULES]
    imbalance = expert_imbalance(scratch, sorted({expert_split(layout) for _, model, layout in layouts
                                                  if model is MOE}), args.steps)
    print(f"plan_vs_measured: expert imbalance by ranks splitting the experts: {imbalance}", flush=True)
    # Every layout once a round, the rounds one after another, so the machine's drift falls on
    # every layout alike; each run right after a calibration of its own, which plans it (the
    # host's neighbours move a calibration as much as a run: GEMMs of one row count timed at half
    # the rate of the next in one calibration, whole in the next).
    shares = {index: [] for index in range(len(layouts))}
    steps = {index: [] for index in range(len(layouts))}  # each round's steps (ms)
    calibrations = {index: [] for index in range(len(layouts))}  # each round's calibration files

    def measure_round(index, entry):
        ranks = entry[0]
        directory = os.path.join(scratch, f"round_{len(shares[index]) + 1}", f"layout_{index + 1}")
        os.makedirs(directory)
        calibrations[index].append(calibrate(directory, ranks))
        run_steps, summary, share = measure(ranks, entry[1] + entry[2], args.steps, scratch)
        steps[index].append(run_steps)
        shares[index].append(share)
        return lower_quartile(run_steps), summary

    step_ms, summaries = benchlib.interleaved_rounds(
        args.rounds, {index: entry for index, entry in enumerate(layouts)}, measure_round)
    rows = []
    for index, (ranks, model, layout) in enumerate(layouts):
        _, set_aside = benchlib.quiet_rounds(step_ms[index], shares[index])  # the best share's round stays
        rounds = [(steps[index][r], calibrations[index][r], r not in set_aside) for r in range(args.rounds)]
        row = compare(ranks, model, layout, rounds, summaries[index], imbalance)
        row.update(cpu_share_by_round=[round(s, 3) for s in shares[index]], rounds_set_aside=set_aside)
        rows.append(row)
        print(f"plan_vs_measured: {index + 1}/{len(layouts)} {ranks} rank(s) {' '.join(row['layout'])}"
              f"{' (MoE)' if row['moe'] else ''}: step planned {row['planned_step_ms']['total']:.1f} ms, measured "
              f"{row['measured_step_ms']:.1f} ms (rounds {row['measured_spread_ms'][0]:.1f}-"
              f"{row['measured_spread_ms'][1]:.1f}{f', {len(set_aside)} set aside' if set_aside else ''}) "
              f"({row['step_time_ratio']:.2f}x); "
              f"{'memory and bytes agree' if row['memory_and_bytes_agree'] else '; '.join(row['problems'])}", flush=True)
    fitting = [r for r in rows if not r["oversubscribed"]]
    summary = {"cpu": cpu_model(), "cores": os.cpu_count(), "layouts": len(rows),
               "memory_and_bytes_agree": sum(r["memory_and_bytes_agree"] for r in rows),
               "within_10_percent_ranks_within_cores": f"{sum(r['within_10_percent'] for r in fitting)} of {len(fitting)}",
               "within_25_percent_ranks_within_cores": f"{sum(r['within_25_percent'] for r in fitting)} of {len(fitting)}",
               "within_25_percent_oversubscribed": f"{sum(r['within_25_percent'] for r in rows if r['oversubscribed'])} of "
                                                   f"{len(rows) - len(fitting)}",
               "step_time_ratios_ranks_within_cores": sorted(round(r["step_time_ratio"], 3) for r in fitting),
               "mean_absolute_error_ranks_within_cores": statistics.fmean(abs(r["step_time_ratio"] - 1) for r in fitting),
               "mean_absolute_error_at_median_step_ranks_within_cores":
                   statistics.fmean(abs(r["step_time_ratio_at_median_step"] - 1) for r in fitting),
               "rounds_set_aside": sum(len(r["rounds_set_aside"]) for r in rows),
               "expert_imbalance_by_split": imbalance}
    print(json.dumps(summary, indent=1))
    benchlib.append_result(args.output, {"summary": summary, "rows": rows})
    plot(rows, os.path.join(os.path.dirname(args.output), "plan_vs_measured.png"))


if __name__ == "__main__":
    main()
