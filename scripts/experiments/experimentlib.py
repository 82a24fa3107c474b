"""What every experiment of scripts/experiments/experiments.py shares: the model sizes and lists of a run
(full or --tiny), progress lines, one training run, and a row of predicted and measured bytes."""
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))  # benchlib
import benchlib  # noqa: E402

MIB = 2.0 ** 20
STATES = ("params", "grads", "optimizer", "activations", "comm_buffers")
EXPERTS = 8  # per MoE layer


class Settings:
    """Model sizes and lists of an experiment run, full or tiny."""

    def __init__(self, args):
        self.tiny = args.tiny
        self.max_ranks = args.max_ranks
        self.layers, self.width, self.batch = (4, 16, 16) if args.tiny else (8, 1024, 256)
        self.steps = args.steps or (3 if args.tiny else 8)
        self.transport_device = args.transport_device
        self.warm_up = 1 if args.tiny else 2
        self.scratch = tempfile.mkdtemp(prefix="mlptrain-experiments-")

    def model(self, layers=None, batch=None, steps=None):
        return ["--dataset", "mixture", "--layers", layers or self.layers, "--hidden", self.width,
                "--input-dim", self.width, "--output-dim", 10, "--global-batch", batch or self.batch,
                "--steps", steps or self.steps]

    def moe_model(self, batch=None, steps=None):
        return self.model(batch=batch, steps=steps) + ["--moe-every", 2, "--experts", EXPERTS, "--top-k", 2]

    def world_sizes(self, limit=None):
        top = min(self.max_ranks, limit or self.max_ranks)
        return [n for n in (1, 2, 4, 8, 16) if n <= top]


class Progress:
    """Prints "run n of m" with the elapsed time and an estimate of what is left."""

    def __init__(self, experiment, total):
        self.experiment, self.total, self.done, self.started = experiment, total, 0, time.monotonic()

    def next(self, label):
        elapsed = time.monotonic() - self.started
        left = f", about {elapsed / self.done * (self.total - self.done):.0f} s left" if self.done else ""
        self.done += 1
        print(f"{self.experiment}: run {self.done} of {self.total}: {label} ({elapsed:.0f} s{left})",
              flush=True)


def train(settings, ranks, arguments, trace=None):
    """Runs mlptrain (pinned to cores where they fit); returns (median step_ms after the warm-up,
    summary)."""
    return benchlib.train(ranks, list(arguments) + (["--trace", trace] if trace else []), "experiment",
                          settings.warm_up, bind_to_cores=ranks <= (os.cpu_count() or 1))


def placement_row(summary):
    """Predicted and measured bytes by state and op from a run's summary."""
    return {"mode": {s: summary["placement"][s]["mode"] for s in STATES},
            "predicted_bytes": {s: summary["placement"][s]["predicted_bytes"] for s in STATES},
            "measured_bytes": summary["peak_mem_bytes_by_rank"][0],
            "comm_predicted_bytes": {op: c["predicted_bytes"] for op, c in summary["comm_per_step"].items()},
            "comm_measured_bytes": {op: c["measured_bytes"] for op, c in summary["comm_per_step"].items()}}


def run_all(settings, name, runs, measure):
    """Runs each (label, ranks, arguments, fields) through `measure`, which returns the row."""
    progress = Progress(name, len(runs))
    rows = []
    for label, ranks, arguments, fields in runs:
        progress.next(label)
        rows.append({"label": label, "ranks": ranks, **fields, **measure(ranks, arguments, fields)})
    return rows
