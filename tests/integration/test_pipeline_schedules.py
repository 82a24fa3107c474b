"""The newer pipeline schedules: interleaved 1F1B (--schedule interleaved --virtual-stages V, each
stage holding V model chunks), zero-bubble H1 (--schedule zb-h1, backward split into B and W) and
zero-bubble V (--schedule zb-v: two chunks a stage in a V, the first and last layers on stage 0).
Alone they reproduce one process bit for bit; composed with data and tensor parallelism (sequence
parallel too), ZeRO 1-3, recomputation and experts, within the fp32 tolerance, with memory and
bytes by group as predicted (dense models' activations exactly); evaluation runs through the
chunks; checkpoints move between chunked and other layouts; shapes a schedule cannot run are
refused with one line."""
import unittest

import numpy as np

from common import TrainingTestCase, run

BASE = ["--dataset", "teacher", "--input-dim", "12", "--output-dim", "3", "--global-batch", "32",
        "--log-every", "0", "--lr", "3e-3"]
DENSE = BASE + ["--hidden", "16", "--layers", "8"]
MOE = BASE + ["--hidden", "16", "--layers", "8", "--moe-every", "3", "--experts", "4", "--top-k", "2"]


def interleaved(stages, chunks, micro_batches):
    return ["--pp", str(stages), "--schedule", "interleaved", "--virtual-stages", str(chunks),
            "--micro-batches", str(micro_batches)]


def zero_bubble(stages, micro_batches, schedule="zb-h1"):
    return ["--pp", str(stages), "--schedule", schedule, "--micro-batches", str(micro_batches)]


def zero_bubble_v(stages, micro_batches):
    return zero_bubble(stages, micro_batches, "zb-v")


