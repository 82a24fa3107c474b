"""The experiment scripts end to end on tiny models: every experiment reports its progress, writes
a JSON Lines file whose rows carry the fields its plot and README table need and a PNG plot; the
memory experiment's predicted model state equals the measured one; PyTorch's comparison runs
where PyTorch is installed and is refused with one line where it is not; MPI against NCCL runs
where a GPU is present, is skipped with the reason where none is, and runs its MPI half on the
loopback device when asked. The scaling experiment keeps the layouts mlptrain accepts (asked of
mlpplan). The comparison of two builds times every layout in both."""
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import types
import unittest

from common import MLPTRAIN, SOURCE_ROOT, TrainingTestCase

import experiments  # noqa: E402  (common puts scripts/ on the path)
from benchlib import layout_problem  # noqa: E402
from experimentlib import Settings  # noqa: E402

SCRIPT = os.path.join(SOURCE_ROOT, "scripts", "experiments", "experiments.py")
FIELDS = {"scaling": {"kind", "strategy", "ranks", "step_ms", "speedup", "efficiency"},
          "memory": {"zero", "ranks", "predicted_bytes", "measured_bytes", "mode"},
          "comm": {"layout", "ranks", "comm_predicted_bytes", "comm_measured_bytes"},
          "pipeline": {"schedule", "micro_batches", "bubble", "ideal_bubble", "stage0_activation_bytes"},
          "recompute": {"layers", "recompute", "activation_bytes", "step_ms"},
          "pytorch": {"peer", "width", "ranks", "step_ms"},
          "transport": {"part", "ranks"}}


def torch_available():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


def gpu_usable():
    return subprocess.run([MLPTRAIN, "--device", "cuda", "--steps", "1", "--log-every", "0"],
                          capture_output=True).returncode == 0


class Experiments(TrainingTestCase):
    def experiments(self, *arguments):
        # Two ranks at most: the machine running the tests may have no more cores.
        return subprocess.run([sys.executable, SCRIPT, *arguments, "--tiny", "--max-ranks", "2",
                               "--output-dir", self.directory],
                              capture_output=True, text=True, timeout=600)

    def rows(self, name):
        with open(self.path(name + ".jsonl")) as handle:
            return [json.loads(line) for line in handle]

    def test_every_experiment_writes_rows_and_a_plot(self):
        result = self.experiments("all")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        names = [name for name in FIELDS if (name != "pytorch" or torch_available()) and
                 (name != "transport" or gpu_usable())]
        for name in names:
            with self.subTest(experiment=name):
                self.assertIn(f"{name}: run 1 of ", result.stdout)
                rows = self.rows(name)
                self.assertGreater(len(rows), 1)
                for row in rows:
                    self.assertLessEqual(FIELDS[name] | {"date", "machine", "command"}, set(row))
                with open(self.path(name + ".png"), "rb") as handle:
                    self.assertEqual(handle.read(8), b"\x89PNG\r\n\x1a\n")
        for row in self.rows("memory"):
            for state in ("params", "grads", "optimizer", "comm_buffers"):
                self.assertEqual(row["predicted_bytes"][state], row["measured_bytes"][state])
        for row in self.rows("pipeline"):
            self.assertAlmostEqual(row["ideal_bubble"], 1 / (row["micro_batches"] + 1))
            self.assertTrue(0 <= row["bubble"] < 1)
        recompute = {(r["layers"], r["recompute"]): r for r in self.rows("recompute")}
        self.assertLess(recompute[(8, True)]["activation_bytes"], recompute[(8, False)]["activation_bytes"])
        if not torch_available():
            self.assertIn("skipping pytorch", result.stdout)
            self.assertFalse(os.path.exists(self.path("pytorch.jsonl")))
            refused = self.experiments("pytorch")
            self.assertNotEqual(refused.returncode, 0)
            self.assertIn("needs PyTorch", refused.stderr)
        if "transport" not in names:
            self.assertIn("skipping transport: it needs a GPU: mlptrain: error: --device cuda", result.stdout)
            refused = self.experiments("transport")
            self.assertNotEqual(refused.returncode, 0)
            self.assertEqual(refused.stderr.count("\n"), 1, refused.stderr)
            self.assertIn("transport needs a GPU", refused.stderr)

    def test_transport_runs_its_mpi_half_on_the_loopback_device(self):
        result = self.experiments("transport", "--transport-device", "loopback")
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertIn("transport: no NCCL runs: mlptrain: error: --comm nccl", result.stdout)
        rows = self.rows("transport")
        benched = {(r["path"], r["ranks"]) for r in rows if r["part"] == "commbench"}
        self.assertEqual(benched, {("mpi-host", 1), ("mpi-host", 2), ("mpi-staged", 1), ("mpi-staged", 2)})
        for row in rows:
            if row["part"] == "commbench":
                self.assertEqual([p["bytes"] for p in row["points"]], [1024, 4096, 16384, 65536])
                self.assertTrue(all(p["correct"] and p["algbw_gbps"] > 0 for p in row["points"]))
        trained = [r for r in rows if r["part"] == "training"]
        self.assertEqual({r["comm"] for r in trained}, {"mpi"})
        self.assertEqual(len(trained), 5)
        self.assertTrue(all(r["step_ms"] > 0 for r in trained))
        with open(self.path("transport.png"), "rb") as handle:
            self.assertEqual(handle.read(8), b"\x89PNG\r\n\x1a\n")


