"""The fp8 products of DESIGN.md §2.7 in NumPy, written from the contract's text, for
precision_reference.Reference: a Linear layer's three GEMMs from operands scaled by a power of
two, rounded to e4m3 or e5m2, multiplied with fp32 accumulation and unscaled.

- The formats (OCP 8-bit floating point): e4m3 has 3 mantissa bits, normals from 2^-6, largest
  448 and no infinities; e5m2 2 mantissa bits, normals from 2^-14, largest 57344. Rounding is to
  nearest, ties to even, saturating to the largest finite value.
- A scale is the largest power of two s with amax x s <= the format's largest value (1 for
  zeros); amax is the operand's current absolute maximum over the scale's elements: the whole
  operand (tensorwise) or each line of the side the GEMM does not sum over (rowwise). An
  operand's population is the global micro-batch and the whole tensor, whichever ranks hold its
  parts: under tensor parallelism each rank's slice is the slice of the operand quantized whole.
- `variant` names a deliberate break of the contract: "unscaled" (every scale 1),
  "previous_amax" (an activation's or gradient's scale from the same operand of the micro-batch
  before, as delayed scaling would), "e5m2_everywhere" (e5m2 where the contract says e4m3).
Nothing here reads the project's code."""
import numpy as np

F32 = np.float32
FORMATS = {"e4m3": (3, -6, 448.0), "e5m2": (2, -14, 57344.0)}


def round_fp8(values, format_name):
    """Values rounded to the format (kept as fp32), to nearest even, saturated. Exact in float64:
    the quantum at x is 2^(max(e, e_min) - mantissa bits) with e = floor(log2 |x|)."""
    mantissa_bits, smallest_normal, largest = FORMATS[format_name]
    x = np.asarray(values, np.float64)
    _, exponent = np.frexp(x)  # |x| = m 2^exponent with m in [0.5, 1)
    quantum = np.ldexp(1.0, np.maximum(exponent - 1, smallest_normal) - mantissa_bits)
    rounded = np.rint(x / quantum) * quantum
    return np.clip(np.where(x == 0, 0.0, rounded), -largest, largest).astype(F32)


def scale_for(amax, format_name):
    """The largest power of two that keeps amax x scale within the format (1 where amax is 0)."""
    largest = FORMATS[format_name][2]
    amax = np.asarray(amax, np.float64)
    safe = np.where(amax > 0, amax, 1.0)
    scale = np.exp2(np.floor(np.log2(largest / safe)))
    scale = np.where(safe * scale > largest, scale / 2, scale)
    return np.where(amax > 0, scale, 1.0)


class Fp8Products:
    """The three products of a Linear layer from fp8 operands, for one recipe. `matmul` is the
    reference's fp32-accumulating product; the results are fp32 (rounded to the param type by the
    caller, as the contract rounds them once)."""

    def __init__(self, recipe, grad_format="e4m3", matmul=None, variant=None):
        self.recipe = recipe
        self.grad_format = grad_format
        self.matmul = matmul
        self.variant = variant
        self.previous = {}  # (layer, product, operand) -> amax of the micro-batch before

    def quantize(self, key, values, operand, sums_over_rows):
        """(quantized values, inverse scales shaped to broadcast over them) of an operand
        [rows, cols] the GEMM sums over the rows or the columns of."""
        values = np.asarray(values, np.float64)
        if self.recipe == "tensorwise":
            amax = np.max(np.abs(values), keepdims=True).reshape(1, 1)
        else:  # one scale per line of the side not summed over
            amax = np.max(np.abs(values), axis=0 if sums_over_rows else 1, keepdims=True)
        if self.variant == "previous_amax" and operand != "weight":
            amax, self.previous[key] = self.previous.get(key, amax), amax
        format_name = self.grad_format if operand == "grad" else "e4m3"
        if self.variant == "e5m2_everywhere":
            format_name = "e5m2"
        scale = np.ones_like(amax) if self.variant == "unscaled" else scale_for(amax, format_name)
        return round_fp8(values * scale, format_name), 1.0 / scale

    def forward_partials(self, layer, x, w, parts):
        """x W^T before its rounding (fp32), as the sums over each slice of the input dimension in
        `parts`: a row-parallel layer's partial products (the slices of operands quantized whole,
        as their agreed scales make them)."""
        xq, x_inverse = self.quantize((layer, "forward", "x"), x, "input", sums_over_rows=False)
        wq, w_inverse = self.quantize((layer, "forward", "w"), w, "weight", sums_over_rows=False)
        return [(self.matmul(xq[:, part], wq[:, part].T).astype(np.float64) * x_inverse * w_inverse.T).astype(F32)
                for part in parts]

    def forward(self, layer, x, w, bias):
        """pre = x W^T + b before its rounding: fp32."""
        (product,) = self.forward_partials(layer, x, w, [slice(None)])
        return (product + np.asarray(bias, F32)).astype(F32)

    def input_gradient_partials(self, layer, grad_pre, w, parts):
        """grad_pre W before its rounding (fp32), as the sums over each slice of the output
        dimension in `parts`: a column-parallel layer's partial input gradients."""
        gq, g_inverse = self.quantize((layer, "input", "g"), grad_pre, "grad", sums_over_rows=False)
        wq, w_inverse = self.quantize((layer, "input", "w"), w, "weight", sums_over_rows=True)
        return [(self.matmul(gq[:, part], wq[part, :]).astype(np.float64) * g_inverse * w_inverse).astype(F32)
                for part in parts]

    def input_gradient(self, layer, grad_pre, w):
        """d loss / d x = grad_pre W before its rounding: fp32."""
        (product,) = self.input_gradient_partials(layer, grad_pre, w, [slice(None)])
        return product

    def weight_gradient(self, layer, grad_pre, x):
        """d loss / d W = grad_pre^T x: fp32."""
        gq, g_inverse = self.quantize((layer, "weight", "g"), grad_pre, "grad", sums_over_rows=True)
        xq, x_inverse = self.quantize((layer, "weight", "x"), x, "input", sums_over_rows=True)
        return (self.matmul(gq.T, xq).astype(np.float64) * g_inverse.T * x_inverse).astype(F32)
