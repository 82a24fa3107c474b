"""Pipeline parallelism (1F1B and GPipe): every layout with --pp reproduces the one-process run,
alone (bit for bit), with data parallelism, with tensor parallelism and with ZeRO, evaluation
included, and predicts its communication exactly; the first and last stages hold as many
micro-batches of activations as their schedules say (the ledger's peaks, exactly); each step moves
exactly one activation and one gradient message per micro-batch and boundary; the trace shows
the schedule and its analysis measures the bubble; checkpoints move between pipelined and plain
layouts."""
import importlib.util
import json
import os
import subprocess
import sys
import unittest

import numpy as np

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


def micro_batch_floats(stages, last):
    """Floats per sample one micro-batch keeps on the first or the last stage after its forward:
    its input, pre and GELU(pre) per layer but the model's last (pre only), and on the last stage
    the loss gradient; and what is allocated before the forward when received: the input, and on
    the last stage the targets (WIDTH floats), freed once the loss gradient is made."""
    layers = LAYERS // stages
    if not last:
        return WIDTH + layers * 2 * WIDTH, WIDTH
    return WIDTH + (layers - 1) * 2 * WIDTH + WIDTH + WIDTH, 2 * WIDTH


def trace_timeline():
    specification = importlib.util.spec_from_file_location(
        "trace_timeline", os.path.join(SOURCE_ROOT, "scripts", "tools", "trace_timeline.py"))
    module = importlib.util.module_from_spec(specification)
    specification.loader.exec_module(module)
    return module


