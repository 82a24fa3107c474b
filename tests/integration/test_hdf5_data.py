"""Training on a user's HDF5 file made from a CSV by scripts/datasets/csv_to_hdf5.py, with held-out
evaluation: the converter's layout, eval loss and accuracy in the metrics, learning beyond chance,
and the same numbers at one and two ranks."""
import os
import subprocess
import sys
import unittest

import h5py
import numpy as np

from common import SOURCE_ROOT, TrainingTestCase


class Hdf5Data(TrainingTestCase):
    def make_csv(self):
        """Three Gaussian blobs in 6 dimensions, 300 rows: features then the class label."""
        generator = np.random.default_rng(3)
        centres = generator.normal(0, 2.0, (3, 6))
        labels = generator.integers(0, 3, 300)
        features = centres[labels] + generator.normal(0, 1.0, (300, 6))
        path = self.path("blobs.csv")
        with open(path, "w") as handle:
            handle.write(",".join([f"f{i}" for i in range(6)] + ["label"]) + "\n")
            for row, label in zip(features, labels):
                handle.write(",".join(f"{value:.6f}" for value in row) + f",{label}\n")
        return path

    def test_convert_train_and_evaluate(self):
        csv = self.make_csv()
        data = self.path("blobs.h5")
        subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "datasets", "csv_to_hdf5.py"), csv,
                        data, "--test-fraction", "0.2", "--standardize", "--seed", "1"],
                       check=True, capture_output=True)
        with h5py.File(data, "r") as file:
            self.assertEqual(file["x"].shape, (240, 6))
            self.assertEqual(file["x"].dtype, np.float32)
            self.assertEqual(file["y"].shape, (240,))
            self.assertEqual(file["x_test"].shape, (60, 6))
            self.assertLess(abs(float(np.mean(file["x"][()]))), 1e-5)
        arguments = ["--dataset", "hdf5", "--data-path", data, "--layers", "3", "--hidden", "16",
                     "--global-batch", "24", "--steps", "60", "--eval-every", "20", "--lr", "1e-2",
                     "--shuffle", "--log-every", "0"]
        steps, summary, _ = self.train("one", arguments, 1)
        evaluated = [step for step in steps if "eval_loss" in step]
        self.assertEqual([step["step"] for step in evaluated], [20, 40, 60])
        self.assertGreater(evaluated[-1]["eval_accuracy"], 0.8)  # chance is 1/3
        self.assertLess(evaluated[-1]["eval_loss"], evaluated[0]["eval_loss"])
        two_steps, _, _ = self.train("two", arguments, 2)
        self.assert_losses_close(two_steps, steps)
        for mine, theirs in zip(two_steps, steps):
            if "eval_loss" in theirs:
                self.assertAlmostEqual(mine["eval_loss"], theirs["eval_loss"], delta=1e-5 * theirs["eval_loss"])
                self.assertEqual(mine["eval_accuracy"], theirs["eval_accuracy"])


if __name__ == "__main__":
    unittest.main()
