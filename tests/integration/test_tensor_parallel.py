"""Tensor parallelism (Megatron column/row pairs): every layout with --tp reproduces the
one-process run, alone, with data parallelism and with ZeRO 1 and 2; each rank holds its slices
of the paired layers; each step moves exactly the two all-reduces per pair and micro-batch the
pairing implies; checkpoints move between TP and plain DP."""
import unittest

from common import TrainingTestCase, read_metrics, run

LAYERS, HIDDEN, INPUTS, OUTPUTS, BATCH = 5, 24, 10, 6, 24
MODEL = ["--layers", LAYERS, "--hidden", HIDDEN, "--input-dim", INPUTS, "--output-dim", OUTPUTS,
         "--global-batch", BATCH, "--log-every", "0"]
REGRESSION = ["--dataset", "teacher", "--lr", "3e-3"] + MODEL
CLASSIFICATION = ["--dataset", "mixture", "--shuffle", "--lr", "3e-3"] + MODEL
CLIP = ["--grad-clip", "0.05"]


def shapes():
    """(in, out) of every layer."""
    widths = [INPUTS] + [HIDDEN] * (LAYERS - 1) + [OUTPUTS]
    return [(widths[layer], widths[layer + 1]) for layer in range(LAYERS)]


def role(layer):
    if layer % 2 == 1:
        return "row"
    return "column" if layer + 1 < LAYERS else "replicated"


def local_parameters(tp):
    """Parameters a rank holds: column layers split W's rows and the bias, row layers W's columns."""
    total = 0
    for layer, (inputs, outputs) in enumerate(shapes()):
        if role(layer) == "column":
            total += outputs // tp * inputs + outputs // tp
        elif role(layer) == "row":
            total += outputs * (inputs // tp) + outputs
        else:
            total += outputs * inputs + outputs
    return total


def tensor_parallel_bytes(dp, micro_batches):
    """Per step: a forward all-reduce of [rows, out] per pair, and a backward one of [rows, in]
    per column layer but the first (its input gradient is never needed)."""
    rows = BATCH // micro_batches // dp
    floats = 0
    for layer, (inputs, outputs) in enumerate(shapes()):
        if role(layer) == "row":
            floats += rows * outputs
        if role(layer) == "column" and layer > 0:
            floats += rows * inputs
    return 4 * floats * micro_batches


class TensorParallel(TrainingTestCase):
    def check_layouts(self, base, layouts):
        for clip in ([], CLIP):
            reference_steps, _, reference = self.train("one" + "".join(clip), base + clip, 1)
            for ranks, extra in layouts:
                with self.subTest(ranks=ranks, extra=extra, clip=clip):
                    steps, _, tensors = self.train(f"r{ranks}{len(extra)}{len(clip)}", base + extra + clip, ranks)
                    self.assert_losses_close(steps, reference_steps)
                    self.assert_tensors_close(tensors, reference)

    def test_regression_layouts(self):
        self.check_layouts(REGRESSION + ["--steps", "20"],
                           [(2, ["--tp", "2"]), (4, ["--tp", "4", "--micro-batches", "2"]),
                            (4, ["--tp", "2"]), (4, ["--tp", "2", "--zero", "1", "--micro-batches", "2"])])

    def test_classification_layouts(self):
        self.check_layouts(CLASSIFICATION + ["--steps", "20"],
                           [(2, ["--tp", "2", "--micro-batches", "3"]), (4, ["--tp", "2", "--zero", "2"])])

    def test_memory_and_all_reduce_volume(self):
        for ranks, tp, micro_batches in ((2, 2, 1), (4, 4, 2), (4, 2, 2)):
            with self.subTest(ranks=ranks, tp=tp, micro_batches=micro_batches):
                metrics = self.path(f"m{ranks}{tp}.jsonl")
                run(REGRESSION + ["--steps", "3", "--tp", tp, "--micro-batches", micro_batches,
                                  "--metrics", metrics], ranks)
                steps, summary = read_metrics(metrics)
                dp = ranks // tp
                parameters = local_parameters(tp)
                for peaks in summary["peak_mem_bytes_by_rank"]:
                    self.assertEqual(peaks["params"], 4 * parameters)
                expected = tensor_parallel_bytes(dp, micro_batches) + 7 * 8  # + the step's world sum
                if dp > 1:
                    expected += 4 * parameters  # data parallelism's gradient all-reduce
                for step in steps:
                    self.assertEqual(step["comm_bytes"]["all_reduce"], expected)
                self.assertEqual(summary["comm_per_step"]["all_reduce"]["predicted_bytes"], expected)

    def test_checkpoints_move_between_tensor_parallel_and_plain_layouts(self):
        self.assert_resumes_across_layouts(REGRESSION, [
            (["--tp", "4"], 4, [], 2), ([], 2, ["--tp", "2"], 2), (["--tp", "2", "--zero", "1"], 4, [], 1),
        ], steps=20)


if __name__ == "__main__":
    unittest.main()
