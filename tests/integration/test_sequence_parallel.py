"""Sequence parallelism (--sequence-parallel with --tp T): the rows every tensor rank would hold
whole between a row-parallel layer and the next column-parallel (or MoE) layer are split over the
tensor group. Every layout, alone and composed with data and pipeline parallelism, ZeRO, hybrid
sharding, experts, recomputation and micro-batches, reproduces the one-process run; the
activations those rows held shrink by T, exactly as predicted; the sums become reduce-scatters and
gathers with the bytes predicted; checkpoints move between sequence-parallel and other layouts."""
import unittest

from common import TrainingTestCase

BASE = ["--dataset", "teacher", "--input-dim", "15", "--output-dim", "3", "--global-batch", "32",
        "--log-every", "0", "--lr", "3e-3"]
HIDDEN = 24
DENSE = BASE + ["--hidden", str(HIDDEN), "--layers", "6", "--grad-clip", "0.05"]
MOE = BASE + ["--hidden", str(HIDDEN), "--layers", "5", "--moe-every", "2", "--experts", "4", "--top-k", "2"]
SP = ["--sequence-parallel"]


def tensor(ranks):
    return ["--tp", str(ranks)] + SP


class SequenceParallel(TrainingTestCase):
    def check(self, model, layouts):
        """Each layout reproduces one process with its memory and bytes by group as predicted,
        the activations exactly (routing makes an MoE layer's a measured term), and splits rows."""
        def splits_rows(flags, summary):
            self.assertIn("reduce_scatter", summary["comm_bytes_by_group"]["tp"])
            if "--moe-every" not in model:
                activations = summary["placement"]["activations"]
                self.assertEqual(activations["predicted_bytes"], activations["measured_bytes"])
        return self.assert_layouts_reproduce_one_process(model, layouts, 10, splits_rows)

    def test_every_layout_reproduces_one_process(self):
        self.check(DENSE, [
            (2, tensor(2) + ["--eval-every", "3"]), (4, tensor(4)),
            (4, tensor(2) + ["--dp", "2", "--micro-batches", "2", "--recompute"]),
            (4, tensor(2) + ["--pp", "2", "--micro-batches", "4"]),
            (8, tensor(4) + ["--dp", "2", "--zero", "1"]),
            (8, tensor(2) + ["--dp", "2", "--pp", "2", "--zero", "3", "--micro-batches", "2", "--schedule", "gpipe"]),
            (8, tensor(2) + ["--dp", "4", "--zero", "2", "--zero-shard-size", "2", "--recompute"]),
        ])

    def test_experts_take_split_rows_in_and_out(self):
        self.check(MOE, [(2, tensor(2)), (4, tensor(2) + ["--ep", "2", "--micro-batches", "2"]),
                         (8, tensor(2) + ["--ep", "2", "--dp", "4", "--zero", "3", "--recompute"])])

    def test_replicated_rows_shrink_by_the_group_size_at_the_predicted_traffic(self):
        """Six layers: layers 1 and 3 (row-parallel, each followed by a column-parallel layer)
        hold their pre-activation and GELU output [R, 24] whole on every rank under plain tensor
        parallelism; split, each rank holds R / T of those rows. The sums after layers 1 and 3
        become a reduce-scatter each, the gathers before layers 2 and 4 run in forward and again
        in backward, and so on, each of [R, 24] in fp32."""
        rows = 32
        replicated = 2 * 2 * rows * HIDDEN * 4  # bytes: two layers' pre and output
        for ranks in (2, 4):
            with self.subTest(tp=ranks):
                _, plain, _ = self.train(f"plain{ranks}", DENSE + ["--steps", "2", "--tp", str(ranks)], ranks)
                _, split, _ = self.train(f"split{ranks}", DENSE + ["--steps", "2"] + tensor(ranks), ranks)
                peaks = [summary["placement"]["activations"]["measured_bytes"] for summary in (plain, split)]
                self.assertEqual(peaks[0] - peaks[1], replicated - replicated // ranks)
                boundary = rows * HIDDEN * 4  # one [R, 24] tensor
                last_sum = rows * 3 * 4       # the last layer's output, whole: nothing follows it
                self.assertEqual(plain["comm_bytes_by_group"]["tp"], {"all_reduce": 4 * boundary + last_sum})
                self.assertEqual(split["comm_bytes_by_group"]["tp"],
                                 {"all_reduce": last_sum, "reduce_scatter": 4 * boundary, "all_gather": 6 * boundary})

    def test_checkpoints_move_between_layouts(self):
        self.assert_resumes_across_layouts(DENSE, [(tensor(2), 2, [], 1), ([], 1, tensor(4) + ["--dp", "2"], 8),
                                                   (tensor(4), 4, ["--tp", "2"], 2)], 8)


if __name__ == "__main__":
    unittest.main()
