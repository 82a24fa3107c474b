"""Mixed precision (DESIGN.md §2.7) end to end: layouts at bf16 against one process at the same
dtypes, variants that break the contract falling outside the tolerance, fp16's dynamic loss scale
skipping exactly the steps that overflow, resuming across dtypes, and the checkpoint's attributes.

The tolerances come from bf16's format: its 8 significant bits give a relative spacing of
EPSILON = 2^-8 between neighbouring values.
- Layouts that round in the same places as one process (data parallelism, ZeRO 1-3 and its
  hybrid sharding, pipelines, micro-batches, experts, recomputation, offload, with fp32 gradient
  reductions): a row's GEMM and every rounding of it are the same in every layout, so runs
  differ only by the order of fp32 sums (gradients over ranks and micro-batches, about 1e-7
  relative). That reaches bf16 only where a master weight lies that close to a rounding midpoint
  of its compute copy and rounds the other way: one element moved by one bf16 step. SAME_ROUNDING = EPSILON / 16 admits such flips in one
  element of every 256 (relative L2: sqrt(1/256) = 1/16 of a step), while a rounding left out or
  a reduction in a 16-bit type changes the rounding of every element of a tensor (an RMS change
  of about a third of a step), which the broken-variant test shows falls outside.
- Layouts that round more by design: tensor parallelism rounds each rank's partial product before
  the sum (Megatron-LM's bf16 all-reduce), a 16-bit reduction rounds each rank's gradients before
  theirs (and a 16-bit gradient buffer each micro-batch's addition). One extra rounding of those
  tensors each pass, carried through 20 steps in which Adam moves an element by lr per gradient
  sign wherever |g| >> eps (a sign the extra rounding flips moves it by 2 lr): measured 0.7
  EPSILON (tensor parallelism) to 2.9 EPSILON (two micro-batches into a bf16 buffer), held to
  BY_DESIGN = 4 EPSILON. The rounding contract itself is checked step by step against an
  independent emulation in test_precision_reference.py. Around tensor parallelism (against its own one-layout reference) the other layouts,
  sequence parallelism too, round alike again: SAME_ROUNDING."""
import os
import unittest

import h5py
import numpy as np

from common import TrainingTestCase, read_checkpoint, read_metrics, run

EPSILON = 2.0 ** -8
SAME_ROUNDING = EPSILON / 16
BY_DESIGN = 4 * EPSILON

MODEL = ["--dataset", "teacher", "--input-dim", "16", "--output-dim", "4", "--layers", "6", "--hidden", "32",
         "--global-batch", "32", "--log-every", "0", "--lr", "3e-3"]
DENSE = MODEL + ["--steps", "20"]
MOE = DENSE + ["--moe-every", "2", "--experts", "4", "--top-k", "2"]
BF16 = ["--param-dtype", "bf16"]
BF16_REDUCE = ["--param-dtype", "bf16", "--reduce-dtype", "bf16"]


def largest_relative_error(tensors, reference, prefix="model/"):
    """The largest relative L2 error over the tensors under `prefix`."""
    errors = []
    for name, expected in reference.items():
        if name.startswith(prefix):
            expected = expected.astype(np.float64)
            errors.append(np.linalg.norm(tensors[name] - expected) / (np.linalg.norm(expected) or 1.0))
    return max(errors)