class PipelineSchedules(TrainingTestCase):
    def test_alone_bit_for_bit(self):
        """Each layer's gradients accumulate in micro-batch order under every schedule, and a
        split backward sums what a whole one sums in the same order: nothing may differ."""
        model = DENSE + ["--steps", "5"]
        reference_steps, _, reference = self.train("one", model + ["--micro-batches", "4"], 1)
        for ranks, flags in ((2, interleaved(2, 2, 4)), (2, interleaved(2, 4, 4)), (4, interleaved(4, 2, 4)),
                             (2, zero_bubble(2, 4)), (4, zero_bubble(4, 4)), (2, zero_bubble_v(2, 4)),
                             (4, zero_bubble_v(4, 4))):
            with self.subTest(flags=flags):
                steps, _, tensors = self.train("r" + "".join(flags), model + flags, ranks)
                self.assertEqual([s["loss"] for s in steps], [s["loss"] for s in reference_steps])
                for name, expected in reference.items():
                    self.assertTrue(np.array_equal(tensors[name], expected), name)

    def check(self, model, layouts):
        def activations_exact(flags, summary):
            if "--moe-every" not in model:
                activations = summary["placement"]["activations"]
                self.assertEqual(activations["predicted_bytes"], activations["measured_bytes"])
        self.assert_layouts_reproduce_one_process(model, layouts, 6, activations_exact)

    def test_composed_with_every_strategy(self):
        self.check(DENSE, [
            (4, interleaved(2, 2, 4) + ["--dp", "2", "--zero", "1"]),
            (4, interleaved(2, 2, 2) + ["--tp", "2", "--sequence-parallel"]),
            (4, interleaved(2, 2, 4) + ["--dp", "2", "--zero", "3", "--recompute"]),
            (4, interleaved(2, 2, 4) + ["--dp", "2", "--zero", "2"]),
            (4, interleaved(2, 2, 2) + ["--tp", "2", "--recompute"]),
            (4, zero_bubble(2, 4) + ["--dp", "2", "--zero", "2", "--recompute"]),
            (4, zero_bubble(2, 4) + ["--dp", "2", "--zero", "3"]),
            (4, zero_bubble(2, 2) + ["--tp", "2", "--sequence-parallel"]),
            (4, zero_bubble(2, 4) + ["--dp", "2"]),
            (4, zero_bubble_v(2, 4) + ["--dp", "2", "--zero", "1"]),
            (4, zero_bubble_v(2, 4) + ["--dp", "2", "--zero", "3", "--recompute"]),
            (4, zero_bubble_v(2, 2) + ["--tp", "2", "--sequence-parallel"]),
        ])

    def test_composed_with_experts(self):
        self.check(MOE, [
            (4, interleaved(2, 2, 4) + ["--ep", "2", "--dp", "2"]),
            (4, zero_bubble(2, 4) + ["--ep", "2", "--dp", "2", "--zero", "2"]),
            (4, zero_bubble_v(2, 4) + ["--ep", "2", "--dp", "2"]),
        ])

    def test_zero_bubble_v_keeps_one_f_one_b_memory_plus_the_deferred_gradients(self):
        """Stage 0 of a V holds the first and the last chunk: measured, its activation peak is no
        more than 1F1B's stage 0 plus one micro-batch's deferred W gradients (d loss / d product of
        the stage's 4 layers), ZB-H1's peak, on 8 layers of one width, whose chunks halve the
        stages; predicted == measured each."""
        width, rows, micro_batches = 64, 8, 8
        model = ["--dataset", "teacher", "--input-dim", str(width), "--output-dim", str(width), "--hidden",
                 str(width), "--layers", "8", "--global-batch", str(rows * micro_batches), "--steps", "2",
                 "--log-every", "0"]
        peaks = {}
        for schedule in ("1f1b", "zb-h1", "zb-v"):
            _, summary, _ = self.train(schedule, model + zero_bubble(2, micro_batches, schedule), 2)
            activations = summary["placement"]["activations"]
            self.assertEqual(activations["predicted_bytes"], activations["measured_bytes"], schedule)
            peaks[schedule] = summary["peak_mem_bytes_by_rank"][0]["activations"]
        deferred_gradients = 4 * rows * width * 4
        self.assertEqual(peaks["zb-h1"], peaks["1f1b"] + deferred_gradients)
        self.assertLessEqual(peaks["zb-v"], peaks["1f1b"] + deferred_gradients)

    def test_evaluation_runs_through_the_chunks(self):
        """Evaluation's micro-batches (a ragged last one included) go through every chunk."""
        model = DENSE + ["--steps", "4", "--eval-every", "2", "--micro-batches", "2"]
        reference_steps, _, _ = self.train("one", model, 1)
        for name, flags in (("interleaved", ["--pp", "2", "--schedule", "interleaved", "--virtual-stages", "2"]),
                            ("v", ["--pp", "2", "--schedule", "zb-v"])):
            steps, _, _ = self.train(name, model + flags, 2)
            self.assertEqual([s.get("eval_loss") for s in steps], [s.get("eval_loss") for s in reference_steps])
            self.assertTrue(any(s.get("eval_loss") is not None for s in steps))

    def test_checkpoints_move_between_chunked_and_other_layouts(self):
        """A chunked run's checkpoint is consolidated like any other: it resumes without a
        pipeline, and a plain one resumes chunked, under ZB-H1 with ZeRO-3, or in a V."""
        model = DENSE + ["--micro-batches", "4"]
        chunked = ["--schedule", "interleaved", "--virtual-stages", "2"]
        split = ["--pp", "2", "--schedule", "zb-h1"]
        self.assert_resumes_across_layouts(model, [
            (["--pp", "2"] + chunked, 2, [], 1),
            ([], 1, ["--pp", "4"] + chunked, 4),
            (split, 2, split + ["--dp", "2", "--zero", "3"], 4),
            ([], 1, ["--pp", "2", "--schedule", "zb-v", "--dp", "2"], 4)], 6)

    def test_shapes_a_schedule_cannot_run_are_refused(self):
        for ranks, flags, named in (
                (2, ["--pp", "2", "--virtual-stages", "2"], "--virtual-stages"),
                (4, interleaved(4, 2, 2), "interleaved"),
                (4, interleaved(4, 3, 4), "--virtual-stages"),
                (1, ["--schedule", "interleaved", "--virtual-stages", "2"], "interleaved"),
                (2, zero_bubble_v(2, 4) + ["--virtual-stages", "2"], "--virtual-stages")):
            with self.subTest(flags=flags):
                result = run(["--layers", "8"] + flags, ranks, check=False, timeout=60)
                self.assertEqual(result.returncode, 2)
                lines = [line for line in result.stderr.splitlines() if line.strip()]
                self.assertEqual(len(lines), 1, result.stderr)
                self.assertIn(named, lines[0])


if __name__ == "__main__":
    unittest.main()
