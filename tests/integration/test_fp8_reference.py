"""fp8 runs (--fp8 tensorwise and rowwise, DESIGN.md §2.7) against an independent emulation of
the contract in NumPy (fp8_reference.py through precision_reference.Reference): one process and
every layout family the recipe runs in, dense and MoE (whose experts stay bf16), on the CPU,
through the device path (loopback), and on a GPU where one is present (its fp8 tensor cores, whose
narrower sums have a tolerance of their own, below).

The measure is test_precision_reference.py's: the first step's update with AdamW's eps = 1, each
tensor's relative L2 error against the reference's, the median over the model's tensors.

The tolerance: the contract leaves one freedom, the order of fp32 sums. An fp8 product's terms
are exact in fp32 (4 and 4 significant bits) and their sums are exact while they span fewer
than 24 bits, so the products agree in any order far more often than bf16's do; what remains
free is what bf16 has (the bias added in fp32, the gradients' fp32 sums, the rounding of each
result to bf16), so bf16's bound holds: 32 sqrt(u x 2^-8) (test_precision_reference.py). Where
a flip does happen before an operand is quantized it moves an element by an fp8 step, which
test_tolerance_admits_another_summation_order measures with the reference summed in NumPy's
fp32 order. Every broken variant lands far outside (test_broken_variants_fall_outside_the_tolerance
prints how far).

On a GPU the dense layers' products run on Hopper's fp8 tensor cores, whose sums keep about 14
bits between their promotions into fp32: a product of k <= 128 terms may differ from the
contract's fp32 sum by (32 + k/32) x 2^-13 of its terms' magnitudes (test_cuda_fp8_kernels.cpp
derives the bound and holds the tensor cores to it). This model's products sum k <= 64 terms,
and terms of random signs have a magnitude sqrt(2k/pi) times their sum's size, so a gradient may
move by 34 x 2^-13 x sqrt(128/pi) = 0.027 of itself: GPU_TOLERANCE. Measured on an H200: 1.2e-2
(e4m3 gradients) and 1.8e-2 (e5m2), against 2.4e-7 for the CPU's emulation of the same step.
Every broken variant but one lands outside it too (test_broken_variants_fall_outside_the_tolerance
asserts it): the amax of the micro-batch before (tensorwise 1.6e-2) hides in the tensor cores'
sums, and is ruled out on the GPU otherwise: its amax, scales and codes are the CPU's bit for
bit (test_cuda_fp8_kernels.cpp) and the loop that picks which amax is one for every device.

Within the format's normal range a power-of-two scale leaves an element's significand as it is,
so which rows a scale is formed from (the global micro-batch's, as the contract says, or one
rank's) shows only in elements some 2^15 below the amax, which no gradient's norm sees: the MPI
test Layouts.Fp8AmaxIsTheDataGroupsMaximum checks the agreement itself, and the run's ledger
holds its all-reduces to the prediction.
"""
import math
import os
import unittest

from common import gpu_refusal, read_metrics, run
from reference_runs import GPU_LAYOUTS, PIPELINE, ReferenceRuns

UNIT = (2.0 ** -24 * 2.0 ** -8) ** 0.5
TOLERANCE = 32 * UNIT
GPU_TOLERANCE = 34 * 2.0 ** -13 * math.sqrt(2 * 64 / math.pi)

# (name, ranks, flags, tensor ranks of the reference).
LAYOUTS = [
    ("one process", 1, [], 1),
    ("micro-batches", 1, ["--micro-batches", "4"], 1),
    ("dp", 2, ["--dp", "2"], 1),
    ("dp+micro-batches", 2, ["--dp", "2", "--micro-batches", "2"], 1),
    ("zero-1", 2, ["--zero", "1"], 1),
    ("zero-2", 2, ["--zero", "2", "--micro-batches", "2"], 1),
    ("zero-3", 2, ["--zero", "3"], 1),
    ("hsdp", 4, ["--zero", "3", "--zero-shard-size", "2"], 1),
    ("pp 1f1b", 2, PIPELINE, 1),
    ("pp gpipe", 2, PIPELINE + ["--schedule", "gpipe"], 1),
    ("pp interleaved", 2, PIPELINE + ["--schedule", "interleaved", "--virtual-stages", "2"], 1),
    ("pp zb-h1", 2, PIPELINE + ["--schedule", "zb-h1"], 1),
    ("pp+dp", 4, PIPELINE + ["--dp", "2"], 1),
    ("tp", 2, ["--tp", "2"], 2),
    ("sp", 2, ["--tp", "2", "--sequence-parallel"], 2),
    ("tp+dp+sp", 4, ["--tp", "2", "--dp", "2", "--sequence-parallel"], 2),
    ("recompute", 1, ["--recompute"], 1),
    ("loopback", 1, ["--device", "loopback"], 1),
    ("loopback dp", 2, ["--device", "loopback", "--dp", "2"], 1),
]