class MixedPrecisionLayouts(TrainingTestCase):
    def compare(self, reference, layouts, tolerance):
        """Each layout's losses, gradient norms and master weights within `tolerance` of the
        reference run (model, dtypes and layout, ranks)."""
        model, dtypes, reference_ranks = reference
        reference_steps, _, reference_tensors = self.train("reference", model + dtypes, reference_ranks)
        for ranks, extra in layouts:
            with self.subTest(ranks=ranks, extra=extra):
                steps, summary, tensors = self.train(f"r{ranks}{''.join(extra)}", model + dtypes + extra, ranks)
                self.assert_losses_close(steps, reference_steps, tolerance)
                self.assertLessEqual(largest_relative_error(tensors, reference_tensors), tolerance)
                if ranks > 1:  # the layout's data really travelled
                    self.assertGreater(sum(op["measured_bytes"] for op in summary["comm_per_step"].values()), 0)

    def test_layouts_that_round_alike_match_one_process(self):
        self.compare((DENSE, BF16, 1), [
            (1, ["--micro-batches", "4"]), (1, ["--micro-batches", "2", "--recompute"]),
            (2, ["--dp", "2"]), (4, ["--dp", "4", "--micro-batches", "2"]),
            (2, ["--zero", "1"]), (2, ["--zero", "2", "--micro-batches", "2"]), (4, ["--zero", "3"]),
            (2, ["--zero", "3", "--recompute"]), (4, ["--zero", "3", "--zero-shard-size", "2"]),
            (2, ["--pp", "2", "--micro-batches", "4"]),
            (2, ["--pp", "2", "--micro-batches", "4", "--schedule", "gpipe", "--recompute"]),
            (4, ["--dp", "2", "--pp", "2", "--micro-batches", "2", "--zero", "1"]),
            (2, ["--device", "loopback", "--offload"]),
        ], SAME_ROUNDING)
        self.compare((MOE, BF16, 1), [(2, ["--dp", "2"]), (2, ["--ep", "2"]), (4, ["--ep", "4"]),
                                   (4, ["--ep", "2", "--zero", "1"]), (2, ["--ep", "2", "--recompute"]),
                                   (4, ["--ep", "2", "--zero", "2", "--zero-shard-size", "2"])],
                     SAME_ROUNDING)

    def test_tensor_parallel_rounds_alike_in_every_layout_around_it(self):
        # Sequence parallelism splits the same sums into reduce-scatters and gathers: each element
        # is rounded as plain tensor parallelism rounds it.
        self.compare((DENSE, BF16 + ["--tp", "2"], 2), [(4, ["--dp", "2"]), (4, ["--pp", "2", "--micro-batches", "2"]),
                                                       (4, ["--zero", "1"]), (2, ["--sequence-parallel"]),
                                                       (4, ["--dp", "2", "--zero", "3", "--sequence-parallel"])],
                     SAME_ROUNDING)

    def test_layouts_that_round_more_by_design(self):
        self.compare((DENSE, BF16, 1), [(2, ["--tp", "2"]), (4, ["--tp", "4"]),
                                     (4, ["--tp", "2", "--pp", "2", "--micro-batches", "2"])], BY_DESIGN)
        self.compare((DENSE, BF16_REDUCE, 1), [(2, ["--dp", "2"]), (2, ["--zero", "2"]),
                                            (1, ["--micro-batches", "2"])], BY_DESIGN)

    def test_broken_variants_fall_outside_the_tolerance(self):
        """A run with one rounding left out (the gradient buffer in fp32 where the reference
        rounds it to bf16), one with a reduction in the wrong dtype (bf16 gradient sums where the
        reference sums in fp32) and one with every rounding left out (fp32) are each rejected."""
        _, _, bf16 = self.train("bf16", DENSE + BF16, 1)
        _, _, bf16_reduce = self.train("bf16-reduce", DENSE + BF16_REDUCE, 1)
        _, _, wrong_reduction = self.train("wrong-reduction", DENSE + BF16_REDUCE + ["--dp", "2"], 2)
        _, _, fp32 = self.train("fp32", DENSE, 1)
        for name, tensors, reference in (("one rounding left out", bf16, bf16_reduce),
                                         ("a reduction in the wrong dtype", wrong_reduction, bf16),
                                         ("every rounding left out", fp32, bf16)):
            with self.subTest(variant=name):
                self.assertGreater(largest_relative_error(tensors, reference), SAME_ROUNDING)


class LossScaling(TrainingTestCase):
    """fp16 with a dynamic loss scale on data made to overflow: the targets of the samples of
    steps 3 and 4 are so large that the loss's gradient times the scale leaves fp16's range
    (65504) while the loss itself stays finite in fp32."""
    BATCH, OVERFLOWING = 8, (3, 4)

    def setUp(self):
        super().setUp()
        generator = np.random.default_rng(7)
        inputs = generator.normal(0, 1, (128, 6)).astype(np.float32)
        targets = generator.normal(0, 1, (128, 3)).astype(np.float32)
        for step in self.OVERFLOWING:
            targets[(step - 1) * self.BATCH:step * self.BATCH] = 3e4
        self.data = self.path("data.h5")
        with h5py.File(self.data, "w") as file:
            file["x"] = inputs
            file["y"] = targets
        self.arguments = ["--dataset", "hdf5", "--data-path", self.data, "--layers", "3", "--hidden", "16",
                          "--global-batch", self.BATCH, "--log-every", "0", "--save-every", "1",
                          "--param-dtype", "fp16", "--initial-loss-scale", "1024", "--loss-scale-window", "3"]

    def test_overflowing_steps_are_skipped_and_the_scale_adapts(self):
        for ranks, extra in ((1, []), (2, ["--zero", "2"]), (2, ["--pp", "2", "--micro-batches", "2"])):
            with self.subTest(ranks=ranks, extra=extra):
                name = f"scaled{ranks}{''.join(extra)}"
                steps, _, _ = self.train(name, self.arguments + ["--steps", "9"] + extra, ranks)
                skipped = [step["step"] for step in steps if step.get("skipped")]
                self.assertEqual(skipped, list(self.OVERFLOWING))
                # The scale each step ran with: halved after each overflow, doubled after 3 finite steps.
                self.assertEqual([step["loss_scale"] for step in steps],
                                 [1024, 1024, 1024, 512, 256, 256, 256, 512, 512])
                self.assertEqual([step["skipped_steps"] for step in steps], [0, 0, 1, 2, 2, 2, 2, 2, 2])
                self.assertTrue(all(np.isfinite(step["loss"]) for step in steps))
                directory = self.path(name)
                before = read_checkpoint(os.path.join(directory, "step_00000002.h5"))
                for step in self.OVERFLOWING:  # masters and moments exactly as they were
                    after = read_checkpoint(os.path.join(directory, f"step_{step:08d}.h5"))
                    for tensor_name, values in before.items():
                        self.assertTrue(np.array_equal(after[tensor_name], values), tensor_name)
                with h5py.File(os.path.join(directory, "step_00000004.h5"), "r") as file:
                    self.assertEqual(file.attrs["step"], 4)
                    self.assertEqual(file.attrs["data_position"], 4 * self.BATCH)  # the data moved on
                    self.assertEqual(file["optimizer"].attrs["step"], 2)  # AdamW took two steps
                    self.assertEqual(file["optimizer"].attrs["loss_scale"], 256.0)
                final = read_checkpoint(os.path.join(directory, "step_00000009.h5"))
                self.assertFalse(np.array_equal(final["model/layers/00/weight"], before["model/layers/00/weight"]))

    def test_the_scale_resumes_where_it_was(self):
        full, _, _ = self.train("full", self.arguments + ["--steps", "9"], 1)
        metrics = self.path("resumed.jsonl")
        run(self.arguments + ["--steps", "9", "--resume", os.path.join(self.path("full"), "step_00000005.h5"),
                              "--metrics", metrics, "--checkpoint-dir", self.path("resumed")], 1)
        resumed, _ = read_metrics(metrics)
        self.assertEqual([step["loss_scale"] for step in resumed], [step["loss_scale"] for step in full[5:]])
        self.assert_losses_close(resumed, full[5:])


