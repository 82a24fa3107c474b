"""mlpplan, the placement calculator: the ZeRO paper's figure (Psi = 7.5B on an MLP of 112 x 8192,
N_d = 64, bf16 parameters and gradients with fp32 Adam: 16, 4 + 12/N_d, 2 + 14/N_d and 16/N_d bytes
per parameter) within 1 %, and its traffic (plain DP's 2 Psi against ZeRO-3's 3 Psi bus bytes); for
layouts at 2 and 4 ranks, exactly what mlptrain --predict gives (the same functions, no launch);
bus bytes on the links the rank grid and --ranks-per-node put them on; the busiest expert
rank's MoE activations at --expert-imbalance and --expert-peak-imbalance; sequence parallelism's
split rows; every layout of a world ranked; a million ranks answered; bad input (flags, presets,
cluster and calibration files) one line and exit 2, a layout mlptrain refuses refused with
mlptrain's line. The step time's model: test_mlpplan_time.py."""
import json
import os
import subprocess
import unittest

from common import TrainingTestCase, run
from benchlib import program_list  # noqa: E402  (common puts scripts/ on the path)

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

    def test_expert_imbalance_plans_the_busiest_ranks_moe_activations(self):
        """--expert-imbalance F: where a rank holds some of an MoE layer's experts, its experts'
        rows, and what a micro-batch keeps of them for backward, are F times the balanced share;
        --expert-peak-imbalance P, where given, sets what they keep instead (the most uneven
        step's rows, which a rank's peak follows), F then leaving it alone.
        From the layer's contract: a rank of ep 2 holding 2 of 4 experts, top-2 routing, gets half
        of the expert group's 2 x rows x 2 assignments balanced; each keeps its expert input,
        pre-activation and output rows (three rows of hidden fp32 values), its token and weight,
        and the two reorderings of the received rows (int32 each). Where every rank holds every
        expert (--dp 2) the routing moves no rows between ranks, and F changes nothing."""
        hidden, rows = 256, 512  # the rank's rows: a global batch of 1024 over 2 ranks
        moe = ["--world", 2, "--layers", 4, "--hidden", hidden, "--global-batch", 1024, "--input-dim", 64,
               "--output-dim", 16, "--moe-every", 1, "--experts", 4, "--top-k", 2]  # hidden layers 1 and 2

        def activations(flags, factor, peak=None):
            peak_flags = [] if peak is None else ["--expert-peak-imbalance", peak]
            return plan_json(moe + flags + ["--expert-imbalance", factor] + peak_flags)["memory_bytes"]["activations"]

        balanced_assignments = 2 * rows * 2 // 2
        bytes_per_assignment = 3 * hidden * 4 + 4 * (2 + 2)
        for factor in (1.5, 2):
            with self.subTest(factor=factor):
                more = 2 * round(balanced_assignments * (factor - 1)) * bytes_per_assignment
                self.assertEqual(activations(["--ep", 2], factor) - activations(["--ep", 2], 1), more)
                self.assertEqual(activations(["--ep", 2], 1, peak=factor) - activations(["--ep", 2], 1), more)
                self.assertEqual(activations(["--ep", 2], 3, peak=factor), activations(["--ep", 2], 1, peak=factor))
        self.assertEqual(activations(["--dp", 2], 1), activations(["--dp", 2], 2))

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
        bus factor 2 x 1/2) and the loop's world sums (7 doubles, bus factor 2 x 15/16) cross."""
        model = ["--layers", 4, "--hidden", 32, "--input-dim", 16, "--output-dim", 16, "--global-batch", 64,
                 "--world", 16, "--ranks-per-node", 8, "--zero", 3]
        psi = 16 * 32 + 32 + 2 * (32 * 32 + 32) + 32 * 16 + 16  # every layer a multiple of 16: no padding
        world_sums = 8 * 7 * 2 * 15 / 16
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
        # Every schedule the programs know where there is a pipeline, each where its chunks fit the
        # 4 layers: one chunk a stage, or 2 (a V, or a chunked schedule at V = 2) on 2 stages only.
        schedules = {(r["layout"]["pp"], r["layout"]["schedule"], r["layout"]["virtual_stages"]) for r in rows}
        expected = {(1, "none", 1)}
        for schedule in program_list("schedules"):
            chunks = 2 if schedule["chunked"] or schedule["placement"] == "v_shape" else 1
            for stages in (2, 4):
                if stages * chunks <= 4:
                    expected.add((stages, schedule["name"], chunks if schedule["chunked"] else 1))
        self.assertEqual(schedules, expected)
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
