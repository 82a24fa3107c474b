"""Helpers of the end-to-end tests: run mlptrain under mpiexec, read its metrics and checkpoints.
The programs' locations come from the environment that `meson test` sets."""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

import numpy as np

try:
    import h5py
except ImportError:  # a machine without h5py (a bare GPU machine) reads through the HDF5 tools
    h5py = None

MLPTRAIN = os.environ.get("MLPTRAIN", "build/mlptrain")
SOURCE_ROOT = os.environ.get("MLPTRAIN_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))
MPIEXEC = shutil.which("mpiexec.mpich") or "mpiexec"

# The scripts the tests drive as modules: the benchmarks' library and the experiments.
for folder in ("bench", "experiments"):
    sys.path.insert(0, os.path.join(SOURCE_ROOT, "scripts", folder))
from benchlib import rank_processes  # noqa: E402  (shared with the soak script)
RELATIVE_TOLERANCE = 1e-5


def command(arguments, ranks=1):
    return [MPIEXEC, "-n", str(ranks), MLPTRAIN] + [str(a) for a in arguments]


def run(arguments, ranks=1, timeout=300, check=True, environment=None):
    """Runs mlptrain (with extra environment variables if given); returns the CompletedProcess."""
    environment = dict(os.environ, OMP_NUM_THREADS="1", **(environment or {}))
    result = subprocess.run(command(arguments, ranks), capture_output=True, text=True,
                            timeout=timeout, env=environment)
    if check and result.returncode != 0:
        raise AssertionError(f"mlptrain {' '.join(map(str, arguments))} at {ranks} ranks failed "
                             f"({result.returncode}):\n{result.stdout}\n{result.stderr}")
    return result


@contextlib.contextmanager
def background_run(arguments, ranks=2, capture=False):
    """mlptrain started in the background for a test to interrupt (its output captured as text, or
    dropped); killed if it still runs when the block ends."""
    output = subprocess.PIPE if capture else subprocess.DEVNULL
    launcher = subprocess.Popen(command(arguments, ranks), stdout=output, stderr=output, text=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1"))
    try:
        yield launcher
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def wait_until(ready, seconds=60):
    """Polls `ready` until it holds or `seconds` pass."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not ready():
        time.sleep(0.02)


def kill_a_rank(test, launcher, marker):
    """SIGKILL to the last of the two ranks whose command line holds `marker`: the whole job must
    end, non-zero, within 30 s."""
    ranks = rank_processes(marker)
    test.assertEqual(len(ranks), 2)
    os.kill(ranks[-1], signal.SIGKILL)
    killed = time.monotonic()
    launcher.wait(timeout=30)
    test.assertLess(time.monotonic() - killed, 30)
    test.assertNotEqual(launcher.returncode, 0)


def gpu_refusal():
    """mlptrain's own answer to --device cuda here: None when it trains, else (exit code, message)."""
    result = run(["--device", "cuda", "--steps", 1, "--log-every", 0], check=False, timeout=120)
    return None if result.returncode == 0 else (result.returncode, result.stderr.strip())


def read_metrics(path):
    """Returns (step records, summary record) of a metrics file."""
    with open(path) as handle:
        records = [json.loads(line) for line in handle if line.strip()]
    steps = [record for record in records if not record.get("summary")]
    summaries = [record for record in records if record.get("summary")]
    return steps, (summaries[0] if summaries else None)


def read_checkpoint(path):
    """Every dataset of a checkpoint as a numpy array, keyed by its full name."""
    if h5py is None:
        return read_checkpoint_with_tools(path)
    tensors = {}
    with h5py.File(path, "r") as file:
        file.visititems(lambda name, item: tensors.__setitem__(name, item[()])
                        if isinstance(item, h5py.Dataset) else None)
    return tensors


def read_checkpoint_with_tools(path):
    """read_checkpoint through h5ls and h5dump: every dataset of a checkpoint is float32 (the
    master weights and the optimizer's moments), dumped raw in little-endian order."""
    listing = subprocess.run(["h5ls", "-r", path], capture_output=True, text=True, check=True).stdout
    tensors = {}
    with tempfile.TemporaryDirectory() as scratch:
        for line in listing.splitlines():
            name, _, kind = line.partition(" ")
            if not kind.strip().startswith("Dataset"):
                continue
            shape = tuple(int(size) for size in kind.split("{", 1)[1].rstrip("}").split(",") if size.strip())
            raw = os.path.join(scratch, "dataset.bin")
            subprocess.run(["h5dump", "-d", name, "-b", "LE", "-o", raw, path], capture_output=True, check=True)
            tensors[name.lstrip("/")] = np.fromfile(raw, dtype="<f4").reshape(shape)
    return tensors


class TrainingTestCase(unittest.TestCase):
    """A test case with a scratch directory and a helper to train and collect results."""

    def setUp(self):
        self.directory = tempfile.mkdtemp(prefix="mlptrain-test-")

    def tearDown(self):
        shutil.rmtree(self.directory, ignore_errors=True)

    def path(self, name):
        return os.path.join(self.directory, name)

    def train(self, name, arguments, ranks=1, environment=None):
        """Trains with a metrics file and a checkpoint directory named `name`; returns
        (step records, summary, tensors of the final checkpoint)."""
        metrics = self.path(name + ".jsonl")
        checkpoints = self.path(name)
        run(list(arguments) + ["--metrics", metrics, "--checkpoint-dir", checkpoints], ranks,
            environment=environment)
        steps, summary = read_metrics(metrics)
        with open(os.path.join(checkpoints, "latest")) as handle:
            final = os.path.join(checkpoints, handle.read().strip())
        return steps, summary, read_checkpoint(final)

    def assert_layouts_reproduce_one_process(self, model, layouts, steps, check=None):
        """Each (ranks, flags) layout against one process with the same micro-batches (an MoE
        layer's balancing loss is per micro-batch): losses, gradient norms and the final
        checkpoint within the fp32 tolerance; memory as predicted, and every group's bytes by
        operation as predicted (the world's sums are the loop's own and a checkpoint's; a run that
        evaluates also measures evaluation's bytes, which no step predicts). `check(flags,
        summary)` adds the caller's assertions. Returns the summaries by (ranks, flags)."""
        model = list(model) + ["--steps", str(steps)]
        references, results = {}, {}
        for ranks, flags in layouts:
            with self.subTest(ranks=ranks, flags=flags):
                micro_batches = flags[flags.index("--micro-batches") + 1] if "--micro-batches" in flags else "1"
                if micro_batches not in references:
                    references[micro_batches] = self.train(f"one{micro_batches}", model + ["--micro-batches", micro_batches], 1)
                reference_steps, _, reference = references[micro_batches]
                steps_seen, summary, tensors = self.train(f"r{ranks}" + "".join(flags), model + flags, ranks)
                self.assert_losses_close(steps_seen, reference_steps)
                self.assert_tensors_close(tensors, reference)
                self.assert_predicted(summary)
                measured, predicted = summary["comm_bytes_by_group"], summary["predicted_comm_bytes_by_group"]
                for group in ((set(measured) | set(predicted)) - {"world"}) if "--eval-every" not in flags else ():
                    for op in set(measured.get(group, {})) | set(predicted.get(group, {})):
                        self.assertAlmostEqual(measured.get(group, {}).get(op, 0), predicted.get(group, {}).get(op, 0),
                                               delta=0.01 * predicted.get(group, {}).get(op, 1), msg=f"{group} {op}")
                if check is not None:
                    check(flags, summary)
                results[ranks, tuple(flags)] = summary
        return results

    def assert_predicted(self, summary):
        """The summary's model states and communication buffers exactly as predicted, each operation's bytes within 1 %."""
        for state in ("params", "grads", "optimizer", "comm_buffers"):
            placement = summary["placement"][state]
            self.assertEqual(placement["predicted_bytes"], placement["measured_bytes"], state)
        for op, comm in summary["comm_per_step"].items():
            self.assertLessEqual(abs(comm["predicted_bytes"] - comm["measured_bytes"]),
                                 0.01 * comm["measured_bytes"], op)

    def assert_losses_close(self, steps, reference, tolerance=RELATIVE_TOLERANCE):
        self.assertEqual([s["step"] for s in steps], [s["step"] for s in reference])
        for mine, theirs in zip(steps, reference):
            for key in ("loss", "grad_norm", "eval_loss"):
                if key not in theirs:
                    continue
                self.assertLessEqual(abs(mine[key] - theirs[key]), tolerance * abs(theirs[key]),
                                     f"{key} of step {mine['step']}: {mine[key]} vs {theirs[key]}")

    def assert_tensors_close(self, tensors, reference, tolerance=RELATIVE_TOLERANCE):
        """Each tensor within `tolerance` relative error (L2 norm of the difference over the L2
        norm of the reference), and no element off by more than 10 x that of the tensor's scale.
        Elementwise relative error is no measure here: AdamW divides each element's step by its
        own gradient history, so an element whose gradient is nearly zero turns the rounding of a
        different summation order (other ranks, other micro-batches) into a visible change."""
        self.assertEqual(sorted(tensors), sorted(reference))
        for name, expected in reference.items():
            expected = expected.astype(np.float64)
            difference = tensors[name].astype(np.float64) - expected
            norm = float(np.linalg.norm(expected)) or 1.0
            relative = float(np.linalg.norm(difference)) / norm
            self.assertLessEqual(relative, tolerance, f"{name}: relative error {relative}")
            scale = float(np.max(np.abs(expected))) or 1.0
            largest = float(np.max(np.abs(difference)))
            self.assertLessEqual(largest, 10 * tolerance * scale,
                                 f"{name}: largest difference {largest} vs scale {scale}")

    def assert_resumes_across_layouts(self, base, moves, steps):
        """Half of a run written under one layout and resumed under another to `steps` equals the
        uninterrupted one-process run. `moves`: (writer flags, writer ranks, reader flags, reader
        ranks) tuples."""
        half = steps // 2
        full_steps, _, full = self.train("uninterrupted", list(base) + ["--steps", steps], 1)
        for index, (writer, writer_ranks, reader, reader_ranks) in enumerate(moves):
            with self.subTest(writer=writer, reader=reader):
                written = self.path(f"written{index}")
                run(list(base) + ["--steps", half, "--checkpoint-dir", written] + writer, writer_ranks)
                metrics = self.path(f"resumed{index}.jsonl")
                resumed = self.path(f"resumed{index}")
                run(list(base) + ["--steps", steps, "--resume", written, "--metrics", metrics,
                                  "--checkpoint-dir", resumed] + reader, reader_ranks)
                resumed_steps, _ = read_metrics(metrics)
                self.assert_losses_close(resumed_steps, full_steps[half:])
                self.assert_tensors_close(
                    read_checkpoint(os.path.join(resumed, f"step_{steps:08d}.h5")), full)
