"""What the benchmark scripts (and the tests) share: where the build is, running mlptrain with a
metrics file, finding its ranks' processes, and writing a result file that names its command,
machine and date."""
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD = os.path.join(ROOT, "build")
PROGRAM = os.environ.get("MLPTRAIN", os.path.join(BUILD, "mlptrain"))
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


def train(ranks, arguments, name, warm_up_steps=2, bind_to_cores=False, launch=(), environment=None,
          teardown_limit_s=None, program=PROGRAM):
    """Runs mlptrain (or another build of it, `program`) at `ranks` ranks (each pinned to a core if
    asked; `launch`: more mpiexec options, `environment`: variables added to the benchmarks'); returns (median step_ms after
    the warm-up steps, or None when there are none, and the final summary record). A failing run
    ends the script with mlptrain's own output. With `teardown_limit_s`, a run still going that
    long after it started is ended, and counts as done if its summary was written: UCX's TCP
    transport can hang in MPI_Finalize after the work (openucx/ucx#8738, see test_network.py)."""
    metrics = metrics_path(name)
    if os.path.exists(metrics):
        os.remove(metrics)
    binding = ["-bind-to", "core"] if bind_to_cores else []
    launcher = subprocess.Popen(["mpiexec.mpich"] + binding + list(launch) + ["-n", str(ranks), program] +
                                [str(a) for a in arguments] + ["--log-every", "0", "--metrics", metrics],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=dict(ENVIRONMENT, **(environment or {})))
    try:
        output, errors = launcher.communicate(timeout=teardown_limit_s)
        failed = launcher.returncode != 0
    except subprocess.TimeoutExpired:
        launcher.kill()
        output, errors = launcher.communicate()
        for pid in rank_processes(metrics):
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        failed = not os.path.exists(metrics) or not read_records(name)[-1].get("summary")
    if failed:
        sys.exit(f"{os.path.basename(sys.argv[0])}: mlptrain {' '.join(map(str, arguments))} at {ranks} "
                 f"rank(s) failed:\n{output}{errors}")
    records = read_records(name)
    step_ms = [r["step_ms"] for r in records if not r.get("summary")][warm_up_steps:]
    return (statistics.median(step_ms) if step_ms else None), records[-1]


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
