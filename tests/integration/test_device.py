"""The device path. Without a GPU, --device loopback takes it: the CPU kernels behind memory the
host can only reach through explicit copies (a direct read crashes), every message staged through
host memory. Every layout must match the one-process CPU run within 1e-5 (the one-process run bit
for bit), predict its memory and communication as on the CPU, and write checkpoints that resume
on the CPU and the other way round. With a GPU, --device cuda must match the CPU within 1e-4,
alone, with ranks sharing the GPU over host-staged MPI, with NCCL at world size 1 and with the
optimizer offloaded; without one it is refused in one line
(exit 2), and the GPU half says why it skips."""
import unittest

import numpy as np

from common import TrainingTestCase, gpu_refusal

SHAPE = ["--layers", 6, "--hidden", 32, "--input-dim", 16, "--output-dim", 8,
         "--global-batch", 32, "--micro-batches", 4, "--lr", "3e-3", "--log-every", 0]
MODEL = SHAPE + ["--steps", 4]
MOE = MODEL + ["--moe-every", 2, "--experts", 4, "--top-k", 2]
CLASSIFICATION = ["--dataset", "mixture", "--shuffle", "--layers", 5, "--hidden", 16,
                  "--input-dim", 10, "--output-dim", 5, "--global-batch", 24, "--steps", 4,
                  "--eval-every", 2, "--grad-clip", "0.05", "--log-every", 0]
LOOPBACK = ["--device", "loopback"]
LAYOUTS = [(2, ["--dp", 2]), (2, ["--dp", 2, "--zero", 1]), (2, ["--dp", 2, "--zero", 2]),
           (2, ["--dp", 2, "--zero", 3]), (2, ["--tp", 2]), (2, ["--pp", 2]),
           (2, ["--pp", 2, "--schedule", "gpipe"]), (2, ["--dp", 2, "--recompute"]),
           (4, ["--pp", 2, "--dp", 2, "--zero", 3]), (4, ["--pp", 2, "--tp", 2]),
           (4, ["--dp", 4, "--zero", 2])]


class Loopback(TrainingTestCase):
    def test_one_process_is_bit_identical_to_the_cpu(self):
        cpu_steps, _, cpu = self.train("cpu", MODEL)
        steps, summary, tensors = self.train("loopback", MODEL + LOOPBACK)
        self.assertEqual([s["loss"] for s in steps], [s["loss"] for s in cpu_steps])
        for name, expected in cpu.items():
            np.testing.assert_array_equal(tensors[name], expected, name)
        self.assert_predicted(summary)

    def test_every_layout_matches_one_cpu_process(self):
        reference_steps, _, reference = self.train("reference", MODEL)
        for ranks, layout in LAYOUTS:
            with self.subTest(layout=layout):
                name = "r{}_{}".format(ranks, "_".join(map(str, layout)))
                steps, summary, tensors = self.train(name, MODEL + layout + LOOPBACK, ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)
                self.assert_predicted(summary)

    def test_experts_and_classification(self):
        for base, ranks, layout in [(MOE, 2, ["--dp", 2, "--ep", 2]),
                                    (CLASSIFICATION, 2, ["--dp", 2, "--zero", 1])]:
            with self.subTest(layout=layout):
                name = "_".join(map(str, layout))
                reference_steps, _, reference = self.train(name + "_cpu", base)
                steps, _, tensors = self.train(name, base + layout + LOOPBACK, ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)
                for mine, theirs in zip(steps, reference_steps):
                    for key in ("eval_accuracy", "expert_load"):
                        if key in theirs:
                            self.assertEqual(mine[key], theirs[key], key)
                    if "aux_loss" in theirs:
                        self.assertAlmostEqual(mine["aux_loss"], theirs["aux_loss"], delta=1e-5 * theirs["aux_loss"])

    def test_checkpoints_move_between_the_cpu_and_the_device(self):
        self.assert_resumes_across_layouts(
            SHAPE, [(LOOPBACK + ["--dp", 2, "--zero", 3], 2, [], 1),
                    ([], 1, LOOPBACK + ["--tp", 2], 2),
                    (LOOPBACK + ["--pp", 2], 2, LOOPBACK + ["--dp", 2, "--zero", 2], 2)], 4)


class Cuda(TrainingTestCase):
    def setUp(self):
        super().setUp()
        self.refusal = gpu_refusal()

    def test_refused_in_one_line_without_a_gpu(self):
        if self.refusal is None:
            self.skipTest("a GPU is present: --device cuda trains here")
        code, message = self.refusal
        self.assertEqual(code, 2, message)
        self.assertEqual(len(message.splitlines()), 1, message)
        self.assertIn("--device cuda", message)

    def test_cuda_matches_the_cpu(self):
        if self.refusal is not None:
            self.skipTest(f"no GPU to test on: mlptrain says \"{self.refusal[1]}\"")
        reference_steps, _, reference = self.train("cpu", MODEL)
        for ranks, layout in [(1, []), (2, ["--dp", 2]), (2, ["--tp", 2]), (2, ["--pp", 2]),
                              (2, ["--dp", 2, "--zero", 3]), (4, ["--pp", 2, "--dp", 2, "--zero", 1]),
                              (1, ["--comm", "nccl"]), (1, ["--offload"]),
                              (2, ["--dp", 2, "--zero", 1, "--offload"])]:
            with self.subTest(ranks=ranks, layout=layout):
                name = "cuda_r{}_{}".format(ranks, "_".join(map(str, layout)))
                steps, _, tensors = self.train(name, MODEL + layout + ["--device", "cuda"], ranks)
                self.assert_losses_close(steps, reference_steps, 1e-4)
                self.assert_tensors_close(tensors, reference, 1e-4)


if __name__ == "__main__":
    unittest.main(verbosity=2)