class ScalingLayouts(unittest.TestCase):
    def setUp(self):
        self.settings = Settings(types.SimpleNamespace(tiny=True, max_ranks=16, steps=0, transport_device=None))
        self.addCleanup(shutil.rmtree, self.settings.scratch, ignore_errors=True)

    def test_fits_keeps_what_mlptrain_accepts(self):
        # The tiny model: 4 layers 16 wide, a batch of 16, MoE layers of 8 experts.
        model, moe_model = self.settings.model(), self.settings.moe_model()
        for ranks, layout in ((4, ["--pp", 4, "--micro-batches", 8]), (16, ["--tp", 16]), (8, ["--ep", 8])):
            with self.subTest(ranks=ranks, layout=layout):
                self.assertTrue(experiments.fits(moe_model if "--ep" in layout else model, ranks, layout))
        refusals = [(model, 8, ["--pp", 8, "--micro-batches", 16], "--pp 8 needs at least one layer per stage"),
                    (moe_model, 16, ["--ep", 16], "--experts 8 is not divisible by --ep 16"),
                    (model, 16, ["--pp", 2, "--micro-batches", 4], "is not divisible by dp 8")]
        for options, ranks, layout, line in refusals:
            with self.subTest(ranks=ranks, layout=layout):
                self.assertFalse(experiments.fits(options, ranks, layout))
                self.assertIn(line, layout_problem(ranks, options + layout))


class BuildComparison(unittest.TestCase):
    """scripts/bench/builds.py against a baseline that is this build: each layout timed in both
    builds every round, the ratio the one of their medians, the run appended to its history with
    the baseline's tree."""

    def test_both_builds_time_every_layout(self):
        folder = tempfile.mkdtemp(prefix="mlptrain-builds-")
        self.addCleanup(shutil.rmtree, folder, ignore_errors=True)
        history = os.path.join(folder, "build_comparisons.jsonl")
        for run in (1, 2):
            result = subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "bench", "builds.py"),
                                     "--baseline", MLPTRAIN, "--rounds", "2", "--steps", "4", "--layouts", "2",
                                     "--output", history], capture_output=True, text=True, timeout=600,
                                    env=dict(os.environ, MLPTRAIN=os.path.abspath(MLPTRAIN)))
            self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        with open(history) as handle:
            runs = [json.loads(line) for line in handle]
        self.assertEqual([r["run"] for r in runs], [1, 2])
        rows = runs[-1]["layouts"]
        self.assertEqual([(r["layout"], r["ranks"]) for r in rows], [("one process", 1), ("--dp 2", 2)])
        for row in rows:
            self.assertEqual((len(row["this"]), len(row["baseline"])), (2, 2))
            self.assertAlmostEqual(row["this_over_baseline"],
                                   statistics.median(row["this"]) / statistics.median(row["baseline"]))
        self.assertTrue(runs[-1]["baseline_tree"])


if __name__ == "__main__":
    unittest.main()
