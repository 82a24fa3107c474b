"""mlpplan, the placement calculator: the ZeRO paper's figure (Psi = 7.5B on an MLP of 112 x 8192,
N_d = 64, bf16 parameters and gradients with fp32 Adam: 16, 4 + 12/N_d, 2 + 14/N_d and 16/N_d bytes
per parameter) within 1 %; for layouts at 2 and 4 ranks, exactly what mlptrain --predict gives
(the same functions, no launch); a million ranks answered; bad input one line and exit 2, a layout
mlptrain refuses refused with mlptrain's line."""
import json
import os
import subprocess
import unittest

from common import TrainingTestCase, run

MLPPLAN = os.path.join(os.path.dirname(os.environ.get("MLPTRAIN", "build/mlptrain")), "mlpplan")
SMALL = ["--layers", 4, "--hidden", 32, "--input-dim", 16, "--output-dim", 8, "--global-batch", 32]
PLACED = ("params", "grads", "optimizer", "activations", "comm_buffers")


def plan(arguments):
    return subprocess.run([MLPPLAN] + [str(a) for a in arguments], capture_output=True, text=True, timeout=60)


def plan_json(arguments):
    result = plan(arguments + ["--json"])
    if result.returncode != 0:
        raise AssertionError(result.stderr)
    return json.loads(result.stdout)


class Mlpplan(TrainingTestCase):
    def test_the_zero_papers_figure(self):
        model = ["--layers", 112, "--hidden", 8192, "--input-dim", 8192, "--output-dim", 8192, "--global-batch", 64,
                 "--param-dtype", "bf16", "--reduce-dtype", "bf16", "--world", 64]
        psi = 7.5e9
        # The paper's formulas at Psi = 7.5B (its table rounds them to 120, 31.4, 16.6 and 1.9 GB).
        expected = {0: 16 * psi, 1: (4 + 12 / 64) * psi, 2: (2 + 14 / 64) * psi, 3: 16 * psi / 64}
        for stage, bytes_expected in expected.items():
            with self.subTest(zero=stage):
                row = plan_json(model + ["--zero", stage])
                memory = row["memory_bytes"]
                model_states = memory["params"] + memory["grads"] + memory["optimizer"]
                self.assertLess(abs(model_states / bytes_expected - 1), 0.01, (stage, model_states))
                self.assertEqual(row["layout"]["dp"], 64)
                self.assertEqual(row["modes"]["params"], "SG" if stage == 3 else "R")
                self.assertEqual((row["param_dtype"], row["reduce_dtype"]), ("bf16", "bf16"))

    def test_equals_mlptrain_predict(self):
        for ranks, layout in [(2, ["--dp", 2, "--zero", 2]), (4, ["--dp", 2, "--tp", 2, "--zero", 3]),
                              (4, ["--dp", 4, "--zero", 1, "--micro-batches", 2, "--recompute"]),
                              (2, ["--tp", 2, "--param-dtype", "bf16"])]:
            with self.subTest(ranks=ranks, layout=layout):
                metrics = self.path(f"predict{ranks}{len(layout)}.jsonl")
                run(SMALL + layout + ["--predict", "--metrics", metrics], ranks)
                with open(metrics) as handle:
                    predicted = next(json.loads(line) for line in handle if '"predict"' in line)
                row = plan_json(SMALL + layout + ["--world", ranks])
                self.assertEqual(row["memory_rank"], 0)  # these layouts load every rank alike
                for state in PLACED:
                    self.assertEqual(row["memory_bytes"][state], predicted["placement"][state]["predicted_bytes"], state)
                    self.assertEqual(row["modes"][state], predicted["placement"][state]["mode"], state)
                for op, entry in predicted["comm_per_step"].items():
                    self.assertEqual(row["comm_bytes_per_step"][op], entry["predicted_bytes"], op)

    def test_the_largest_rank_of_a_pipeline(self):
        row = plan_json(SMALL + ["--pp", 2, "--micro-batches", 4, "--world", 2])
        metrics = self.path("pipeline.jsonl")
        run(SMALL + ["--pp", 2, "--micro-batches", 4, "--predict", "--metrics", metrics], 2)
        with open(metrics) as handle:
            rank0 = next(json.loads(line) for line in handle if '"predict"' in line)
        total0 = sum(rank0["placement"][state]["predicted_bytes"] for state in PLACED)
        # The first stage keeps the most micro-batches in flight under 1F1B: it needs the most.
        self.assertEqual(row["memory_rank"], 0)
        self.assertEqual(row["memory_bytes"]["total"], total0)

    def test_a_million_ranks(self):
        row = plan_json(SMALL[:-2] + ["--global-batch", 2_000_000, "--world", 1_000_000, "--zero", 3])
        self.assertEqual(row["layout"]["dp"], 1_000_000)
        self.assertGreater(row["memory_bytes"]["optimizer"], 0)

    def test_table_and_help(self):
        result = plan(SMALL + ["--world", 4, "--dp", 4, "--zero", 2])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("ZeRO stage 2", result.stdout)
        self.assertIn("reduce_scatter", result.stdout)
        result = plan(["--help"])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("usage: mlpplan --world N", result.stdout)

    def test_bad_input_is_one_line_and_exit_2(self):
        trainer_line = run(SMALL + ["--tp", 3], 4, check=False).stderr.strip()
        for arguments, words in [(SMALL, ["--world N is required"]),
                                 (SMALL + ["--world", "many"], ["--world 'many'"]),
                                 (SMALL + ["--world", 0], ["--world '0'"]),
                                 (SMALL + ["--world", 4, "--frobnicate"], ["frobnicate"]),
                                 (SMALL + ["--world", 4, "--tp", 3], [trainer_line.split("error: ")[-1]])]:
            with self.subTest(arguments=arguments):
                result = plan(arguments)
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                lines = result.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, result.stderr)
                for word in words:
                    self.assertIn(word, lines[0])


if __name__ == "__main__":
    unittest.main()
