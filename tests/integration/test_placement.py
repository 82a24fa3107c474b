"""Placement predictions against the ledger over a list of layouts (data parallel, ZeRO 1-3,
tensor, pipeline and expert parallelism and their combinations, at 1, 2 and 4 ranks) in mixed
precision (16-bit parameters, in turn bf16 with fp32 and with bf16 reductions and fp16 with fp32
reductions; fp32 is the layout matrix's): rank 0's predicted parameter, gradient and optimizer
bytes equal the measured peaks exactly, activations come within 5 %, and every collective's bytes
per step within 1 %. Each state names its mode."""
import unittest

from common import TrainingTestCase

DENSE = ["--layers", 6, "--hidden", 24, "--input-dim", 12, "--global-batch", 16, "--steps", 2,
         "--log-every", 0]
MOE = DENSE + ["--moe-every", 2, "--experts", 4, "--top-k", 2]
CLASSIFICATION = ["--dataset", "mixture", "--output-dim", 5, "--eval-every", 1]

LAYOUTS = [
    (1, DENSE, []), (1, DENSE, ["--micro-batches", 4, "--recompute"]), (1, MOE, []),
    (2, DENSE, ["--dp", 2]), (2, DENSE, ["--zero", 1]), (2, DENSE, ["--zero", 2]),
    (2, DENSE, ["--zero", 3, "--micro-batches", 2]), (2, DENSE, ["--zero", 3, "--recompute"]),
    (2, DENSE, ["--tp", 2]),
    (2, DENSE, ["--pp", 2, "--micro-batches", 4]),
    (2, DENSE, ["--pp", 2, "--micro-batches", 4, "--schedule", "gpipe", "--recompute"]),
    (2, MOE, ["--ep", 2]), (2, MOE, ["--dp", 2]), (2, MOE, ["--ep", 2, "--recompute"]),
    (4, DENSE, ["--zero", 3]), (4, DENSE, ["--dp", 2, "--tp", 2, "--zero", 1]),
    (4, DENSE, ["--pp", 2, "--micro-batches", 2, "--zero", 2]),
    (4, DENSE, ["--tp", 2, "--pp", 2, "--micro-batches", 4, "--recompute"]),
    (4, MOE, ["--ep", 2, "--zero", 1]), (4, MOE, ["--ep", 4]),
    (4, MOE, ["--ep", 2, "--pp", 2, "--micro-batches", 2]),
]


PRECISIONS = [["--param-dtype", "bf16"], ["--param-dtype", "bf16", "--reduce-dtype", "bf16"],
              ["--param-dtype", "fp16"]]


class Placement(TrainingTestCase):
    # fp32 layouts are checked the same way by the layout matrix (test_layout_matrix.py).
    def test_mixed_precision_predictions_match_the_ledger(self):
        self.check_layouts(lambda index: PRECISIONS[index % len(PRECISIONS)])

    def check_layouts(self, precision_of):
        for index, (ranks, model, layout) in enumerate(LAYOUTS):
            precision = precision_of(index)
            for task in (["--output-dim", 6], CLASSIFICATION) if index < 4 else (["--output-dim", 6],):
                with self.subTest(ranks=ranks, layout=layout, moe=model is MOE, task=task, precision=precision):
                    _, summary, _ = self.train(f"layout{index}{task[-1]}", model + layout + task + precision, ranks)
                    self.assertEqual(summary["param_dtype"], precision[1] if precision else "fp32")
                    placement = summary["placement"]
                    for state in ("params", "grads", "optimizer", "comm_buffers"):
                        self.assertEqual(placement[state]["predicted_bytes"], placement[state]["measured_bytes"],
                                         state)
                    activations = placement["activations"]
                    self.assertLessEqual(abs(activations["predicted_bytes"] - activations["measured_bytes"]),
                                         0.05 * activations["measured_bytes"])
                    for state, entry in placement.items():
                        self.assertIn(entry["mode"], ("R", "S", "SG", "M", "Off"), state)
                    for op, comm in summary["comm_per_step"].items():
                        self.assertLessEqual(abs(comm["predicted_bytes"] - comm["measured_bytes"]),
                                             0.01 * max(comm["measured_bytes"], 1), op)
                    if ranks > 1:
                        self.assertGreater(sum(c["measured_bytes"] for c in summary["comm_per_step"].values()), 0)


if __name__ == "__main__":
    unittest.main()
