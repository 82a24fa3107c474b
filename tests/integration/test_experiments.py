"""The experiment scripts end to end on tiny models: every experiment reports its progress, writes
a JSON Lines file whose rows carry the fields its plot and README table need and a PNG plot; the
memory experiment's predicted model state equals the measured one; PyTorch's comparison runs
where PyTorch is installed and is refused with one line where it is not."""
import json
import os
import subprocess
import sys
import unittest

from common import SOURCE_ROOT, TrainingTestCase

SCRIPT = os.path.join(SOURCE_ROOT, "scripts", "experiments.py")
FIELDS = {"scaling": {"kind", "strategy", "ranks", "step_ms", "speedup", "efficiency"},
          "memory": {"zero", "ranks", "predicted_bytes", "measured_bytes", "mode"},
          "comm": {"layout", "ranks", "comm_predicted_bytes", "comm_measured_bytes"},
          "pipeline": {"schedule", "micro_batches", "bubble", "ideal_bubble", "stage0_activation_bytes"},
          "recompute": {"layers", "recompute", "activation_bytes", "step_ms"},
          "pytorch": {"peer", "width", "ranks", "step_ms"}}


def torch_available():
    return subprocess.run([sys.executable, "-c", "import torch"], capture_output=True).returncode == 0


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
        names = [name for name in FIELDS if name != "pytorch" or torch_available()]
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
            for state in ("params", "grads", "optimizer"):
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


if __name__ == "__main__":
    unittest.main()