class PrecisionCheckpoints(TrainingTestCase):
    def test_initial_masters_are_the_fp32_model_and_dtypes_are_stored(self):
        for ranks, dtypes in ((1, []), (2, BF16 + ["--zero", "3"]), (2, ["--param-dtype", "fp16", "--tp", "2"])):
            directory = self.path(f"init{ranks}{''.join(dtypes)}")
            run(MODEL + dtypes + ["--steps", "0", "--checkpoint-dir", directory], ranks)
            path = os.path.join(directory, "step_00000000.h5")
            with self.subTest(dtypes=dtypes):
                tensors = read_checkpoint(path)
                if not dtypes:
                    initial = tensors
                for name, values in initial.items():
                    self.assertTrue(np.array_equal(tensors[name], values), name)
                with h5py.File(path, "r") as file:
                    self.assertEqual(file.attrs["param_dtype"], dtypes[1] if dtypes else "fp32")
                    self.assertEqual(file.attrs["reduce_dtype"], "fp32")
                    self.assertEqual(file["model/layers/00/weight"].dtype, np.float32)

    def test_resume_across_dtypes_and_layouts(self):
        """bf16 resumes bf16 in another layout as if uninterrupted; fp32 and bf16 resume each
        other from the stored masters, and go on within BY_DESIGN of the writer's own run."""
        base = MODEL
        moves = [  # writer dtypes and layout, reader dtypes and layout, tolerance against the writer's run
            (BF16 + ["--zero", "3"], 2, BF16 + ["--pp", "2", "--micro-batches", "2"], 2, SAME_ROUNDING),
            ([], 2, BF16 + ["--zero", "2"], 2, BY_DESIGN),
            (BF16 + ["--zero", "1"], 2, ["--pp", "2", "--micro-batches", "2"], 2, BY_DESIGN),
        ]
        for index, (writer, writer_ranks, reader, reader_ranks, tolerance) in enumerate(moves):
            with self.subTest(writer=writer, reader=reader):
                full_steps, _, full = self.train(f"full{index}", base + writer + ["--steps", "16", "--save-every", "8"],
                                                 writer_ranks)
                written = self.path(f"full{index}")
                metrics = self.path(f"resumed{index}.jsonl")
                resumed = self.path(f"resumed{index}")
                run(base + reader + ["--steps", "16", "--resume", os.path.join(written, "step_00000008.h5"),
                                     "--save-every", "8", "--metrics", metrics, "--checkpoint-dir", resumed],
                    reader_ranks)
                resumed_steps, _ = read_metrics(metrics)
                self.assert_losses_close(resumed_steps, full_steps[8:], tolerance)
                tensors = read_checkpoint(os.path.join(resumed, "step_00000016.h5"))
                self.assertLessEqual(largest_relative_error(tensors, full), tolerance)
                with h5py.File(os.path.join(resumed, "step_00000016.h5"), "r") as file:
                    self.assertEqual(file.attrs["param_dtype"], reader[1] if reader[:1] == ["--param-dtype"] else "fp32")


if __name__ == "__main__":
    unittest.main()
