"""Checkpoints continue runs exactly: 10 steps, save, resume to 20 equals 20 uninterrupted steps
bit for bit (data position, schedule and optimizer state included), and a 2-rank checkpoint
resumes in one process, and the other way round."""
import os
import unittest

import numpy as np

from common import TrainingTestCase, read_checkpoint, read_metrics, run

# A constant schedule after warm-up: a run of --steps 10 is then the first half of one of 20 (a
# cosine schedule spans --steps, so it is checked by resuming a checkpoint taken mid-run).
ARGUMENTS = ["--dataset", "mixture", "--input-dim", "10", "--output-dim", "4", "--layers", "4",
             "--hidden", "20", "--global-batch", "16", "--log-every", "0", "--shuffle",
             "--warmup-steps", "4", "--grad-clip", "1.0"]
COSINE = ["--lr-schedule", "cosine"]


class Resume(TrainingTestCase):
    def resume(self, name, checkpoint, ranks, steps=20, extra=()):
        metrics = self.path(name + ".jsonl")
        directory = self.path(name)
        run(ARGUMENTS + list(extra) + ["--steps", steps, "--resume", checkpoint, "--metrics", metrics,
                         "--checkpoint-dir", directory], ranks)
        records, _ = read_metrics(metrics)
        return records, read_checkpoint(os.path.join(directory, "step_%08d.h5" % steps))

    def test_resume_is_bit_for_bit(self):
        full_steps, _, full = self.train("full", ARGUMENTS + ["--steps", "20"], 2)
        half_steps, _, _ = self.train("half", ARGUMENTS + ["--steps", "10"], 2)
        self.assertEqual([s["step"] for s in half_steps], list(range(1, 11)))
        resumed_steps, resumed = self.resume("resumed", self.path("half"), 2)
        self.assertEqual([s["step"] for s in resumed_steps], list(range(11, 21)))
        for mine, theirs in zip(resumed_steps, full_steps[10:]):
            self.assertEqual((mine["loss"], mine["grad_norm"], mine["lr"]),
                             (theirs["loss"], theirs["grad_norm"], theirs["lr"]))
        self.assertEqual(sorted(resumed), sorted(full))
        for name in full:
            self.assertTrue(np.array_equal(resumed[name], full[name]), name)

    def test_resume_mid_run_with_cosine_schedule(self):
        full_steps, _, full = self.train("full", ARGUMENTS + COSINE + ["--steps", "20", "--save-every", "10"], 2)
        middle = os.path.join(self.path("full"), "step_00000010.h5")
        resumed_steps, resumed = self.resume("resumed", middle, 2, extra=COSINE)
        self.assertEqual([(s["loss"], s["lr"]) for s in resumed_steps],
                         [(s["loss"], s["lr"]) for s in full_steps[10:]])
        for name in full:
            self.assertTrue(np.array_equal(resumed[name], full[name]), name)

    def test_resume_across_rank_counts(self):
        full_steps, _, full = self.train("full", ARGUMENTS + ["--steps", "20"], 2)
        self.train("half", ARGUMENTS + ["--steps", "10"], 2)
        checkpoint = os.path.join(self.path("half"), "step_00000010.h5")
        one_steps, one = self.resume("one", checkpoint, 1)
        self.assert_losses_close(one_steps, full_steps[10:])
        self.assert_tensors_close(one, full)
        # And from one process to four.
        self.train("single", ARGUMENTS + ["--steps", "10"], 1)
        four_steps, four = self.resume("four", self.path("single"), 4)
        self.assert_losses_close(four_steps, full_steps[10:])
        self.assert_tensors_close(four, full)

    def test_zero_steps_writes_the_initial_state(self):
        directory = self.path("initial")
        run(ARGUMENTS + ["--steps", "0", "--checkpoint-dir", directory], 2)
        initial = read_checkpoint(os.path.join(directory, "step_00000000.h5"))
        self.assertTrue(np.all(initial["optimizer/exp_avg/layers/00/weight"] == 0))
        bound = 1 / np.sqrt(10)
        weights = initial["model/layers/00/weight"]
        self.assertLessEqual(np.max(np.abs(weights)), bound)
        self.assertGreater(np.std(weights), bound / 3)  # uniform, not all zero
        # The same seed gives the same model in any layout.
        other = self.path("initial-one")
        run(ARGUMENTS + ["--steps", "0", "--checkpoint-dir", other], 1)
        self.assertTrue(np.array_equal(
            read_checkpoint(os.path.join(other, "step_00000000.h5"))["model/layers/00/weight"], weights))


if __name__ == "__main__":
    unittest.main()
