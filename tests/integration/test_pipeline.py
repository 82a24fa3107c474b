"""Pipeline parallelism (1F1B and GPipe): every layout with --pp reproduces the one-process run,
alone, with data parallelism, with tensor parallelism and with ZeRO; stage 0 holds as many
micro-batches of activations as its schedule says (the ledger's peak, exactly); each step moves
exactly one activation and one gradient message per micro-batch and boundary; the trace shows
the schedule; checkpoints move between pipelined and plain layouts."""
import json
import os
import subprocess
import sys
import unittest

from common import SOURCE_ROOT, TrainingTestCase, read_metrics, run

# Equal widths make every layer cost the same, so P stages get L / P layers each.
LAYERS, WIDTH, BATCH = 8, 24, 32
MODEL = ["--layers", LAYERS, "--hidden", WIDTH, "--input-dim", WIDTH, "--output-dim", WIDTH,
         "--global-batch", BATCH, "--log-every", "0"]
REGRESSION = ["--dataset", "teacher", "--lr", "3e-3"] + MODEL
CLASSIFICATION = ["--dataset", "mixture", "--shuffle", "--lr", "3e-3", "--grad-clip", "0.05",
                  "--layers", 6, "--hidden", 16, "--input-dim", 10, "--output-dim", 5,
                  "--global-batch", 24, "--log-every", 0, "--eval-every", 4]


def pipeline(stages, micro_batches, schedule="1f1b"):
    return ["--pp", stages, "--micro-batches", micro_batches, "--schedule", schedule]


def stage_zero_micro_batch_bytes(stages, micro_batches, dp=1):
    """Activations one micro-batch keeps on stage 0: its input, and pre and GELU(pre) per layer."""
    rows = BATCH // micro_batches // dp
    return 4 * rows * (WIDTH + (LAYERS // stages) * 2 * WIDTH)


class Pipeline(TrainingTestCase):
    def check_layouts(self, base, layouts):
        reference_steps, _, reference = self.train("one", base, 1)
        for ranks, extra in layouts:
            with self.subTest(ranks=ranks, extra=extra):
                name = "r{}_{}".format(ranks, "_".join(map(str, extra)))
                steps, _, tensors = self.train(name, base + extra, ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)

    def test_regression_layouts(self):
        self.check_layouts(REGRESSION + ["--steps", "12"], [
            (2, pipeline(2, 4)), (2, pipeline(2, 4, "gpipe")),
            (4, pipeline(4, 8)), (4, pipeline(4, 2, "gpipe")), (4, pipeline(4, 1)),
            (4, pipeline(2, 4) + ["--dp", "2"]), (4, pipeline(2, 2, "gpipe") + ["--tp", "2"]),
            (4, pipeline(2, 2) + ["--dp", "2", "--zero", "1"]),
            (4, pipeline(2, 4) + ["--dp", "2", "--zero", "2"]),
            (4, pipeline(2, 4, "gpipe") + ["--dp", "2", "--zero", "3"]),
        ])

    def test_classification_layouts(self):
        self.check_layouts(CLASSIFICATION + ["--steps", "12"], [
            (2, pipeline(2, 3)), (3, pipeline(3, 4, "gpipe")), (4, pipeline(2, 3) + ["--tp", "2"]),
        ])

    def test_stage_zero_activations_and_transfers(self):
        stages, micro_batches = 2, 8
        for schedule, alive in (("1f1b", 2), ("gpipe", micro_batches)):
            with self.subTest(schedule=schedule):
                metrics = self.path(schedule + ".jsonl")
                run(REGRESSION + ["--steps", "3", "--metrics", metrics]
                    + pipeline(stages, micro_batches, schedule), stages)
                steps, summary = read_metrics(metrics)
                one = stage_zero_micro_batch_bytes(stages, micro_batches)
                stage_zero = summary["peak_mem_bytes_by_rank"][0]["activations"]
                self.assertEqual(stage_zero, alive * one)
                placement = summary["placement"]["activations"]
                self.assertEqual(placement["predicted_bytes"], placement["measured_bytes"])
                # Stage 0 sends every micro-batch's output and receives its gradient.
                message = 4 * (BATCH // micro_batches) * WIDTH
                for step in steps:
                    self.assertEqual(step["comm_bytes"]["send"], micro_batches * message)
                    self.assertEqual(step["comm_bytes"]["recv"], micro_batches * message)
                for op in ("send", "recv"):
                    comm = summary["comm_per_step"][op]
                    self.assertEqual(comm["predicted_bytes"], micro_batches * message)
                    self.assertEqual(comm["measured_bytes"], micro_batches * message)

    def test_trace_shows_the_schedule(self):
        trace = self.path("trace.json")
        steps = 3
        run(REGRESSION + ["--steps", steps, "--trace", trace] + pipeline(2, 4), 2)
        with open(trace) as handle:
            events = json.load(handle)["traceEvents"]
        for rank in (0, 1):
            mine = [event for event in events if event["pid"] == rank and event["ph"] == "X"]
            computed = [(event["name"][0].upper(), event["args"]["micro_batch"]) for event in mine
                        if event["name"] in ("forward", "backward") and event["args"]["step"] == 1]
            expected = {0: "F0 F1 B0 F2 B1 F3 B2 B3", 1: "F0 B0 F1 B1 F2 B2 F3 B3"}[rank]
            self.assertEqual(" ".join(f"{kind}{index}" for kind, index in computed), expected)
            transfers = [event for event in mine if event["cat"] == "transfers"]
            self.assertEqual(len(transfers), steps * 2 * 4)  # a send and a receive per micro-batch
            self.assertTrue(all(event["args"]["group"] == "pp" for event in transfers))
        picture = self.path("timeline.png")
        result = subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "trace_timeline.py"),
                                 trace, "--output", picture, "--json"], capture_output=True, text=True,
                                check=True)
        report = json.loads(result.stdout)
        self.assertAlmostEqual(report["ideal_bubble"], 1 / 5)
        self.assertTrue(0 <= report["bubble"] < 1)
        self.assertGreater(os.path.getsize(picture), 0)

    def test_checkpoints_move_between_pipelined_and_plain_layouts(self):
        self.assert_resumes_across_layouts(REGRESSION + ["--micro-batches", "4"], [
            (["--pp", "2"], 2, [], 2), ([], 1, ["--pp", "4"], 4), (["--pp", "2", "--dp", "2"], 4, ["--tp", "2"], 2),
        ], steps=12)


if __name__ == "__main__":
    unittest.main()
