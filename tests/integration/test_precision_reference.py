"""bf16 and fp16 runs against an independent emulation of DESIGN.md §2.7 (precision_reference.py,
NumPy, written from the contract's text): one process and every layout family, dense and MoE.

What is compared: the first step's update with AdamW's eps = 1, lr = 1 and no weight decay,
which is -g / (|g| + 1), nearly the gradient itself (final weights would hide it: Adam's first
step is lr sign(g) wherever |g| >> eps). The run's update is formed from the AdamW moments its
checkpoint holds after the step, -(m / (1 - beta1)) / (sqrt(v / (1 - beta2)) + eps), and checked
against its masters' change (which alone would lose updates of 1e-6 to the masters' fp32
spacing); the reference's is computed from its gradients on the same data from the same masters.
The measure is each tensor's relative L2 error; a layout's error is the median over the model's
tensors (the largest is reported beside it).

The tolerance comes from the one freedom the contract leaves, the order of fp32 sums. A
differently ordered sum crosses a rounding midpoint of its 16-bit result only where it lies
within about an fp32 unit u = 2^-24 (relative) of one: a fraction u / step of the elements, each
then moved by one step of the format (step = 2^-8 for bf16, 2^-11 for fp16), so a rounded tensor
differs by about sqrt(u / step) x step = sqrt(u x step) in relative L2. Gradients are sums over
rows with cancellation, and every layer carries the flips of those after it (backward) and
before it (forward), which multiplies that: over six random models the reference differed from
itself summed in another fp32 order by up to 9 sqrt(u step) (bf16) and 15 sqrt(u step) (fp16) in
the median, while a rounding added or left out moved a dense model by at least 200 (bf16) and
70 (fp16).
The run also evaluates GELU and its derivative in fp32 (a few ulps from exact), which fp16's
finer step turns into flips more often: its one-process run is 35 sqrt(u step) from the
reference on this test's model. The bounds: 32 sqrt(u step) for bf16 (4.9e-4) and 64 sqrt(u step)
for fp16 (3.5e-4). One flip near a tie can move a single small tensor (the first layers'
gradients) further: hence the median.
test_tolerance_admits_another_summation_order repeats that measurement on this test's model.
"""
import unittest

import numpy as np

from common import gpu_refusal
from precision_reference import round_bf16, round_fp16
from reference_runs import GPU_LAYOUTS, MOE, PIPELINE, ReferenceRuns

STEP = {"bf16": 2.0 ** -8, "fp16": 2.0 ** -11}
TOLERANCE = {"bf16": 32 * (2.0 ** -24 * STEP["bf16"]) ** 0.5, "fp16": 64 * (2.0 ** -24 * STEP["fp16"]) ** 0.5}

# Layout families: (name, ranks, flags, tensor ranks of the reference).
DENSE_LAYOUTS = [
    ("one process", 1, [], 1),
    ("micro-batches", 1, ["--micro-batches", "4"], 1),
    ("dp", 2, ["--dp", "2"], 1),
    ("zero-1", 2, ["--zero", "1"], 1),
    ("zero-2", 2, ["--zero", "2", "--micro-batches", "2"], 1),
    ("zero-3", 2, ["--zero", "3"], 1),
    ("hsdp", 4, ["--zero", "3", "--zero-shard-size", "2"], 1),
    ("tp", 2, ["--tp", "2"], 2),
    ("sp", 2, ["--tp", "2", "--sequence-parallel"], 2),
    ("tp+dp+sp", 4, ["--tp", "2", "--dp", "2", "--sequence-parallel"], 2),
    ("pp 1f1b", 2, PIPELINE, 1),
    ("pp gpipe", 2, PIPELINE + ["--schedule", "gpipe"], 1),
    ("pp interleaved", 2, PIPELINE + ["--schedule", "interleaved", "--virtual-stages", "2"], 1),
    ("pp zb-h1", 2, PIPELINE + ["--schedule", "zb-h1"], 1),
    ("recompute", 1, ["--recompute"], 1),
]
MOE_LAYOUTS = [
    ("moe one process", 1, [], 1),
    ("moe dp", 2, ["--dp", "2"], 1),
    ("moe ep", 2, ["--ep", "2"], 1),
    ("moe ep+zero-1", 2, ["--ep", "2", "--zero", "1"], 1),
    ("moe tp", 2, ["--tp", "2"], 2),
    ("moe pp", 2, PIPELINE, 1),
]


