"""Activation recomputation (--recompute): the same numbers as storing every activation (bit for
bit in the same layout, within 1e-5 of one process in the others), at most half the peak
activation memory of a 16-layer model with and without the pipeline, MoE layers kept as they
are (routed once, counted once), and the activation peaks
and the communication (tensor parallelism all-reduces again in the recomputed forward) predicted
exactly."""
import unittest

import numpy as np

from common import TrainingTestCase

LAYERS, WIDTH = 16, 32
REGRESSION = ["--layers", LAYERS, "--hidden", WIDTH, "--input-dim", WIDTH, "--output-dim", 8,
              "--global-batch", 32, "--micro-batches", 4, "--steps", 4, "--lr", "3e-3",
              "--log-every", 0]
CLASSIFICATION = ["--dataset", "mixture", "--shuffle", "--layers", 7, "--hidden", 16,
                  "--input-dim", 10, "--output-dim", 5, "--global-batch", 24, "--steps", 4,
                  "--eval-every", 2, "--grad-clip", "0.05", "--log-every", 0]


def activation_peaks(summary):
    return [rank["activations"] for rank in summary["peak_mem_bytes_by_rank"]]


class Recompute(TrainingTestCase):
    def assert_predicted(self, summary):
        for state, placement in summary["placement"].items():
            self.assertEqual(placement["predicted_bytes"], placement["measured_bytes"], state)
        self.assertEqual(summary["placement"]["activations"]["mode"], "M")
        for op, comm in summary["comm_per_step"].items():
            self.assertAlmostEqual(comm["predicted_bytes"], comm["measured_bytes"], msg=op)

    def assert_identical(self, steps, tensors, reference_steps, reference):
        self.assertEqual([s["loss"] for s in steps], [s["loss"] for s in reference_steps])
        self.assertEqual([s["grad_norm"] for s in steps], [s["grad_norm"] for s in reference_steps])
        for name, expected in reference.items():
            np.testing.assert_array_equal(tensors[name], expected, name)

    def test_bit_identical_and_at_most_half_the_activations(self):
        for ranks, layout in [(1, []), (2, ["--pp", 2]),
                              (2, ["--pp", 2, "--schedule", "gpipe"])]:
            with self.subTest(layout=layout):
                name = "_".join(map(str, layout)) or "one"
                stored_steps, stored_summary, stored = self.train(name, REGRESSION + layout, ranks)
                steps, summary, tensors = self.train(name + "_recomputed",
                                                     REGRESSION + layout + ["--recompute"], ranks)
                self.assert_identical(steps, tensors, stored_steps, stored)
                self.assert_predicted(summary)
                for recomputed, kept in zip(activation_peaks(summary), activation_peaks(stored_summary)):
                    self.assertLessEqual(recomputed, kept / 2)

    def test_layouts_match_one_process(self):
        reference_steps, _, reference = self.train("one", REGRESSION, 1)
        for ranks, layout in [(2, ["--dp", 2]), (2, ["--tp", 2]), (2, ["--dp", 2, "--zero", 1]),
                              (2, ["--dp", 2, "--zero", 2]),
                              (2, ["--dp", 2, "--zero", 3]), (4, ["--pp", 2, "--dp", 2, "--zero", 3]),
                              (4, ["--pp", 2, "--tp", 2])]:
            with self.subTest(layout=layout):
                name = "r{}_{}".format(ranks, "_".join(map(str, layout)))
                steps, summary, tensors = self.train(name, REGRESSION + layout + ["--recompute"], ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)
                self.assert_predicted(summary)

    def test_moe_layers_are_kept(self):
        moe = REGRESSION + ["--moe-every", 3, "--experts", 4, "--top-k", 2, "--capacity-factor", "1.0"]
        reference_steps, reference_summary, reference = self.train("one", moe, 1)
        steps, summary, tensors = self.train("one_recomputed", moe + ["--recompute"], 1)
        self.assert_identical(steps, tensors, reference_steps, reference)
        self.assertEqual([s["expert_load"] for s in steps], [s["expert_load"] for s in reference_steps])
        self.assert_predicted(summary)
        # The dense layers' share goes; the MoE layers keep theirs (k rows per token, three times).
        self.assertLess(activation_peaks(summary)[0], 0.7 * activation_peaks(reference_summary)[0])
        steps, summary, tensors = self.train("ep2", moe + ["--recompute", "--ep", 2], 2)
        self.assert_losses_close(steps, reference_steps)
        self.assert_tensors_close(tensors, reference)
        self.assertEqual([s["dropped_tokens"] for s in steps], [s["dropped_tokens"] for s in reference_steps])
        self.assert_predicted(summary)

    def test_evaluation_and_classification(self):
        reference_steps, _, reference = self.train("one", CLASSIFICATION, 1)
        for ranks, layout in [(1, []), (2, ["--pp", 2, "--micro-batches", 2])]:
            with self.subTest(layout=layout):
                steps, summary, tensors = self.train("recomputed" + str(ranks),
                                                     CLASSIFICATION + layout + ["--recompute"], ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assertTrue(any("eval_loss" in s for s in steps))
                self.assert_tensors_close(tensors, reference)
                self.assert_predicted(summary)


if __name__ == "__main__":
    unittest.main()
