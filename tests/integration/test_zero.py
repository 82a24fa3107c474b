"""ZeRO stages 1-3 on the data-parallel group: every stage reproduces the one-process run; the
memory each rank holds and the bytes each step moves are exactly the ZeRO figures (padding
included); checkpoints move between stages and rank counts; dp = 1 runs unsharded."""
import math
import os
import unittest

from common import TrainingTestCase, read_checkpoint, read_metrics, run

BASE = ["--dataset", "teacher", "--input-dim", "15", "--output-dim", "3", "--layers", "4",
        "--global-batch", "24", "--log-every", "0", "--lr", "3e-3"]
MODEL = BASE + ["--hidden", "21"]
LAYER_SIZES = [15 * 21 + 21, 21 * 21 + 21, 21 * 21 + 21, 21 * 3 + 3]  # elements per layer (unit)
CLIP = ["--grad-clip", "0.05"]


def padded(ranks):
    return [math.ceil(size / ranks) * ranks for size in LAYER_SIZES]


def expected_memory(stage, ranks):
    """Bytes each rank holds at its peak: model state, and the unit buffers the collectives work
    on (gathered parameters, unit gradients being reduce-scattered), charged as comm_buffers."""
    if stage == 0:
        total = sum(LAYER_SIZES)
        return {"params": 4 * total, "grads": 4 * total, "optimizer": 8 * total, "comm_buffers": 0}
    units = padded(ranks)
    total, largest = sum(units), max(units)
    shard = total // ranks
    return {"params": 4 * total if stage <= 2 else 4 * shard,
            "grads": 4 * total if stage == 1 else 4 * shard,
            "optimizer": 8 * shard,
            # stage 2: two unit gradient buffers; stage 3: two gathered units (a unit's
            # gradients overwrite its gathered parameters in backward), each on a 256-byte boundary
            "comm_buffers": {1: 0, 2: 2 * 4 * largest, 3: 2 * ((4 * largest + 255) // 256 * 256)}[stage]}


def expected_comm(stage, ranks, micro_batches):
    """Bytes per step of each collective over the data-parallel group (nccl-tests sizes)."""
    if stage == 0:
        return {"all_reduce": 4 * sum(LAYER_SIZES), "reduce_scatter": 0, "all_gather": 0}
    everything = 4 * sum(padded(ranks))
    return {"all_reduce": 0,
            "reduce_scatter": everything * (1 if stage == 1 else micro_batches),
            "all_gather": everything * (2 * micro_batches if stage == 3 else 1)}


# Units of about 40,000 elements: several chunks of the shared-memory collectives each, so
# chunks are shared out between ranks and helped along by tests and waits.
WIDE_MODEL = BASE + ["--hidden", "200"]
MPI_ONLY = {"MLPTRAIN_SHARED_MEMORY": "0"}
# Evaluating after the last step checks every rank's whole copy of the parameters (each rank
# evaluates its own share of the test samples with its own copy).
EVALUATE = ["--eval-every", "20"]


class Zero(TrainingTestCase):
    def check_stages(self, base, layouts, environment=None):
        references = {}
        for clip in ([], CLIP):
            steps, _, tensors = self.train("one" + "".join(clip), base + clip, 1)
            references[tuple(clip)] = (steps, tensors)
        self.assertTrue(any(step["grad_norm"] > 0.05 for step in references[tuple(CLIP)][0]))
        for stage in (1, 2, 3):
            for ranks, extra in layouts:
                with self.subTest(stage=stage, ranks=ranks, extra=extra, environment=environment):
                    clip = tuple(CLIP) if CLIP[0] in extra else ()
                    steps, _, tensors = self.train(f"z{stage}r{ranks}{len(extra)}",
                                                   base + ["--zero", stage] + extra, ranks, environment)
                    self.assert_losses_close(steps, references[clip][0])
                    self.assert_tensors_close(tensors, references[clip][1])

    def test_every_stage_reproduces_one_process(self):
        self.check_stages(MODEL + ["--steps", "20"] + EVALUATE,
                          [(2, []), (2, ["--micro-batches", "4"] + CLIP), (4, ["--micro-batches", "2"]),
                           (4, CLIP)])

    def test_every_stage_with_units_of_many_chunks(self):
        self.check_stages(WIDE_MODEL + ["--steps", "20"] + EVALUATE,
                          [(2, ["--micro-batches", "2"] + CLIP), (4, ["--micro-batches", "2"])])

    def test_every_stage_through_mpi_collectives(self):
        # Without shared memory: MPI's in-place reduce-scatter and all-gather, non-blocking.
        self.check_stages(WIDE_MODEL + ["--steps", "20"] + EVALUATE,
                          [(2, ["--micro-batches", "2"] + CLIP), (4, [])], MPI_ONLY)

    def test_memory_and_collective_sizes_are_the_zero_figures(self):
        # Model state against the ZeRO figures and the unit buffers against what each stage is
        # allowed in flight; the pools are fixed, so these are exact peaks.
        for stage in (0, 1, 2, 3):
            for ranks, micro_batches in ((2, 1), (4, 2)):
                with self.subTest(stage=stage, ranks=ranks, micro_batches=micro_batches):
                    metrics = self.path(f"m{stage}{ranks}.jsonl")
                    run(MODEL + ["--steps", "3", "--zero", stage, "--micro-batches", micro_batches,
                                 "--metrics", metrics], ranks)
                    steps, summary = read_metrics(metrics)
                    memory = expected_memory(stage, ranks)
                    for rank, peaks in enumerate(summary["peak_mem_bytes_by_rank"]):
                        for state, value in memory.items():
                            self.assertEqual(peaks[state], value, f"rank {rank} {state}")
                    for state in ("params", "grads", "optimizer", "comm_buffers"):
                        self.assertEqual(summary["placement"][state]["predicted_bytes"], memory[state], state)
                    # The model-state figures of the ZeRO paper, padding included.
                    state_bytes = memory["params"] + memory["grads"] + memory["optimizer"]
                    psi = sum(LAYER_SIZES) if stage == 0 else sum(padded(ranks))
                    formula = {0: 16 * psi, 1: 8 * psi + 8 * psi // ranks,
                               2: 4 * psi + 12 * psi // ranks, 3: 16 * psi // ranks}[stage]
                    self.assertEqual(state_bytes, formula)
                    comm = expected_comm(stage, ranks, micro_batches)
                    world_sum = 7 * 8  # the step's loss, correct count, norm, read problems, data wait, writers, stops
                    for step in steps:
                        self.assertEqual(step["comm_bytes"]["all_reduce"], comm["all_reduce"] + world_sum)
                        self.assertEqual(step["comm_bytes"]["reduce_scatter"], comm["reduce_scatter"])
                        self.assertEqual(step["comm_bytes"]["all_gather"], comm["all_gather"])
                    mode = summary["placement"]["params"]["mode"]
                    self.assertEqual(mode, "SG" if stage == 3 else "R")

    def test_checkpoints_move_between_stages_and_rank_counts(self):
        run_flags = ["--micro-batches", "2"] + CLIP
        full_steps, _, full = self.train("full", WIDE_MODEL + run_flags + ["--steps", "20", "--zero", "3"], 4)
        # (writer stage, writer ranks) -> (reader stage, reader ranks): every stage writes and reads.
        cases = [((3, 4), (0, 2)), ((0, 2), (3, 4)), ((2, 2), (0, 1)), ((0, 1), (1, 4)),
                 ((1, 4), (2, 2)), ((3, 2), (3, 4))]
        # ZeRO-3 over tensor-parallel slices, to and from one process.
        tensor_parallel = {"--tp": "2"}
        cases += [((3, 4, tensor_parallel), (0, 1)), ((0, 1), (3, 4, tensor_parallel))]
        def flags(case):  # (stage, ranks[, extra options])
            return ["--zero", case[0]] + [item for pair in (case[2] if len(case) > 2 else {}).items() for item in pair]
        for writer, reader in cases:
            with self.subTest(writer=writer, reader=reader):
                name = "-".join(map(str, flags(writer) + [writer[1]] + flags(reader) + [reader[1]]))
                half = self.path("half-" + name)
                run(WIDE_MODEL + run_flags + ["--steps", "10", "--checkpoint-dir", half] + flags(writer), writer[1])
                metrics = self.path(name + ".jsonl")
                resumed_dir = self.path("resumed-" + name)
                run(WIDE_MODEL + run_flags + ["--steps", "20", "--resume", half, "--metrics", metrics,
                                                "--checkpoint-dir", resumed_dir] + flags(reader), reader[1])
                steps, _ = read_metrics(metrics)
                self.assert_losses_close(steps, full_steps[10:])
                self.assert_tensors_close(read_checkpoint(os.path.join(resumed_dir, "step_00000020.h5")), full)

    def test_one_rank_runs_and_says_nothing_is_sharded(self):
        output = run(MODEL + ["--steps", "2", "--zero", "2"], 1).stdout
        self.assertIn("nothing is sharded", output)
        self.assertIn("summary: 2 steps", output)


if __name__ == "__main__":
    unittest.main()
