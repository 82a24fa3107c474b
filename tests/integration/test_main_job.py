"""The README's main job: `mpiexec -n 4 mlptrain` with its defaults trains on the built-in teacher
data, prints per-step loss and throughput and the end-of-run summary, and learns; --help and
--predict answer without training; the metrics file has every field of DESIGN.md §2.4, the
communication in wall time consistent with the operations' own times."""
import unittest

from common import TrainingTestCase, read_metrics, run

OPS = {"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send", "recv"}
STATES = {"params", "grads", "optimizer", "activations", "comm_buffers", "workspace"}


class MainJob(TrainingTestCase):
    def test_default_run_at_four_ranks(self):
        metrics = self.path("metrics.jsonl")
        output = run(["--metrics", metrics], 4).stdout
        self.assertIn("dp=4", output)
        self.assertIn("step 100/100", output)
        self.assertIn("samples/s", output)
        self.assertIn("summary: 100 steps", output)
        steps, summary = read_metrics(metrics)
        self.assertEqual(len(steps), 100)
        self.assertLess(steps[-1]["loss"], 0.5 * steps[0]["loss"])
        for key in ("step", "loss", "aux_loss", "lr", "grad_norm", "step_ms", "data_ms", "samples_per_s", "model_tflops"):
            self.assertIn(key, steps[0])
        self.assertEqual(set(steps[0]["comm_bytes"]), OPS)
        self.assertEqual(set(steps[0]["comm_ms"]), OPS)
        # Communication in wall time: the union of the operations' spans is no more than their
        # sum (they overlap) or the step, and the caller's waits lie inside those spans (each
        # wait ends when its caller saw the operation complete, a few microseconds after it did).
        for step in steps:
            self.assertLessEqual(step["comm_busy_ms"], sum(step["comm_ms"].values()) + 1e-6, step)
            self.assertLessEqual(step["comm_busy_ms"], step["step_ms"] + 0.5, step)
            self.assertLessEqual(step["comm_wait_ms"], step["comm_busy_ms"] + 0.5, step)
            self.assertGreater(step["comm_wait_ms"], 0, step)  # the step's loss sum, at least
        self.assertEqual(set(steps[0]["mem_bytes"]), STATES)
        self.assertEqual(set(steps[0]["peak_mem_bytes"]), STATES)
        self.assertTrue(summary["summary"])
        self.assertEqual(len(summary["peak_mem_bytes_by_rank"]), 4)
        self.assertEqual(set(summary["comm_per_step"]), OPS)
        for state in ("params", "grads", "optimizer", "activations"):
            placement = summary["placement"][state]
            self.assertEqual(placement["predicted_bytes"], placement["measured_bytes"], state)
        self.assertEqual(summary["placement"]["params"]["mode"], "R")

    def test_model_flops_and_utilization(self):
        # 6 FLOPs per parameter and sample; recomputation's forward counted apart.
        layers, hidden, inputs, outputs, batch = 4, 32, 16, 3, 64
        parameters = (inputs + 1) * hidden + (layers - 2) * (hidden + 1) * hidden + (hidden + 1) * outputs
        base = ["--layers", layers, "--hidden", hidden, "--input-dim", inputs, "--output-dim", outputs,
                "--global-batch", batch, "--steps", 3, "--log-every", 1]
        for ranks, flags in ((1, []), (2, ["--recompute", "--peak-tflops", "0.5"])):
            with self.subTest(ranks=ranks, flags=flags):
                metrics = self.path(f"flops{ranks}.jsonl")
                output = run(base + flags + ["--metrics", metrics], ranks).stdout
                steps, summary = read_metrics(metrics)
                self.assertIn("TFLOP/s/rank", output)
                for step in steps:
                    per_rank = 6 * parameters * batch / (step["step_ms"] / 1000) / ranks / 1e12
                    self.assertAlmostEqual(step["model_tflops"], per_rank, delta=1e-3 * per_rank)
                    if flags:
                        # Layers 0-2 drop their pre-activations (GELU) and run forward again.
                        recomputed = (inputs + 1) * hidden + 2 * (hidden + 1) * hidden
                        self.assertAlmostEqual(step["recompute_tflops"] / step["model_tflops"],
                                               2 * recomputed / (6 * parameters), delta=1e-9)
                        self.assertAlmostEqual(step["mfu"], step["model_tflops"] / 0.5, delta=1e-9)
                    else:
                        self.assertNotIn("mfu", step)
                        self.assertNotIn("recompute_tflops", step)
                self.assertIn("model_tflops", summary)
                self.assertEqual("mfu" in summary, bool(flags))
                self.assertIn("MFU" if flags else "TFLOP/s", output)

    def test_help_and_predict(self):
        self.assertIn("--global-batch", run(["--help"], 2).stdout)
        predicted = run(["--predict", "--hidden", "64"], 2).stdout
        self.assertIn("predicted", predicted)
        self.assertIn("all_reduce", predicted)
        self.assertNotIn("step 1/", predicted)


if __name__ == "__main__":
    unittest.main()