class Pipeline(TrainingTestCase):
    def check_layouts(self, base, layouts):
        reference_steps, _, reference = self.train("one", base, 1)
        for ranks, extra in layouts:
            with self.subTest(ranks=ranks, extra=extra):
                name = "r{}_{}".format(ranks, "_".join(map(str, extra)))
                steps, summary, tensors = self.train(name, base + extra, ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)
                for op, comm in summary["comm_per_step"].items():
                    self.assertAlmostEqual(comm["measured_bytes"], comm["predicted_bytes"], msg=op)
                for state in ("params", "grads", "optimizer", "comm_buffers"):
                    placement = summary["placement"][state]
                    self.assertEqual(placement["measured_bytes"], placement["predicted_bytes"], state)

    def test_pipeline_alone_is_bit_for_bit(self):
        """Stages run the same operations in the same order as one process with the same
        micro-batches, so without clipping's world-wide sum nothing may differ at all."""
        base = REGRESSION + ["--steps", "6", "--micro-batches", "4"]
        reference_steps, _, reference = self.train("one", base, 1)
        for ranks, extra in ((2, ["--pp", "2"]), (4, ["--pp", "4", "--schedule", "gpipe"])):
            with self.subTest(ranks=ranks):
                steps, _, tensors = self.train(f"pp{ranks}", base + extra, ranks)
                self.assertEqual([s["loss"] for s in steps], [s["loss"] for s in reference_steps])
                for name, expected in reference.items():
                    self.assertTrue(np.array_equal(tensors[name], expected), name)

    def test_regression_layouts(self):
        self.check_layouts(REGRESSION + ["--steps", "12", "--eval-every", "6"], [
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

    def test_activations_and_transfers(self):
        stages, micro_batches = 2, 8
        rows = BATCH // micro_batches
        # 1F1B: stage 0 holds 2 micro-batches; the last stage 1, and the next one's received input
        # and targets. GPipe: all 8 on both (the last stage's backwards receive nothing ahead), and
        # on the last stage the targets of the last forward until its loss gradient is made.
        for schedule, first_alive, last_alive, last_ahead in (("1f1b", 2, 1, 1), ("gpipe", 8, 8, 0)):
            with self.subTest(schedule=schedule):
                metrics = self.path(schedule + ".jsonl")
                run(REGRESSION + ["--steps", "3", "--metrics", metrics]
                    + pipeline(stages, micro_batches, schedule), stages)
                steps, summary = read_metrics(metrics)
                first, _ = micro_batch_floats(stages, last=False)
                last, received = micro_batch_floats(stages, last=True)
                targets = WIDTH  # alive from their receive through the forward that makes the loss
                peaks = [rank["activations"] for rank in summary["peak_mem_bytes_by_rank"]]
                self.assertEqual(peaks[0], 4 * rows * first_alive * first)
                self.assertEqual(peaks[1], 4 * rows * (last_alive * last + max(last_ahead * received, targets)))
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
        run(REGRESSION + ["--steps", steps, "--eval-every", "2", "--trace", trace] + pipeline(2, 4), 2)
        with open(trace) as handle:
            events = json.load(handle)["traceEvents"]
        for rank in (0, 1):
            mine = [event for event in events if event["pid"] == rank]
            computed = [(event["name"][0].upper(), event["args"]["micro_batch"]) for event in mine
                        if event["ph"] == "X" and event["name"] in ("forward", "backward")
                        and event["args"]["step"] == 1]
            expected = {0: "F0 F1 B0 F2 B1 F3 B2 B3", 1: "F0 B0 F1 B1 F2 B2 F3 B3"}[rank]
            self.assertEqual(" ".join(f"{kind}{index}" for kind, index in computed), expected)
            self.assertTrue(any(event["name"] == "evaluate_forward" for event in mine))
            # A send and a receive per micro-batch and step (evaluation's ride in step 1 too).
            transfers = [event for event in mine if event["ph"] == "b" and event["cat"] == "transfers"
                         and event["args"]["step"] != 1]
            self.assertEqual(len(transfers), (steps - 1) * 2 * 4)
            self.assertTrue(all(event["args"]["group"] == "pp" for event in transfers))
            ends = [event for event in mine if event["ph"] == "e"]
            self.assertEqual(len(ends), len([event for event in mine if event["ph"] == "b"]))
        picture = self.path("timeline.png")
        result = subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "tools", "trace_timeline.py"),
                                 trace, "--output", picture, "--json"], capture_output=True, text=True,
                                check=True)
        report = json.loads(result.stdout)
        self.assertAlmostEqual(report["ideal_bubble"], 1 / 5)
        self.assertTrue(0 <= report["bubble"] < 1)
        self.assertGreater(os.path.getsize(picture), 0)

    def test_bubble_of_an_ideal_pipeline(self):
        """On a made-up trace of equal stages without transfer cost, measured and replayed bubbles
        both equal (P-1)/(M+P-1), for both schedules; an idle gap shows up in the measured one."""
        analysis = trace_timeline()
        forward_us, backward_us = 100.0, 200.0
        for schedule in ("1f1b", "gpipe"):
            for stages, micro_batches in ((2, 8), (4, 4), (3, 1)):
                with self.subTest(schedule=schedule, stages=stages, micro_batches=micro_batches):
                    places, spans = {}, []
                    # Lay the schedule out in time: each computation starts when its stage is free
                    # and its input is there.
                    done, free = {}, [0.0] * stages
                    orders = []
                    for stage in range(stages):
                        warmup = min(stages - stage - 1, micro_batches) if schedule == "1f1b" else micro_batches
                        order = [("forward", i) for i in range(warmup)]
                        for i in range(micro_batches - warmup):
                            order += [("forward", warmup + i), ("backward", i)]
                        order += [("backward", i) for i in range(micro_batches - warmup, micro_batches)]
                        orders.append(order)
                        places[stage] = {"stage": stage, "dp": 0, "tp": 0}
                    position = [0] * stages
                    while any(position[s] < len(orders[s]) for s in range(stages)):
                        for stage in range(stages):
                            while position[stage] < len(orders[stage]):
                                name, index = orders[stage][position[stage]]
                                neighbour = stage - 1 if name == "forward" else stage + 1
                                if 0 <= neighbour < stages and (neighbour, name, index) not in done:
                                    break
                                start = max(free[stage], done.get((neighbour, name, index), 0.0))
                                length = forward_us if name == "forward" else backward_us
                                spans.append({"ph": "X", "name": name, "pid": stage, "ts": start, "dur": length,
                                              "args": {"step": 0, "micro_batch": index}})
                                free[stage] = done[(stage, name, index)] = start + length
                                position[stage] += 1
                    ideal = (stages - 1) / (micro_batches + stages - 1)
                    run_data = {"micro_batches": micro_batches, "schedule": schedule, "theoretical_bubble": ideal,
                                "global_chunks": [[stage] for stage in range(stages)]}
                    report = analysis.analyse(run_data, places, spans)
                    self.assertAlmostEqual(report["ideal_bubble"], ideal)
                    self.assertAlmostEqual(report["bubble"], ideal)
                    self.assertAlmostEqual(report["bubble_from_stage_times"], ideal)
                    # Stage 0's last computation (the step's last) starting late: measured grows.
                    last = max(range(len(spans)), key=lambda index: spans[index]["ts"] if spans[index]["pid"] == 0 else -1)
                    late = [dict(span, ts=span["ts"] + forward_us) if index == last else span
                            for index, span in enumerate(spans)]
                    self.assertGreater(analysis.analyse(run_data, places, late)["bubble"], ideal + 1e-6)

    def test_checkpoints_move_between_pipelined_and_plain_layouts(self):
        self.assert_resumes_across_layouts(REGRESSION + ["--micro-batches", "4"], [
            (["--pp", "2"], 2, [], 2), ([], 1, ["--pp", "4"], 4), (["--pp", "2", "--dp", "2"], 4, ["--tp", "2"], 2),
        ], steps=12)


if __name__ == "__main__":
    unittest.main()
