"""Hybrid sharding (--zero-shard-size K): ZeRO's shards over groups of K consecutive data-parallel
ranks, replicated across the dp / K groups. Every stage, alone and composed with tensor and
pipeline parallelism, experts, recomputation and micro-batches, reproduces the one-process run;
each rank holds the ZeRO figures with N = K; the traffic splits into the shard group's
reduce-scatters and gathers and one all-reduce of the shards a step across the replica group,
each group's bytes as predicted; checkpoints move between hybrid, plain ZeRO and one process."""
import math
import unittest

from common import TrainingTestCase

BASE = ["--dataset", "teacher", "--input-dim", "15", "--output-dim", "3", "--layers", "4",
        "--global-batch", "32", "--log-every", "0", "--lr", "3e-3"]
CLIP = ["--grad-clip", "0.05"]
DENSE = BASE + ["--hidden", "22"] + CLIP
LAYER_SIZES = [15 * 22 + 22, 22 * 22 + 22, 22 * 22 + 22, 22 * 3 + 3]
MOE = BASE + ["--hidden", "24", "--moe-every", "2", "--experts", "4", "--top-k", "2"]


def hybrid(stage, shard):
    return ["--zero", str(stage), "--zero-shard-size", str(shard)]


class HybridSharding(TrainingTestCase):
    def check(self, model, layouts):
        """Each layout reproduces one process, with its memory and bytes by group as predicted,
        and sums across a replica group."""
        def sums_across_replicas(flags, summary):
            groups = set(summary["comm_bytes_by_group"])
            self.assertIn("dp_replica" if "--ep" not in flags else "edp_replica", groups)
        return self.assert_layouts_reproduce_one_process(model, layouts, 12, sums_across_replicas)

    def test_every_stage_reproduces_one_process_with_the_figures_of_its_shard_group(self):
        layouts = [(4, hybrid(stage, 2) + ["--micro-batches", "2"]) for stage in (1, 2, 3)]
        layouts += [(4, hybrid(3, 2) + ["--recompute", "--micro-batches", "2"]),
                    (8, hybrid(2, 4)), (8, hybrid(3, 2) + ["--tp", "2", "--micro-batches", "2"]),
                    (8, hybrid(1, 2) + ["--pp", "2", "--micro-batches", "4"]),
                    (8, hybrid(3, 2) + ["--pp", "2", "--micro-batches", "2", "--schedule", "gpipe"])]
        results = self.check(DENSE, layouts)
        clipped, _, _ = self.train("clipped", DENSE + ["--steps", "3"], 1)
        self.assertTrue(any(step["grad_norm"] > 0.05 for step in clipped))  # the clip's norm is the global one
        # Four ranks in two shard groups of two: each rank holds the ZeRO figures for N = 2 (the
        # units padded to the data-parallel group), and the shards cross the replica group once.
        padded = sum(math.ceil(size / 4) * 4 for size in LAYER_SIZES)
        for stage in (1, 2, 3):
            summary = results[4, tuple(hybrid(stage, 2) + ["--micro-batches", "2"])]
            held = {state: summary["placement"][state]["measured_bytes"] for state in ("params", "grads", "optimizer")}
            formula = {1: 8 * padded + 8 * padded // 2, 2: 4 * padded + 12 * padded // 2, 3: 16 * padded // 2}[stage]
            self.assertEqual(sum(held.values()), formula, f"stage {stage}: {held}")
            self.assertEqual(summary["comm_bytes_by_group"]["dp_replica"], {"all_reduce": 4 * padded // 2})
            shard_group = summary["comm_bytes_by_group"]["dp_shard"]
            self.assertEqual(shard_group["reduce_scatter"], 4 * padded * (1 if stage == 1 else 2))
            self.assertNotIn("dp", summary["comm_bytes_by_group"])  # nothing over the whole group

    def test_experts_shard_over_their_ranks_in_each_shard_group(self):
        # ep 2 in shard groups of 4 (two ranks of each expert in a group), and ep 4 in shard
        # groups of 2 (each expert rank alone in its group: summed across all its replicas).
        self.check(MOE, [(8, hybrid(3, 4) + ["--ep", "2", "--micro-batches", "2"]),
                         (8, hybrid(2, 2) + ["--ep", "4"]),
                         (8, hybrid(1, 2) + ["--ep", "2", "--tp", "2"])])

    def test_checkpoints_move_between_hybrid_plain_and_one_process(self):
        model = DENSE + ["--micro-batches", "2"]
        self.assert_resumes_across_layouts(model, [
            (hybrid(3, 2), 4, [], 1),
            ([], 1, hybrid(1, 2), 4),
            (hybrid(2, 2), 4, hybrid(3, 4) + ["--tp", "2"], 8),
            (["--zero", "3"], 4, hybrid(3, 2), 4),
        ], 12)


if __name__ == "__main__":
    unittest.main()
