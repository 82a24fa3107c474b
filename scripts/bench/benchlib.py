"""What the benchmark scripts (and the tests) share: where the build is, running mlptrain with a
metrics file, asking mlpplan whether mlptrain accepts a layout, finding its ranks' processes, and
writing a result file that names its command, machine and date."""
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BUILD = os.path.join(ROOT, "build")
PROGRAM = os.environ.get("MLPTRAIN", os.path.join(BUILD, "mlptrain"))
# The placement calculator built beside that mlptrain: it validates mlptrain's options with
# mlptrain's own validator, as one process for any world size.
PLANNER = os.path.join(os.path.dirname(os.path.abspath(PROGRAM)), "mlpplan")
# One GEMM thread per rank (oneDNN threads with OpenMP; the PyTorch peer computes with OpenBLAS).
ENVIRONMENT = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")


def arguments(description, rounds, steps, result_file):
    """The options every benchmark takes; callers may add their own before parsing."""
    import argparse
    parser = argparse.ArgumentParser(description=description,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--output", default=os.path.join(ROOT, "results", result_file))
    return parser


def metrics_path(name):
    """Where train() keeps the metrics of the run it calls `name`."""
    return os.path.join(os.path.dirname(PROGRAM), f"bench-{name}.jsonl")


def read_records(name):
    """The metrics records of the run train() called `name`."""
    with open(metrics_path(name)) as handle:
        return [json.loads(line) for line in handle]


TEARDOWN_GUARD_LINE = "MPI_Finalize has not returned"


def ended_in_teardown(errors, summary_written):
    """Whether a run that exited non-zero did only because its teardown hung: UCX's TCP transport
    can hang in MPI_Finalize after the work (openucx/ucx#8738); the programs then end each rank
    after a grace period, saying so (comm/finalize_guard.hpp), and mpiexec may report that as a
    failure. The guard starts only once every rank's work is done, so with the summary written
    the run counts as done."""
    return summary_written and TEARDOWN_GUARD_LINE in errors


def train(ranks, arguments, name, warm_up_steps=2, bind_to_cores=False, launch=(), environment=None,
          program=PROGRAM):
    """Runs mlptrain (or another build of it, `program`) at `ranks` ranks (each pinned to a core if
    asked; `launch`: more mpiexec options, `environment`: variables added to the benchmarks'); returns (median step_ms after
    the warm-up steps, or None when there are none, and the final summary record). A failing run
    ends the script with mlptrain's own output; one whose only failure was a hung teardown
    (ended_in_teardown) counts as done."""
    metrics = metrics_path(name)
    if os.path.exists(metrics):
        os.remove(metrics)
    binding = ["-bind-to", "core"] if bind_to_cores else []
    result = subprocess.run(["mpiexec.mpich"] + binding + list(launch) + ["-n", str(ranks), program] +
                            [str(a) for a in arguments] + ["--log-every", "0", "--metrics", metrics],
                            capture_output=True, text=True, env=dict(ENVIRONMENT, **(environment or {})))
    output, errors = result.stdout, result.stderr
    summary_written = os.path.exists(metrics) and bool(read_records(name)) and bool(read_records(name)[-1].get("summary"))
    failed = result.returncode != 0 and not ended_in_teardown(errors, summary_written)
    if failed:
        sys.exit(f"{os.path.basename(sys.argv[0])}: mlptrain {' '.join(map(str, arguments))} at {ranks} "
                 f"rank(s) failed:\n{output}{errors}")
    records = read_records(name)
    step_ms = [r["step_ms"] for r in records if not r.get("summary")][warm_up_steps:]
    return (statistics.median(step_ms) if step_ms else None), records[-1]


def layout_problem(world, options):
    """None when mlptrain accepts `options` on `world` ranks, else mlpplan's one line saying why
    not. The scripts ask instead of re-coding the layout rules, which live in mlptrain's validation."""
    result = subprocess.run([PLANNER, "--world", str(world), "--layouts", "given"] + [str(option) for option in options],
                            capture_output=True, text=True)
    if result.returncode == 0:
        return None
    lines = result.stderr.strip().splitlines()
    return lines[-1] if lines else f"mlpplan exited with {result.returncode}"


def valid_layouts(world, model, micro_batch_choices=()):
    """Every layout mlptrain accepts on `world` ranks for `model` (its options without the
    parallel ones), each as the `layout` object of mlpplan --layouts all --json: dp, tp, pp, ep,
    zero, zero_shard_size, schedule, virtual_stages, micro_batches (one of `micro_batch_choices`,
    else the model's), recompute, sequence_parallel and offload. One process answers for the whole
    world, where asking layout_problem() of each candidate would launch one per candidate. An
    empty list when no layout is valid; a ValueError with mlpplan's line when the model itself is
    refused whatever the layout."""
    command = [PLANNER, "--world", str(world), "--layouts", "all", "--json", "--top", "0"]
    if micro_batch_choices:
        command += ["--micro-batch-choices", ",".join(str(count) for count in micro_batch_choices)]
    result = subprocess.run(command + [str(option) for option in model], capture_output=True, text=True)
    if result.returncode != 0:
        # mlpplan refuses both a model wrong at any size and a world no layout suits; one process
        # with no parallel options tells them apart (the same check mlpplan makes first).
        problem = layout_problem(1, model)
        if problem is not None:
            raise ValueError(problem)
        return []
    return [json.loads(line)["layout"] for line in result.stdout.splitlines() if line.startswith("{")]


def interleaved_rounds(rounds, layouts, run):
    """Runs `run(name, flags)` -> (step_ms, summary) for every layout of `layouts` ({name:
    flags}), one round after another, so that the machine's drift falls on every layout alike.
    Returns ({name: step_ms of each round}, {name: the last round's summary})."""
    step_ms = {name: [] for name in layouts}
    summaries = {}
    for round_index in range(rounds):
        print(f"bench: round {round_index + 1} of {rounds}", flush=True)
        for name, flags in layouts.items():
            time_ms, summaries[name] = run(name, flags)
            step_ms[name].append(time_ms)
    return step_ms, summaries


def host_cpu_ticks():
    """(all, stolen) ticks of the host's CPUs so far, from /proc/stat's first line (steal: time a
    hypervisor gave the virtual CPUs to someone else); (0, 0) where there is no /proc/stat."""
    try:
        with open("/proc/stat") as handle:
            fields = [int(field) for field in handle.readline().split()[1:]]
    except OSError:
        return 0, 0
    return sum(fields[:8]), fields[7] if len(fields) > 7 else 0


def with_cpu_share(call, cores=None):
    """Runs call() (which waits for the processes it starts) and returns (its result, the share of
    the machine's cores its processes got): their CPU seconds over the wall seconds times the
    cores, less the part of that time the hypervisor stole from the machine (which a guest counts
    as its own). On a shared host a run that got markedly less than another of the same command
    waited for its neighbours, not for its own work."""
    cores = cores or os.cpu_count() or 1
    before, start, ticks = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter(), host_cpu_ticks()
    result = call()
    after, wall = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter() - start
    all_ticks, stolen_ticks = (now - then for now, then in zip(host_cpu_ticks(), ticks))
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    stolen = stolen_ticks / all_ticks if all_ticks > 0 else 0.0
    return result, (cpu / (wall * cores) if wall > 0 else 0.0) * (1 - stolen)


def quiet_rounds(values, shares, least=0.85):
    """The values of the rounds whose CPU share is at least `least` of the best round's, and the
    indices of those set aside."""
    best = max(shares)
    kept = [value for value, share in zip(values, shares) if share >= least * best]
    return kept, [index for index, share in enumerate(shares) if share < least * best]


def ledger_disagreements(plan, summary, states, routed_ops=()):
    """Where mlpplan's plan (its --json line) differs from a run's ledger (mlptrain's summary
    record): each of `states`' bytes exactly, each operation's bytes per step within 1 % (25 % for
    `routed_ops`, whose bytes follow the routing). One line per difference."""
    problems = []
    for state in states:
        measured = summary["placement"][state]["measured_bytes"]
        if plan["memory_bytes"][state] != measured:
            problems.append(f"{state}: planned {plan['memory_bytes'][state]}, measured {measured}")
    for op, entry in summary["comm_per_step"].items():
        planned, measured = plan["comm_bytes_per_step"][op], entry["measured_bytes"]
        if abs(planned - measured) > (0.25 if op in routed_ops else 0.01) * max(measured, 1):
            problems.append(f"{op}: planned {planned} bytes, measured {measured}")
    return problems


def program_list(what):
    """A list the programs know (`mlpplan --list WHAT --json`: schedules, strategies, datasets,
    devices, presets, options), one dict an entry: scripts read names from the code that defines
    them rather than copy them."""
    output = subprocess.run([PLANNER, "--list", what, "--json"], capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def run_json(command):
    """The JSON objects a program prints, one per line."""
    output = subprocess.run(command, capture_output=True, text=True, check=True, env=ENVIRONMENT).stdout
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def cpu_model():
    """The CPU's name and family/model numbers, as /proc/cpuinfo gives them."""
    fields = {}
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor()
    return f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, model {fields.get('model', '?')})"


def stamp():
    """The date, machine (with its CPU model: the hardware behind a machine kind changes) and
    command of this run."""
    return {"date": datetime.date.today().isoformat(),
            "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.node()}",
            "cpu": cpu_model(),
            "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:])}


def tree():
    """The commit the tree is at, "-dirty" where it has changes beside it."""
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return head.stdout.strip() + ("-dirty" if dirty else "")


def append_result(path, result):
    """Appends `result` to a run history (JSON Lines, one run a line, numbered in order), with the
    command, machine, date and tree that made it. Returns its number."""
    number = 1
    if os.path.exists(path):
        with open(path) as handle:
            number += sum(1 for line in handle if line.strip())
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a") as handle:
        handle.write(json.dumps({"run": number, **stamp(), "tree": tree(), **result}) + "\n")
    print(f"bench: appended run {number} to {path}")
    return number


def write_result(path, result):
    """Writes `result` with the command, machine and date that made it."""
    stamped = {**stamp(), **result}
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as handle:
        json.dump(stamped, handle, indent=2)
    print(f"bench: wrote {path}")


def rank_processes(marker):
    """Process ids of the running mlptrain ranks whose command line contains `marker`."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/comm") as handle:
                name = handle.read().strip()
            with open(f"/proc/{entry}/cmdline", "rb") as handle:
                command = handle.read().decode(errors="replace")
        except OSError:
            continue
        if name == "mlptrain" and marker in command:
            found.append(int(entry))
    return sorted(found)
