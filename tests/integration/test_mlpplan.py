"""mlpplan, the placement calculator: the ZeRO paper's figure (Psi = 7.5B on an MLP of 112 x 8192,
N_d = 64, bf16 parameters and gradients with fp32 Adam: 16, 4 + 12/N_d, 2 + 14/N_d and 16/N_d bytes
per parameter) within 1 %, and its traffic (plain DP's 2 Psi against ZeRO-3's 3 Psi bus bytes); for
layouts at 2 and 4 ranks, exactly what mlptrain --predict gives (the same functions, no launch);
bus bytes on the links the rank grid and --ranks-per-node put them on; the step time's arithmetic
from a calibration written here; sequence parallelism's split rows; every layout of a world
ranked; a million ranks answered; bad input (flags, presets, cluster and calibration files) one
line and exit 2, a layout mlptrain refuses refused with mlptrain's line."""
import json
import math
import os
import subprocess
import unittest

import h5py
import numpy as np

from common import MPIEXEC, TrainingTestCase, run

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
    def test_layerbench_under_mpiexec_prints_each_ranks_line_whole(self):
        """The calibration's input: run as the world runs, every rank's object on a line of its
        own, in rank order (merged by mpiexec from two processes, lines had interleaved)."""
        layerbench = os.path.join(os.path.dirname(MLPPLAN), "layerbench")
        for _ in range(3):
            result = subprocess.run([MPIEXEC, "-n", "2", layerbench, "16", "32", "32", "2", "--dtype", "fp32,bf16"],
                                    capture_output=True, text=True, timeout=120, check=True)
            lines = result.stdout.splitlines()
            self.assertEqual([json.loads(line)["dtype"] for line in lines], ["fp32", "fp32", "bf16", "bf16"])

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

    def test_the_placement_articles_one_billion_parameters_in_fp32(self):
        # 15 layers of 8192 x 8192: 1.007e9 parameters; fp32 P 4 GB, G 4 GB, O (two moments) 8 GB.
        row = plan_json(["--layers", 15, "--hidden", 8192, "--input-dim", 8192, "--output-dim", 8192,
                         "--global-batch", 8, "--world", 1])
        parameters = 15 * (8192 * 8192 + 8192)
        for state, bytes_per_parameter, article_gb in [("params", 4, 4), ("grads", 4, 4), ("optimizer", 8, 8)]:
            self.assertEqual(row["memory_bytes"][state], bytes_per_parameter * parameters, state)
            self.assertLess(abs(row["memory_bytes"][state] / (article_gb * 1e9) - 1), 0.01, state)

    def test_equals_mlptrain_predict(self):
        for ranks, layout in [(2, ["--dp", 2, "--zero", 2]), (4, ["--dp", 2, "--tp", 2, "--zero", 3]),
                              (4, ["--dp", 4, "--zero", 1, "--micro-batches", 2, "--recompute"]),
                              (2, ["--tp", 2, "--param-dtype", "bf16"]),
                              (4, ["--dp", 2, "--tp", 2, "--sequence-parallel", "--recompute", "--zero", 1])]:
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

    def test_each_schedule_plans_what_its_stages_predict(self):
        """Under interleaved, ZB-H1 and ZB-V the planner's largest rank holds what that rank's own
        --predict says (activations follow each schedule's lists, per chunk, B keeping what W frees)."""
        model = ["--hidden", 32, "--global-batch", 32, "--layers", 8, "--micro-batches", 4]
        # (ZB-V's stage 0 holds the first and the last layers: wide ones make it the largest rank.)
        for schedule, widths in ((["--schedule", "interleaved", "--virtual-stages", 2], (16, 8)),
                                 (["--schedule", "zb-h1"], (16, 8)), (["--schedule", "zb-v"], (256, 256))):
            with self.subTest(schedule=schedule):
                layout = model + ["--input-dim", widths[0], "--output-dim", widths[1], "--pp", 2] + schedule
                row = plan_json(layout + ["--world", 2])
                metrics = self.path(f"predict_{schedule[1]}.jsonl")
                run(layout + ["--predict", "--metrics", metrics], 2)
                with open(metrics) as handle:
                    rank0 = next(json.loads(line) for line in handle if '"predict"' in line)
                self.assertEqual(row["memory_rank"], 0)
                for state in PLACED:
                    self.assertEqual(row["memory_bytes"][state], rank0["placement"][state]["predicted_bytes"], state)

    def test_a_million_ranks(self):
        row = plan_json(SMALL[:-2] + ["--global-batch", 2_000_000, "--world", 1_000_000, "--zero", 3])
        self.assertEqual(row["layout"]["dp"], 1_000_000)
        self.assertGreater(row["memory_bytes"]["optimizer"], 0)

    def test_table_and_help(self):
        result = plan(SMALL + ["--world", 4, "--dp", 4, "--zero", 2])
        self.assertEqual(result.returncode, 0, result.stderr)
        self.assertIn("zero2", result.stdout)
        self.assertIn("cluster h100-sxm-8", result.stdout)
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

    def test_the_zero_papers_traffic_and_its_links(self):
        model = ["--layers", 112, "--hidden", 8192, "--input-dim", 8192, "--output-dim", 8192, "--global-batch", 64,
                 "--param-dtype", "bf16", "--reduce-dtype", "bf16", "--world", 64]
        bus = {}
        for stage, nodes in [(0, 1), (3, 1), (0, 8)]:
            row = plan_json(model + ["--zero", stage, "--ranks-per-node", 64 // nodes])
            bus[stage, nodes] = row["bus_bytes_per_step"]
            inside, across = row["bus_bytes_per_step"]["intra_node"], row["bus_bytes_per_step"]["inter_node"]
            self.assertEqual(across == 0, nodes == 1, row["bus_bytes_per_step"])
            self.assertEqual(inside == 0, nodes > 1, row["bus_bytes_per_step"])
        # Per rank, bf16: DP all-reduces 2 Psi x 2 bytes x (N-1)/N, ZeRO-3 moves 3 Psi (the paper's 1.5x).
        dp, zero3 = bus[0, 1]["intra_node"], bus[3, 1]["intra_node"]
        self.assertLess(abs(dp / (2 * 7.5e9 * 2 * 63 / 64) - 1), 0.01)
        self.assertLess(abs(zero3 / dp - 1.5), 0.01)
        self.assertEqual(bus[0, 8]["inter_node"], bus[0, 1]["intra_node"])

    def test_tensor_parallelism_inside_a_node_data_parallelism_across(self):
        for tp, expect_intra, expect_inter in [(8, True, True), (1, False, True)]:
            with self.subTest(tp=tp):
                row = plan_json(SMALL[:-2] + ["--global-batch", 64, "--world", 16, "--tp", tp, "--ranks-per-node", 8])
                links = row["bus_bytes_per_step"]
                self.assertEqual(links["intra_node"] > 0, expect_intra, links)
                self.assertEqual(links["inter_node"] > 0, expect_inter, links)

    def test_hybrid_sharding_keeps_all_but_one_all_reduce_inside_a_node(self):
        """ZeRO-3 over 16 ranks in two nodes of 8: plain, every collective of the data-parallel
        group crosses nodes; hybrid over the 8 ranks of a node, the reduce-scatter and the two
        gathers stay inside it (bus factor 7/8) and only the all-reduce of the shards (Psi / 8,
        bus factor 2 x 1/2) and the loop's world sums (6 doubles, bus factor 2 x 15/16) cross."""
        model = ["--layers", 4, "--hidden", 32, "--input-dim", 16, "--output-dim", 16, "--global-batch", 64,
                 "--world", 16, "--ranks-per-node", 8, "--zero", 3]
        psi = 16 * 32 + 32 + 2 * (32 * 32 + 32) + 32 * 16 + 16  # every layer a multiple of 16: no padding
        world_sums = 8 * 6 * 2 * 15 / 16
        plain = plan_json(model)
        hybrid = plan_json(model + ["--zero-shard-size", 8])
        self.assertEqual(plain["bus_bytes_per_step"], {"intra_node": 0, "inter_node": 3 * psi * 4 * 15 / 16 + world_sums})
        self.assertEqual(hybrid["bus_bytes_per_step"], {"intra_node": 3 * psi * 4 * 7 / 8,
                                                        "inter_node": psi // 8 * 4 + world_sums})
        # The state is the ZeRO-3 figure of 8 ranks, twice plain's over 16.
        for state in ("params", "grads", "optimizer"):
            self.assertEqual(hybrid["memory_bytes"][state], 2 * plain["memory_bytes"][state], state)
        self.assertEqual(hybrid["layout"]["zero_shard_size"], 8)

    def test_sequence_parallelism_divides_the_replicated_rows(self):
        """Four layers of 8192 at tp 8: layer 1 (row-parallel, followed by a column-parallel
        layer) holds its pre-activation and GELU output [R, 8192] in bf16 whole on every rank;
        split, an eighth of them. In bf16 its partial products travel whole to every rank (an
        all-gather of 8 x [R, 8192]: the bias joins their fp32 sum, DESIGN.md §2.7); split, each
        rank receives its block of rows from every rank (an all-to-all of [R, 8192]). Layer 2's
        input-gradient all-reduce becomes a reduce-scatter of the same size, and the gathers of
        [R, 8192] run before layer 2 in forward and backward and for layer 1's gradient."""
        rows, hidden = 64, 8192
        model = ["--layers", 4, "--hidden", hidden, "--input-dim", 1024, "--output-dim", 1024, "--global-batch", rows,
                 "--world", 8, "--tp", 8, "--param-dtype", "bf16"]
        plain = plan_json(model)
        split = plan_json(model + ["--sequence-parallel"])
        replicated = 2 * rows * hidden * 2
        self.assertEqual(plain["memory_bytes"]["activations"] - split["memory_bytes"]["activations"],
                         replicated - replicated // 8)
        boundary = rows * hidden * 2
        plain_bytes, split_bytes = plain["comm_bytes_per_step"], split["comm_bytes_per_step"]
        self.assertEqual(split_bytes["all_reduce"], plain_bytes["all_reduce"] - boundary)
        self.assertEqual(split_bytes["reduce_scatter"], boundary)
        self.assertEqual(split_bytes["all_to_all"], boundary)
        self.assertEqual(split_bytes["all_gather"] - plain_bytes["all_gather"], 3 * boundary - 8 * boundary)
        self.assertTrue(split["layout"]["sequence_parallel"])

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
        # gathers k rows and scatter-adds k into a zeroed output, backward gathers, dots and
        # scatter-adds k each into a zeroed input gradient.
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
        moved = 2 * ((2 + 3) * top_k * 32 + 2 * 32) * 32
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

    def test_every_layout_of_a_world_ranked(self):
        result = plan(SMALL[:-2] + ["--global-batch", 64, "--world", 8, "--layouts", "all",
                                    "--micro-batch-choices", "1,2", "--json"])
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        layouts = {json.dumps(row["layout"], sort_keys=True) for row in rows}
        self.assertEqual(len(layouts), len(rows))
        splits = {(r["layout"]["dp"], r["layout"]["tp"], r["layout"]["pp"]) for r in rows}
        self.assertEqual(splits, {(8, 1, 1), (4, 2, 1), (4, 1, 2), (2, 4, 1), (2, 2, 2), (2, 1, 4), (1, 8, 1),
                                  (1, 4, 2), (1, 2, 4)})  # pp 8 > 4 layers: refused
        self.assertEqual({r["layout"]["zero"] for r in rows}, {0, 1, 2, 3})
        # One node of 8 holds the world: no shard group smaller than the data-parallel group.
        self.assertEqual({r["layout"]["zero_shard_size"] for r in rows}, {0})
        # In nodes of 2, ZeRO also shards over a node's data-parallel ranks where dp spans nodes.
        result = plan(SMALL[:-2] + ["--global-batch", 64, "--world", 8, "--ranks-per-node", 2, "--layouts", "all",
                                    "--json"])
        hybrid = [json.loads(line)["layout"] for line in result.stdout.splitlines()]
        hybrid = [layout for layout in hybrid if layout["zero_shard_size"] > 0]
        self.assertEqual({(l["dp"], l["tp"], l["zero_shard_size"]) for l in hybrid}, {(8, 1, 2), (4, 1, 2)})  # dp 2 fills a node
        self.assertEqual({l["zero"] for l in hybrid}, {1, 2, 3})
        # Sequence parallelism with tensor parallelism, and only there.
        self.assertEqual({r["layout"]["tp"] > 1 for r in rows if r["layout"]["sequence_parallel"]}, {True})
        self.assertEqual({r["layout"]["sequence_parallel"] for r in rows if r["layout"]["tp"] > 1}, {False, True})
        # A layout's own options given with --layouts all are choices, not a layout to check alone;
        # --virtual-stages joins the chunk counts tried.
        given = plan(SMALL[2:-2] + ["--layers", 6, "--global-batch", 64, "--world", 8, "--layouts", "all", "--pp", 2,
                                    "--schedule", "interleaved", "--virtual-stages", 3, "--micro-batches", 2,
                                    "--sequence-parallel", "--json"])
        self.assertEqual(given.returncode, 0, given.stderr)
        chunks = {json.loads(line)["layout"]["virtual_stages"] for line in given.stdout.splitlines()}
        self.assertEqual(chunks, {1, 2, 3})  # 6 layers: 2 stages x 4 chunks do not fit
        # Every schedule where there is a pipeline; model chunks where a stage's layers split (2 x 2 <= 4).
        schedules = {(r["layout"]["pp"], r["layout"]["schedule"], r["layout"]["virtual_stages"]) for r in rows}
        self.assertEqual(schedules, {(1, "none", 1), (2, "1f1b", 1), (2, "gpipe", 1), (2, "zb-h1", 1),
                                     (2, "interleaved", 2), (2, "zb-v", 1), (4, "1f1b", 1), (4, "gpipe", 1),
                                     (4, "zb-h1", 1)})  # ZB-V's 2 chunks a stage: 4 layers fill 2 stages
        fitting = [r["step_ms"]["total"] for r in rows if r["fits"]]
        self.assertEqual(fitting, sorted(fitting))
        self.assertTrue(all(r["fits"] for r in rows[:len(fitting)]))
        # One of them as mlpplan answers for it alone.
        chosen = rows[len(rows) // 2]["layout"]
        alone = plan_json(SMALL[:-2] + ["--global-batch", 64, "--world", 8, "--dp", chosen["dp"], "--tp", chosen["tp"],
                                        "--pp", chosen["pp"], "--zero", chosen["zero"],
                                        "--zero-shard-size", chosen["zero_shard_size"],
                                        "--micro-batches", chosen["micro_batches"]] +
                          (["--recompute"] if chosen["recompute"] else []) +
                          (["--sequence-parallel"] if chosen["sequence_parallel"] else []) +
                          (["--schedule", chosen["schedule"], "--virtual-stages", chosen["virtual_stages"]]
                           if chosen["pp"] > 1 else []))
        self.assertEqual(alone, rows[len(rows) // 2])

    def test_bad_cluster_input_is_one_line_and_exit_2(self):
        broken = self.path("broken.json")
        with open(broken, "w") as handle:
            json.dump({"devices_per_node": 8, "device_memory_gb": 80}, handle)
        empty = self.path("empty.jsonl")
        with open(empty, "w") as handle:
            handle.write("{}\n")
        for arguments, words in [(["--cluster", "tpu-pod"], ["--cluster tpu-pod", "h100-sxm-8"]),
                                 (["--cluster", broken], [broken, "gemm_tflops.fp32"]),
                                 (["--calibrate", empty], [empty, "layerbench"]),
                                 (["--calibrate"], ["--calibrate needs"]),
                                 (["--layouts", "some"], ["--layouts 'some'"]),
                                 (["--layouts", "all", "--lr", "-1"], ["--lr"]),
                                 (["--top", "-1"], ["--top '-1'"]),
                                 (["--micro-batch-choices", "1,x"], ["--micro-batch-choices 'x'"])]:
            with self.subTest(arguments=arguments):
                result = plan(SMALL + ["--world", 2] + arguments)
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                lines = result.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, result.stderr)
                for word in words:
                    self.assertIn(word, lines[0])


if __name__ == "__main__":
    unittest.main()
