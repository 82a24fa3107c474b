"""Non-finite losses and gradients: a sample whose inputs and targets sit at the edge of float32's
range (finite: data that is not finite is refused when the file opens) overflows its step's
forward or weight gradients. By default every rank stops at that step with one clear line and exit code 1, and the
checkpoints before it are all there and finite; with --on-nan skip the step's update is skipped
(parameters and optimizer state stay exactly as they were) and training goes on."""
import os
import subprocess
import unittest

import h5py
import numpy as np

from common import MLPTRAIN, MPIEXEC, TrainingTestCase, read_checkpoint, read_metrics

BATCH, BAD_SAMPLE = 8, 21  # the bad sample is in the third step's batch (samples 16..23)


class NonFinite(TrainingTestCase):
    def setUp(self):
        super().setUp()
        generator = np.random.default_rng(5)
        inputs = generator.normal(0, 1, (256, 6)).astype(np.float32)
        targets = generator.normal(0, 1, (256, 3)).astype(np.float32)
        inputs[BAD_SAMPLE, :] = 3e38
        targets[BAD_SAMPLE, :] = -3e38
        self.data = self.path("data.h5")
        with h5py.File(self.data, "w") as file:
            file["x"] = inputs
            file["y"] = targets
        self.arguments = ["--dataset", "hdf5", "--data-path", self.data, "--layers", "4", "--hidden", "16",
                          "--global-batch", BATCH, "--log-every", "0", "--save-every", "1"]

    def launch(self, extra, ranks, name):
        checkpoints = self.path(name)
        metrics = self.path(name + ".jsonl")
        result = subprocess.run([MPIEXEC, "-n", str(ranks), MLPTRAIN] + [str(a) for a in self.arguments + extra]
                                + ["--checkpoint-dir", checkpoints, "--metrics", metrics],
                                capture_output=True, text=True, timeout=120)
        return result, checkpoints, metrics

    def test_stops_at_the_bad_step_and_keeps_the_checkpoints_before_it(self):
        for ranks, extra in ((1, []), (2, []), (2, ["--grad-clip", "1"]), (2, ["--pp", "2"])):
            with self.subTest(ranks=ranks, extra=extra):
                name = f"stop{ranks}{len(extra)}{'pp' if '--pp' in extra else ''}"
                result, checkpoints, _ = self.launch(["--steps", "6"] + extra, ranks, name)
                self.assertEqual(result.returncode, 1, result.stderr)
                errors = [line for line in result.stderr.splitlines() if line.strip()]
                self.assertEqual(len(errors), 1, result.stderr)
                self.assertIn("step 3: the loss is", errors[0])
                self.assertIn("not finite", errors[0])
                self.assertIn("--on-nan skip", errors[0])
                self.assertEqual(sorted(name for name in os.listdir(checkpoints) if name.endswith(".h5")),
                                 ["step_00000001.h5", "step_00000002.h5"])
                with open(os.path.join(checkpoints, "latest")) as handle:
                    self.assertEqual(handle.read().strip(), "step_00000002.h5")
                for tensor in read_checkpoint(os.path.join(checkpoints, "step_00000002.h5")).values():
                    self.assertTrue(np.all(np.isfinite(tensor)))

    def test_skip_leaves_the_state_as_it_was_and_goes_on(self):
        for ranks, extra in ((1, []), (2, ["--zero", "1"])):
            with self.subTest(ranks=ranks, extra=extra):
                name = f"skip{ranks}"
                result, checkpoints, metrics = self.launch(["--steps", "5", "--on-nan", "skip"] + extra,
                                                           ranks, name)
                self.assertEqual(result.returncode, 0, result.stderr)
                steps, _ = read_metrics(metrics)
                self.assertEqual([bool(step.get("skipped")) for step in steps], [False, False, True, False, False])
                for step in steps:
                    if not step.get("skipped"):
                        self.assertTrue(np.isfinite(step["loss"]) and np.isfinite(step["grad_norm"]))
                before = read_checkpoint(os.path.join(checkpoints, "step_00000002.h5"))
                after = read_checkpoint(os.path.join(checkpoints, "step_00000003.h5"))
                for tensor_name, values in before.items():
                    self.assertTrue(np.array_equal(after[tensor_name], values), tensor_name)
                final = read_checkpoint(os.path.join(checkpoints, "step_00000005.h5"))
                self.assertFalse(np.array_equal(final["model/layers/00/weight"], before["model/layers/00/weight"]))
                for tensor in final.values():
                    self.assertTrue(np.all(np.isfinite(tensor)))


if __name__ == "__main__":
    unittest.main()