class PrecisionReference(ReferenceRuns):
    """bf16 and fp16 layouts against the reference, and the checks of the check."""

    report_variable = "MLPTRAIN_PRECISION_REPORT"
    tolerance = TOLERANCE

    def check_layouts(self, dtype, layouts, moe, extra=()):
        self.check_against_reference(dtype, layouts, moe, TOLERANCE[dtype], extra, dtype)

    def test_bf16_dense_layouts_follow_the_contract(self):
        self.check_layouts("bf16", DENSE_LAYOUTS, moe=False)

    def test_bf16_moe_layouts_follow_the_contract(self):
        self.check_layouts("bf16", MOE_LAYOUTS, moe=True)

    def test_bf16_layouts_on_the_gpu_follow_the_contract(self):
        refusal = gpu_refusal()
        if refusal is not None:
            self.skipTest(f"no GPU to test on: mlptrain says \"{refusal[1]}\"")
        self.check_layouts("bf16", GPU_LAYOUTS, moe=False, extra=["--device", "cuda"])
        self.check_layouts("bf16", [("gpu moe ep", 2, ["--ep", "2"], 1)], moe=True, extra=["--device", "cuda"])

    def test_fp16_with_its_dynamic_loss_scale_follows_the_contract(self):
        self.check_layouts("fp16", [layout for layout in DENSE_LAYOUTS if layout[0] in ("one process", "dp", "tp")],
                           moe=False)
        self.check_layouts("fp16", MOE_LAYOUTS[:1], moe=True)

    def test_broken_variants_fall_outside_the_tolerance(self):
        """Each break of the contract, by the reference (a variant emulated) or by the run (one
        made with other options), is rejected by the check above."""
        for moe in (False, True):
            flags = (MOE if moe else []) + ["--param-dtype", "bf16"]
            run_update, _ = self.first_update(f"variants moe={moe}", flags, 1)
            fp32_update, _ = self.first_update(f"variants fp32 moe={moe}", (MOE if moe else []), 1)
            contract = self.reference_update(moe, "bf16")
            variants = {
                "the product rounded before the bias": (run_update, self.reference_update(moe, "bf16",
                                                                                          variant="product_first")),
                "a missing rounding of d(pre)": (run_update, self.reference_update(moe, "bf16",
                                                                                   variant="unrounded_grad_pre")),
                "an fp32 run": (fp32_update, contract),
            }
            if not moe:
                wrong_reduction, _ = self.first_update("variants bf16 reduction",
                                                       flags + ["--dp", "2", "--reduce-dtype", "bf16"], 2)
                variants["a reduction in the wrong type"] = (wrong_reduction, contract)
                unscaled, _ = self.first_update("variants fp16 unscaled", ["--param-dtype", "fp16", "--loss-scale", "1"], 1)
                variants["fp16 without its loss scale"] = (unscaled, self.reference_update(False, "fp16",
                                                                                          loss_scale=65536.0))
            for name, (update, reference) in variants.items():
                with self.subTest(variant=name, moe=moe):
                    dtype = "fp16" if name.startswith("fp16") else "bf16"
                    median, largest = self.errors_of(update, reference)
                    self.errors[f"variant: {name}{' (moe)' if moe else ''}"] = {"median": median, "largest": largest}
                    print(f"{name}{' (moe)' if moe else ''}: {median:.1e} from the check's reference", flush=True)
                    self.assertGreater(median, TOLERANCE[dtype])

    def test_tolerance_admits_another_summation_order(self):
        """The reference summed in fp32 in another order (NumPy's float32 products) stays within
        the tolerance of itself, dense and MoE, bf16 and fp16."""
        for dtype, scale in (("bf16", 1.0), ("fp16", 65536.0)):
            for moe in (False, True):
                with self.subTest(dtype=dtype, moe=moe):
                    reordered = self.reference_update(moe, dtype, loss_scale=scale, accumulation="float32")
                    median, _ = self.errors_of(reordered, self.reference_update(moe, dtype, loss_scale=scale))
                    self.errors[f"reference reordered: {dtype}{' moe' if moe else ''}"] = median
                    self.assertLessEqual(median, TOLERANCE[dtype])

    def test_reference_rounds_to_nearest_even(self):
        """The reference's own rounding against NumPy's fp16 cast and bf16 cases worked by hand."""
        values = np.random.default_rng(3).normal(0, 1, 100000).astype(np.float32) * np.float32(2.0) ** \
            np.random.default_rng(4).integers(-30, 18, 100000).astype(np.float32)
        with np.errstate(over="ignore"):  # beyond fp16's range the cast gives infinity, as it should
            expected = values.astype(np.float16).astype(np.float32)
        np.testing.assert_array_equal(round_fp16(values), expected)
        cases = np.array([1 + 2 ** -8, 1 + 3 * 2 ** -8, 1 + 2 ** -8 + 2 ** -20, -(1 + 2 ** -8)], np.float32)
        np.testing.assert_array_equal(round_bf16(cases), np.array([1, 1 + 2 ** -6, 1 + 2 ** -7, -1], np.float32))


if __name__ == "__main__":
    unittest.main()