# MoE models: the dense layers in fp8, the experts and the router in bf16 (§2.7).
MOE_LAYOUTS = [
    ("moe one process", 1, [], 1),
    ("moe dp", 2, ["--dp", "2"], 1),
    ("moe ep", 2, ["--ep", "2"], 1),
    ("moe ep+zero-1", 2, ["--ep", "2", "--zero", "1"], 1),
    ("moe pp", 2, PIPELINE, 1),
    ("moe tp", 2, ["--tp", "2"], 2),
]


class Fp8Reference(ReferenceRuns):
    report_variable = "MLPTRAIN_FP8_REPORT"
    tolerance = TOLERANCE

    def check(self, recipe, layouts, grad_format="e4m3", moe=False, extra=(), tolerance=TOLERANCE):
        flags = ["--fp8", recipe, "--fp8-grad-format", grad_format, *extra]
        self.check_against_reference(f"fp8 {recipe} {grad_format}", layouts, moe, tolerance, flags, "bf16",
                                     fp8=recipe, fp8_grad_format=grad_format)

    def test_tensorwise_layouts_follow_the_contract(self):
        self.check("tensorwise", LAYOUTS)

    def test_rowwise_layouts_follow_the_contract(self):
        self.check("rowwise", LAYOUTS)

    def test_moe_models_follow_the_contract(self):
        self.check("tensorwise", MOE_LAYOUTS, moe=True)
        self.check("rowwise", MOE_LAYOUTS[:3], moe=True)

    def test_layouts_on_the_gpu_follow_the_contract(self):
        refusal = gpu_refusal()
        if refusal is not None:
            self.skipTest(f"no GPU to test on: mlptrain says \"{refusal[1]}\"")
        for recipe in ("tensorwise", "rowwise"):
            self.check(recipe, GPU_LAYOUTS, extra=["--device", "cuda"], tolerance=GPU_TOLERANCE)
        self.check("tensorwise", GPU_LAYOUTS[:1], grad_format="e5m2", extra=["--device", "cuda"],
                   tolerance=GPU_TOLERANCE)

    def test_e5m2_gradients_follow_the_contract(self):
        self.check("tensorwise", LAYOUTS[:3], grad_format="e5m2")
        self.check("rowwise", LAYOUTS[:1], grad_format="e5m2")

    def test_zero3_gathers_tensorwise_weights_in_fp8(self):
        """Under ZeRO-3 with --fp8 tensorwise a dense layer's weight travels as fp8 bytes (each
        shard quantized with the weight's agreed scale, as the forward quantizes it): half of a
        bf16 gather's bytes (the bias and padding travel in bf16), the ledger's bytes as planned,
        and the same losses as data parallelism, whose weights are whole (the gathered values are
        the ones the products quantize to). Rowwise, whose products scale W by row and by column,
        gathers in bf16."""
        base = ["--layers", "4", "--hidden", "256", "--steps", "3", "--log-every", "0", "--param-dtype", "bf16"]
        results = {}
        for name, flags in (("bf16", ["--zero", "3"]), ("rowwise", ["--zero", "3", "--fp8", "rowwise"]),
                            ("tensorwise", ["--zero", "3", "--fp8", "tensorwise"]),
                            ("tensorwise dp", ["--dp", "2", "--fp8", "tensorwise"])):
            metrics = os.path.join(self.directory, f"gathers-{name.replace(' ', '-')}.jsonl")
            run(base + flags + ["--metrics", metrics], 2)
            results[name] = read_metrics(metrics)
        gathered = {name: summary["comm_per_step"].get("all_gather", {}) for name, (_, summary) in results.items()}
        for name in ("bf16", "rowwise", "tensorwise"):
            self.assertEqual(gathered[name]["measured_bytes"], gathered[name]["predicted_bytes"], name)
        self.assertEqual(gathered["rowwise"]["measured_bytes"], gathered["bf16"]["measured_bytes"])
        ratio = gathered["tensorwise"]["measured_bytes"] / gathered["bf16"]["measured_bytes"]
        # Above half by what is not weight: each of the 2 ranks' blocks carries the layer's bias
        # slots in bf16 and up to 7 bytes of alignment (layers 32-256-256-256-4).
        layers = [(32, 256), (256, 256), (256, 256), (256, 4)]
        weight_bytes = sum(2 * fan_in * fan_out for fan_in, fan_out in layers)  # bf16: 2 bytes an element
        bound = 0.5 + sum(2 * (2 * fan_out + 7) for _, fan_out in layers) / weight_bytes
        print(f"ZeRO-3 gathers in fp8: {ratio:.4f} of bf16's bytes (bound {bound:.4f})", flush=True)
        self.assertGreater(ratio, 0.5)
        self.assertLess(ratio, bound)
        for mine, theirs in zip(results["tensorwise"][0], results["tensorwise dp"][0]):
            self.assertAlmostEqual(mine["loss"], theirs["loss"], delta=1e-5 * abs(theirs["loss"]))

    def test_broken_variants_fall_outside_the_tolerance(self):
        """Each break of the contract, emulated by the reference or made by the run with other
        options, is rejected by the check above."""
        for recipe in ("tensorwise", "rowwise"):
            run_update, _ = self.first_update(f"variants {recipe}", ["--param-dtype", "bf16", "--fp8", recipe], 1)
            micro_batched, _ = self.first_update(f"variants {recipe} micro-batches",
                                                 ["--param-dtype", "bf16", "--fp8", recipe, "--micro-batches", "4"], 1)
            e5m2_run, _ = self.first_update(f"variants {recipe} e5m2",
                                            ["--param-dtype", "bf16", "--fp8", recipe, "--fp8-grad-format", "e5m2"], 1)
            bf16_run, _ = self.first_update(f"variants {recipe} bf16", ["--param-dtype", "bf16"], 1)
            contract = self.reference_update(False, "bf16", fp8=recipe)
            variants = {
                "no scaling": (run_update, self.reference_update(False, "bf16", fp8=recipe, variant="unscaled")),
                "amax from the micro-batch before": (
                    micro_batched, self.reference_update(False, "bf16", fp8=recipe, micro_batches=4,
                                                         variant="previous_amax")),
                "e5m2 where e4m3 is asked": (run_update, self.reference_update(False, "bf16", fp8=recipe,
                                                                               variant="e5m2_everywhere")),
                "e5m2 gradients where e4m3 is asked": (e5m2_run, contract),
                "a bf16 run": (bf16_run, contract),
            }
            for name, (update, reference) in variants.items():
                with self.subTest(variant=name, recipe=recipe):
                    median, _ = self.errors_of(update, reference)
                    self.errors[f"variant: {name} ({recipe})"] = median
                    print(f"{name} ({recipe}): {median:.1e} from the check's reference, {median / UNIT:.0f} "
                          f"sqrt(u step)", flush=True)
                    self.assertGreater(median, TOLERANCE)
                    if name != "amax from the micro-batch before":
                        self.assertGreater(median, GPU_TOLERANCE, "the GPU's tolerance would admit it")

    def test_tolerance_admits_another_summation_order(self):
        for recipe in ("tensorwise", "rowwise"):
            with self.subTest(recipe=recipe):
                reordered = self.reference_update(False, "bf16", fp8=recipe, accumulation="float32")
                median, _ = self.errors_of(reordered, self.reference_update(False, "bf16", fp8=recipe))
                self.errors[f"reference reordered: {recipe}"] = median
                print(f"reference reordered ({recipe}): {median:.1e}, {median / UNIT:.1f} sqrt(u step)", flush=True)
                self.assertLessEqual(median, TOLERANCE)


if __name__ == "__main__":
    unittest.main()
