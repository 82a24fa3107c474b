"""mlpplan's step time: its arithmetic from a calibration written here (GEMMs at the share of the
rate their rows reach, bias/GELU passes, MoE layers' moved rows, AdamW, the samples' reads), each
pipeline schedule's bubble from its own lists, and layerbench's lines as the calibration reads them
under mpiexec."""
import json
import math
import os
import subprocess
import unittest

import h5py
import numpy as np

from common import MPIEXEC, TrainingTestCase
from test_mlpplan import MLPPLAN, SMALL, plan_json


class MlpplanTime(TrainingTestCase):
    def test_layerbench_under_mpiexec_prints_each_ranks_line_whole(self):
        """The calibration's input: run as the world runs, every rank's object on a line of its
        own, in rank order (merged by mpiexec from two processes, lines had interleaved)."""
        layerbench = os.path.join(os.path.dirname(MLPPLAN), "layerbench")
        for _ in range(3):
            result = subprocess.run([MPIEXEC, "-n", "2", layerbench, "16", "32", "32", "2", "--dtype", "fp32,bf16"],
                                    capture_output=True, text=True, timeout=120, check=True)
            lines = result.stdout.splitlines()
            self.assertEqual([json.loads(line)["dtype"] for line in lines], ["fp32", "fp32", "bf16", "bf16"])

    def test_step_time_from_a_calibration(self):
        """The step's arithmetic on one rank from rates written here: GEMMs at 6 multiply-adds'
        FLOPs per parameter-sample, the bias/GELU passes three times per output element, the
        update per parameter."""
        gemm_gflops, threads, adamw_ms, gelu_ms = 50.0, 1, 2.0, 0.5
        bench = self.path("bench.jsonl")
        rows = [{"dtype": "fp32", "gemm_gflops": gemm_gflops, "kernels": f"test; {threads} GEMM thread(s)",
                 "adamw_ms": adamw_ms, "gelu_forward_ms": gelu_ms, "rows": 100, "in": 99, "out": 100},
                {"collective": "all_reduce", "path": "mpi-host", "dtype": "fp32", "bytes": 8, "time_us": 10.0,
                 "busbw_gbps": 1.0, "correct": True}]
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        row = plan_json(SMALL + ["--world", 1, "--calibrate", bench])
        widths = [(16, 32), (32, 32), (32, 32), (32, 8)]
        parameters = sum(i * o + o for i, o in widths)
        elements = sum(o for _, o in widths) * 32
        cores = os.cpu_count()
        # Nothing needs the gradient of the model's inputs: the first layer does not compute it.
        first = 16 * 32 + 32
        gemm = (6 * parameters - 2 * first) * 32 / (gemm_gflops * 1e9 * cores / threads)
        elementwise = 3 * elements / (100 * 100 / (gelu_ms * 1e-3))
        update = parameters / ((99 * 100 + 100) / (adamw_ms * 1e-3))
        step = row["step_ms"]
        self.assertAlmostEqual(step["compute"], 1e3 * (gemm + elementwise + update), delta=1e-9)
        self.assertEqual((step["exposed_comm"], step["bubble"], step["data"]), (0, 0, 0))  # no data rates given
        self.assertAlmostEqual(row["samples_per_s"], 32 / (step["total"] * 1e-3), delta=1e-6)
        # The samples' inputs at one core's measured rate (the bench read 100 samples of 99 values),
        # on the step's path: the built-in teacher data here, the held file's rate for a file that
        # fits under --data-memory-mb, and nothing modelled for one read a batch at a time.
        teacher_ms, held_ms = 0.8, 0.05
        rows[0].update({"teacher_read_ms": teacher_ms, "held_file_read_ms": held_ms})
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        fed = plan_json(SMALL + ["--world", 1, "--calibrate", bench])["step_ms"]
        self.assertAlmostEqual(fed["data"], 1e3 * 32 * 16 / (100 * 99 / (teacher_ms * 1e-3)), delta=1e-9)
        self.assertAlmostEqual(fed["total"], fed["compute"] + fed["data"], delta=1e-9)
        two_stages = plan_json(SMALL + ["--world", 2, "--pp", 2, "--calibrate", bench])["step_ms"]
        self.assertAlmostEqual(two_stages["data"], fed["data"], delta=1e-9)  # the first stage reads the inputs
        data = self.path("data.h5")
        with h5py.File(data, "w") as file:
            file["x"] = np.zeros((64, 16), np.uint8)
            file["y"] = np.zeros((64, 8), np.float32)
        held = plan_json(["--layers", 4, "--hidden", 32, "--global-batch", 32, "--dataset", "hdf5", "--data-path", data,
                          "--world", 1, "--calibrate", bench])["step_ms"]
        self.assertAlmostEqual(held["data"], 1e3 * 32 * 16 / (100 * 99 / (held_ms * 1e-3)), delta=1e-9)
        read = plan_json(["--layers", 4, "--hidden", 32, "--global-batch", 32, "--dataset", "hdf5", "--data-path", data,
                          "--data-memory-mb", 0, "--world", 1, "--calibrate", bench])["step_ms"]
        self.assertEqual(read["data"], 0)
        # With --sequence, the GEMMs of a step's sequence set the rate.
        sequence_ms = 4.0
        rows[0].update({"sequence_layers": 6, "library_sequence_gemm_ms": sequence_ms})
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        sequenced = plan_json(SMALL + ["--world", 1, "--calibrate", bench])["step_ms"]
        rate = 2 * 100 * 99 * 100 / (sequence_ms * 1e-3) * cores / threads
        self.assertAlmostEqual(sequenced["compute"],
                               1e3 * ((6 * parameters - 2 * first) * 32 / rate + elementwise + update),
                               delta=1e-9)
        # Timed at two row counts, the GEMMs of the step's 32 rows run at the share of the best
        # rate interpolated in log rows between them: half of it at 25 rows, all at 100.
        fewer_rows = {"dtype": "fp32", "gemm_gflops": gemm_gflops, "kernels": f"test; {threads} GEMM thread(s)",
                      "rows": 25, "in": 99, "out": 100, "sequence_layers": 6, "library_sequence_gemm_ms": sequence_ms / 2}
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows + [fewer_rows]) + "\n")
        by_rows = plan_json(SMALL + ["--world", 1, "--calibrate", bench])["step_ms"]
        share = 0.5 + 0.5 * math.log(32 / 25) / math.log(100 / 25)
        self.assertAlmostEqual(by_rows["compute"],
                               1e3 * ((6 * parameters - 2 * first) * 32 / (rate * share) + elementwise + update),
                               delta=1e-9)
        # MoE layers (1 and 2 here): router and k experts' GEMMs, the experts' bias/GELU passes
        # (k rows a token, backward two), and the rows they move at the gather rate: forward
        # gathers k rows and sums k into each token's row (written once), backward gathers, dots
        # and sums k each into fp32 rows of the input gradient, which are then rounded.
        gather_ms, experts, top_k = 0.05, 4, 2
        del rows[0]["sequence_layers"], rows[0]["library_sequence_gemm_ms"]
        rows[0]["gather_rows_ms"] = gather_ms
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        moe = plan_json(SMALL + ["--world", 1, "--calibrate", bench, "--moe-every", 1, "--experts", experts,
                                 "--top-k", top_k])["step_ms"]
        expert = 32 * 32 + 32
        multiply_adds = (16 * 32 + 32) + (32 * 8 + 8) + 2 * (experts * 32 + top_k * expert)
        gemm = (6 * multiply_adds - 2 * first) * 32 / (gemm_gflops * 1e9 * cores / threads)
        passes = 3 * (32 + 8 + 2 * top_k * 32) * 32
        moved = 2 * ((2 + 3) * top_k * 32 + 32) * 32
        parameters = (16 * 32 + 32) + (32 * 8 + 8) + 2 * (experts * 32 + experts * expert)
        update = parameters / ((99 * 100 + 100) / (adamw_ms * 1e-3))
        expected = gemm + passes / (100 * 100 / (gelu_ms * 1e-3)) + moved / (100 * 100 / (gather_ms * 1e-3)) + update
        self.assertAlmostEqual(moe["compute"], 1e3 * expected, delta=1e-9)
        # Timed at two row counts: an expert's GEMMs run at the share of its rows when evenly
        # routed (32 rows x 2 / 4 experts = 16, below the 25 timed: half the rate), the dense
        # layers' at the step's 32 rows.
        rows[0].update({"sequence_layers": 6, "library_sequence_gemm_ms": sequence_ms})
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows + [fewer_rows]) + "\n")
        moe_by_rows = plan_json(SMALL + ["--world", 1, "--calibrate", bench, "--moe-every", 1, "--experts", experts,
                                         "--top-k", top_k])["step_ms"]
        dense = (16 * 32 + 32) + (32 * 8 + 8)
        gemm = ((6 * dense - 2 * first) * 32 / (rate * share) +
                6 * (multiply_adds - dense) * 32 / (rate * 0.5))
        expected = gemm + passes / (100 * 100 / (gelu_ms * 1e-3)) + moved / (100 * 100 / (gather_ms * 1e-3)) + update
        self.assertAlmostEqual(moe_by_rows["compute"], 1e3 * expected, delta=1e-9)

    def test_fp8_plans_dense_gemms_at_the_devices_fp8_rate(self):
        """On the H100 preset (989.4 bf16, 1978.9 fp8 dense TFLOP/s) --fp8 takes the dense layers'
        GEMM FLOPs, 6 multiply-adds a parameter and sample less the first layer's input
        gradient, from bf16's rate to fp8's and leaves the rest of the step; on the A100 preset
        (no fp8 tensor cores) it changes nothing."""
        model = ["--world", 1, "--param-dtype", "bf16", "--layers", 4, "--hidden", 1024, "--global-batch", 1024,
                 "--input-dim", 256, "--output-dim", 16]
        layer_macs = [256 * 1024 + 1024, 1024 * 1024 + 1024, 1024 * 1024 + 1024, 1024 * 16 + 16]  # the bias as above
        flops = 2 * (3 * sum(layer_macs) - layer_macs[0]) * 1024
        bf16, fp8 = (plan_json(model + fp8_flags)["step_ms"]["compute"] for fp8_flags in ([], ["--fp8", "tensorwise"]))
        self.assertAlmostEqual(bf16 - fp8, 1e3 * flops * (1 / 989.4e12 - 1 / 1978.9e12), delta=1e-9)
        a100 = ["--cluster", "a100-80gb-8"]
        self.assertEqual(plan_json(model + a100)["step_ms"], plan_json(model + a100 + ["--fp8", "rowwise"])["step_ms"])

    def test_a_pipeline_bubble_shrinks_with_micro_batches(self):
        bubbles = []
        for micro_batches in (2, 4, 8):
            row = plan_json(SMALL[:-2] + ["--global-batch", 64, "--world", 4, "--pp", 4, "--micro-batches", micro_batches])
            step = row["step_ms"]
            self.assertAlmostEqual(step["compute"] + step["exposed_comm"] + step["bubble"], step["total"], delta=1e-9)
            bubbles.append(step["bubble"] / step["total"])
        self.assertTrue(bubbles[0] > bubbles[1] > bubbles[2] > 0, bubbles)

    def test_each_schedules_bubble_from_its_own_lists(self):
        """On equal stages whose forward, input gradient and weight gradient take equal time
        (hidden-wide layers behind a first layer of one input, whose work is 0.2 % of a stage's;
        transfers and elementwise passes nearly free) the planner's bubble,
        from the trainer's own lists per chunk with B and W apart, is each schedule's theory:
        (P-1)/(M+P-1) for GPipe and 1F1B, (P-1)/(VM+P-1) interleaved, (P-1)/(3M+P-1) ZB-H1,
        (P-1)/(6M+P-1) ZB-V (M >= 2P-1)."""
        bench = self.path("free_transfers.jsonl")
        rows = [{"dtype": "fp32", "gemm_gflops": 1.0, "kernels": "test; 1 GEMM thread(s)", "adamw_ms": 1e-9,
                 "gelu_forward_ms": 1e-9, "rows": 100, "in": 99, "out": 100},
                *({"collective": collective, "path": "mpi-host", "dtype": "fp32", "bytes": 8, "time_us": 0.0,
                   "busbw_gbps": 1e9, "correct": True} for collective in ("send_recv", "all_reduce"))]
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        stages, micro_batches = 4, 8
        model = ["--layers", 17, "--hidden", 512, "--input-dim", 1, "--output-dim", 512, "--global-batch", 64,
                 "--world", stages, "--pp", stages, "--micro-batches", micro_batches, "--calibrate", bench]
        for schedule, chunks, work in (("gpipe", 1, 1), ("1f1b", 1, 1), ("interleaved", 2, 2), ("interleaved", 4, 4),
                                       ("zb-h1", 1, 3), ("zb-v", 1, 6)):
            with self.subTest(schedule=schedule, chunks=chunks):
                step = plan_json(model + ["--schedule", schedule] +
                                 (["--virtual-stages", chunks] if chunks > 1 else []))["step_ms"]
                theory = (stages - 1) / (work * micro_batches + stages - 1)
                self.assertAlmostEqual(step["bubble"] / step["total"], theory, delta=1e-3)

if __name__ == "__main__":
    unittest.main()
