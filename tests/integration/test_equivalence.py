"""Every data-parallel layout reproduces the one-process run with the same global batch: losses,
gradient norms and final weights (and optimizer moments) within 1e-5 relative over 20 steps."""
import unittest

from common import TrainingTestCase

REGRESSION = ["--dataset", "teacher", "--input-dim", "16", "--output-dim", "4", "--layers", "4",
              "--hidden", "32", "--global-batch", "32", "--steps", "20", "--log-every", "0",
              "--lr", "3e-3"]
CLASSIFICATION = ["--dataset", "mixture", "--input-dim", "12", "--output-dim", "5", "--layers", "3",
                  "--hidden", "24", "--global-batch", "48", "--steps", "20", "--log-every", "0",
                  "--shuffle", "--lr-schedule", "cosine", "--warmup-steps", "3"]


class DataParallelEquivalence(TrainingTestCase):
    def check_layouts(self, arguments, layouts):
        reference_steps, _, reference = self.train("one", arguments, 1)
        self.assertLess(reference_steps[-1]["loss"], reference_steps[0]["loss"])
        for ranks, extra in layouts:
            with self.subTest(ranks=ranks, extra=extra):
                steps, summary, tensors = self.train(f"r{ranks}{''.join(extra)}", arguments + extra, ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)
                if ranks > 1:
                    # The gradients really travelled: one all-reduce of every gradient per step.
                    comm = summary["comm_per_step"]["all_reduce"]
                    self.assertEqual(comm["measured_bytes"], comm["predicted_bytes"])
                    self.assertGreater(comm["measured_bytes"], 4 * 1000)

    def test_regression_two_and_four_ranks(self):
        self.check_layouts(REGRESSION, [(2, []), (4, [])])

    def test_classification_with_shuffle_and_cosine(self):
        self.check_layouts(CLASSIFICATION, [(2, []), (4, [])])

    def test_micro_batches_equal_one_micro_batch(self):
        self.check_layouts(REGRESSION, [(1, ["--micro-batches", "4"]), (2, ["--micro-batches", "4"]),
                                        (4, ["--micro-batches", "2"])])

    def test_gradient_clipping_counts_each_element_once(self):
        clipped = REGRESSION + ["--grad-clip", "0.05"]
        steps, _, _ = self.train("clip-probe", clipped, 1)
        self.assertTrue(any(step["grad_norm"] > 0.05 for step in steps), "clipping never engaged")
        self.check_layouts(clipped, [(2, []), (4, ["--micro-batches", "2"])])


if __name__ == "__main__":
    unittest.main()
