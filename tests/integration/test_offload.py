"""--offload: the optimizer state and the AdamW update in host memory, off the device. Checked on
the loopback device (the same host kernels update the same numbers, so every layout must match
its run without offload bit for bit), with the moments reported in host memory as predicted and
absent from the device, and checkpoints that move between offloaded and plain runs. The update
runs into the next forward (one piece per layer) unless a strategy shards the state, and the
forward waits for each layer's values: without that wait the losses differ."""
import unittest

import numpy as np

from common import TrainingTestCase, run

SHAPE = ["--layers", 6, "--hidden", 32, "--input-dim", 16, "--output-dim", 8,
         "--global-batch", 32, "--micro-batches", 4, "--lr", "3e-3", "--log-every", 0,
         "--device", "loopback"]
MODEL = SHAPE + ["--steps", 4]
MOE = ["--moe-every", 2, "--experts", 4, "--top-k", 2]
LAYOUTS = [(1, []), (1, ["--grad-clip", "0.05"]), (2, ["--dp", 2, "--zero", 1]),
           (2, ["--dp", 2, "--zero", 3]), (2, ["--tp", 2]), (2, ["--pp", 2, "--grad-clip", "0.05"]),
           (2, ["--dp", 2, "--ep", 2] + MOE), (4, ["--pp", 2, "--dp", 2, "--zero", 2])]


class Offload(TrainingTestCase):
    def test_every_layout_matches_its_run_without_offload(self):
        for ranks, layout in LAYOUTS:
            with self.subTest(ranks=ranks, layout=layout):
                name = "r{}_{}".format(ranks, "_".join(map(str, layout)))
                plain_steps, _, plain = self.train(name + "_plain", MODEL + layout, ranks)
                steps, summary, tensors = self.train(name, MODEL + layout + ["--offload"], ranks)
                for key in ("loss", "grad_norm"):
                    self.assertEqual([s[key] for s in steps], [s[key] for s in plain_steps], key)
                self.assertEqual(sorted(tensors), sorted(plain))
                for tensor, expected in plain.items():
                    np.testing.assert_array_equal(tensors[tensor], expected, tensor)
                self.assert_moments_in_host_memory(summary)

    def assert_moments_in_host_memory(self, summary):
        optimizer = summary["placement"]["optimizer"]
        self.assertEqual(optimizer["mode"], "Off")
        self.assertEqual(optimizer["memory"], "host")
        self.assertGreater(optimizer["predicted_bytes"], 0)
        self.assertEqual(optimizer["predicted_bytes"], optimizer["measured_bytes"])
        self.assertEqual(summary["peak_host_mem_bytes"]["optimizer"], optimizer["predicted_bytes"])
        for rank, peaks in enumerate(summary["peak_mem_bytes_by_rank"]):
            self.assertEqual(peaks["optimizer"], 0, f"rank {rank} holds moments on the device")
        for state in ("params", "grads"):
            placement = summary["placement"][state]
            self.assertEqual(placement["predicted_bytes"], placement["measured_bytes"], state)

    def test_the_update_overlaps_the_next_forward_unless_the_state_is_sharded(self):
        for ranks, layout, expected in [
                (1, [], "6 piece(s) a step, each sent back while the next forward runs"),
                (2, ["--pp", 2], "3 piece(s) a step, each sent back while the next forward runs"),
                (2, ["--dp", 2, "--zero", 3], "done within the step")]:
            with self.subTest(layout=layout):
                output = run(SHAPE + layout + ["--offload", "--steps", 1], ranks).stdout
                self.assertIn("offload: AdamW's moments and update in host memory, ", output)
                self.assertIn(expected, output)

    def test_checkpoints_move_between_offloaded_and_plain_runs(self):
        self.assert_resumes_across_layouts(
            SHAPE, [(["--offload"], 1, ["--dp", 2, "--zero", 3], 2),
                    (["--tp", 2], 2, ["--offload", "--pp", 2], 2),
                    (["--offload", "--dp", 2, "--zero", 1], 2, ["--offload"], 1)], 4)


if __name__ == "__main__":
    unittest.main(verbosity=2)
