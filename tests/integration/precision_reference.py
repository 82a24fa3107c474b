"""An independent emulation of DESIGN.md §2.7 in NumPy, written from the contract's text: the
gradients of one training step of the model of §2.1 (dense and MoE layers, MSE loss) with a
16-bit param type, rounding where the contract rounds and nowhere else.

- Rounding to bf16 and fp16 is done here on the bits of fp32 values, to nearest even.
- An "fp32 accumulation" is a sum formed in float64 and rounded to fp32 once: an fp32 sum in
  some order, which is all the contract fixes.
- Tensor parallelism over two ranks (`tensor_ranks=2`) adds its rounding points: a row-parallel
  layer's partial products rounded, summed in fp32 with the bias and rounded once; a column-
  parallel layer's partial input gradients rounded and their sum rounded; an MoE layer's experts
  split between the ranks, each rank's partial combine and partial input gradient rounded, and
  their sums rounded.
- `variant` names a deliberate break of the contract, for showing that a check rejects it:
  "product_first" (the product rounded before the bias is added) and "unrounded_grad_pre"
  (d(pre) left in fp32 for the products' backward); fp8_reference.py names its own.
- `fp8` ("tensorwise" or "rowwise") forms the dense layers' three products from fp8 operands as
  fp8_reference.py does; the rest of the step is as without it.
Nothing here reads the project's code: parameters come from a checkpoint, data from the file
the run read."""
import math

import numpy as np

from fp8_reference import Fp8Products

F32 = np.float32


def round_bf16(values):
    """fp32 values rounded to bf16 (kept as fp32), to nearest even: keep the high 16 bits."""
    values = np.asarray(values, F32)
    bits = values.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    result = rounded.astype(np.uint32).view(F32)
    return np.where(np.isnan(values), F32(np.nan), result)


def round_fp16(values):
    """fp32 values rounded to fp16 (kept as fp32), to nearest even: fp16's normal range keeps 10
    of fp32's 23 fraction bits; below 2^-14 its subnormals are the multiples of 2^-24 (exact in
    float64, where rint rounds to even); beyond 65504 it overflows to infinity."""
    values = np.asarray(values, F32)
    bits = values.view(np.uint32).astype(np.uint64)
    sign, magnitude = bits & 0x80000000, bits & 0x7FFFFFFF
    normal = (((magnitude + 0xFFF + ((magnitude >> 13) & 1)) >> 13) << 13) | sign
    result = normal.astype(np.uint32).view(F32)
    subnormal = (np.rint(values.astype(np.float64) * 2.0 ** 24) / 2.0 ** 24).astype(F32)
    result = np.where(np.abs(values) < 2.0 ** -14, subnormal, result)
    result = np.where(np.abs(result) > 65504, np.copysign(F32(np.inf), values), result)
    return np.where(np.isnan(values), F32(np.nan), result).astype(F32)


ROUNDERS = {"fp32": lambda values: np.asarray(values, F32), "bf16": round_bf16, "fp16": round_fp16}


def fp32(values):
    """A value computed exactly (float64) and rounded once to fp32."""
    return np.asarray(values, np.float64).astype(F32)


def exact_matmul(a, b, add=0.0):
    """a @ b (+ add) with fp32 accumulation: formed in float64 and rounded once."""
    return fp32(np.asarray(a, np.float64) @ np.asarray(b, np.float64) + add)


def float32_matmul(a, b, add=0.0):
    """a @ b (+ add) summed in fp32 in the BLAS's order: another order the contract allows."""
    return fp32(np.asarray(a, F32) @ np.asarray(b, F32) + np.asarray(add, F32))


ACCUMULATIONS = {"float64": exact_matmul, "float32": float32_matmul}


_erf = np.frompyfunc(math.erf, 1, 1)


def normal_cdf(x):
    return 0.5 * (1.0 + _erf(np.asarray(x, np.float64) / math.sqrt(2.0)).astype(np.float64))


def gelu(x):
    x = np.asarray(x, np.float64)
    return x * normal_cdf(x)


def gelu_derivative(x):
    x = np.asarray(x, np.float64)
    return normal_cdf(x) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def halves(extent, ranks):
    """Each rank's contiguous slice of an extent split over `ranks`."""
    return [slice(extent * rank // ranks, extent * (rank + 1) // ranks) for rank in range(ranks)]


def tensor_parts(moe_layers, layer_count):
    """Each layer's part under tensor parallelism: consecutive dense layers between MoE layers
    pair up as column then row; the last of an odd run is replicated."""
    parts = []
    for layer in range(layer_count):
        if layer in moe_layers:
            parts.append("experts")
            continue
        first = layer
        while first > 0 and first - 1 not in moe_layers:
            first -= 1
        if (layer - first) % 2 == 1:
            parts.append("row")
        elif layer + 1 < layer_count and layer + 1 not in moe_layers:
            parts.append("column")
        else:
            parts.append("replicated")
    return parts


class Reference:
    """One step's fp32 gradients of the model in `masters` (tensor name -> fp32 array, as a
    checkpoint holds them under /model, as "layers/NN/weight") on inputs x and targets y."""

    def __init__(self, masters, param="bf16", loss_scale=1.0, tensor_ranks=1, top_k=2, aux_loss_coef=0.01,
                 micro_batches=1, variant=None, accumulation="float64", fp8=None, fp8_grad_format="e4m3"):
        self.round = ROUNDERS[param]
        self.matmul = ACCUMULATIONS[accumulation]
        self.masters = masters
        self.loss_scale = loss_scale
        self.tensor_ranks = tensor_ranks
        self.top_k = top_k
        self.aux_loss_coef = aux_loss_coef
        self.micro_batches = micro_batches
        self.variant = variant
        self.fp8 = Fp8Products(fp8, fp8_grad_format, self.matmul, variant) if fp8 else None
        self.layer_count = len({name.split("/")[1] for name in masters if name.startswith("layers/")})
        self.moe_layers = {layer for layer in range(self.layer_count) if self.tensor(layer, "router/weight") is not None}
        self.parts = tensor_parts(self.moe_layers, self.layer_count)
        # The compute copy: each master rounded to the param type.
        self.weights = {name: self.round(value) for name, value in masters.items()}

    def tensor(self, layer, name):
        return self.masters.get(f"layers/{layer:02d}/{name}")

    def weight(self, layer, name):
        return self.weights[f"layers/{layer:02d}/{name}"]

    # Forward.
    def linear(self, layer, x):
        w, b = self.weight(layer, "weight"), self.weight(layer, "bias")
        if self.fp8 and self.tensor_ranks > 1 and self.parts[layer] == "row":
            partials = [self.round(p) for p in self.fp8.forward_partials(layer, x, w, halves(w.shape[1], self.tensor_ranks))]
            return self.round(fp32(np.sum(np.asarray(partials, np.float64), axis=0) + b))
        if self.fp8:
            return self.round(self.fp8.forward(layer, x, w, b))
        if self.variant == "product_first":
            return self.round(fp32(self.round(self.matmul(x, w.T)) + b))
        if self.tensor_ranks > 1 and self.parts[layer] == "row":
            partials = [self.round(self.matmul(x[:, part], w[:, part].T)) for part in halves(w.shape[1], self.tensor_ranks)]
            return self.round(fp32(np.sum(np.asarray(partials, np.float64), axis=0) + b))
        return self.round(self.matmul(x, w.T, b))

    def expert_ranks_of(self, experts):
        """The experts each tensor rank computes (all of them on one rank)."""
        return [range(part.start, part.stop) for part in halves(experts, self.tensor_ranks)]

    def moe_forward(self, layer, x, saved):
        router, weights, biases = (self.weight(layer, name) for name in ("router/weight", "experts/weight",
                                                                             "experts/bias"))
        experts = router.shape[0]
        logits = self.round(self.matmul(x, router.T))
        shifted = np.asarray(logits, np.float64) - np.max(logits, axis=1, keepdims=True)
        probabilities = fp32(np.exp(shifted) / np.sum(np.exp(shifted), axis=1, keepdims=True))
        chosen = np.argsort(-probabilities, axis=1, kind="stable")[:, :self.top_k]  # ties: the lower index
        saved.update(x=x, probabilities=probabilities, chosen=chosen, experts={})
        partial_sums = []
        for rank_experts in self.expert_ranks_of(experts):
            total = np.zeros(x.shape, np.float64)
            for expert in rank_experts:
                tokens = np.nonzero(np.any(chosen == expert, axis=1))[0]
                expert_x = x[tokens]
                if self.variant == "product_first":
                    pre = self.round(fp32(self.round(self.matmul(expert_x, weights[expert].T)) + biases[expert]))
                else:
                    pre = self.round(self.matmul(expert_x, weights[expert].T, biases[expert]))
                out = self.round(fp32(gelu(pre)))
                saved["experts"][expert] = (tokens, pre, out)
                total[tokens] += probabilities[tokens, expert][:, None].astype(np.float64) * out
            partial_sums.append(self.round(fp32(total)))
        return self.sum_partials(partial_sums)

    def sum_partials(self, partials):
        """One rank's rounded result, or the rounded fp32 sum of the ranks' rounded partials."""
        if len(partials) == 1:
            return partials[0]
        return self.round(fp32(np.sum(np.asarray(partials, np.float64), axis=0)))

    # Backward.
    def linear_backward(self, layer, x, pre, grad_output, gelu_after, grads):
        w = self.weight(layer, "weight")
        if gelu_after:
            grad_pre = fp32(np.asarray(grad_output, np.float64) * gelu_derivative(pre))
            if self.variant != "unrounded_grad_pre":
                grad_pre = self.round(grad_pre)
        else:
            grad_pre = grad_output
        weight_gradient = self.fp8.weight_gradient(layer, grad_pre, x) if self.fp8 else self.matmul(grad_pre.T, x)
        self.add(grads, f"layers/{layer:02d}/weight", weight_gradient)
        self.add(grads, f"layers/{layer:02d}/bias", fp32(np.sum(np.asarray(grad_pre, np.float64), axis=0)))
        if layer == 0:
            return None
        if self.fp8 and self.tensor_ranks > 1 and self.parts[layer] == "column":
            return self.sum_partials([self.round(p) for p in self.fp8.input_gradient_partials(
                layer, grad_pre, w, halves(w.shape[0], self.tensor_ranks))])
        if self.fp8:
            return self.round(self.fp8.input_gradient(layer, grad_pre, w))
        if self.tensor_ranks > 1 and self.parts[layer] == "column":
            return self.sum_partials([self.round(self.matmul(grad_pre[:, part], w[part, :]))
                                      for part in halves(w.shape[0], self.tensor_ranks)])
        return self.round(self.matmul(grad_pre, w))

    def moe_backward(self, layer, grad_output, saved, tokens_in_micro_batch, grads):
        router, weights = self.weight(layer, "router/weight"), self.weight(layer, "experts/weight")
        x, probabilities, chosen = saved["x"], saved["probabilities"], saved["chosen"]
        experts = router.shape[0]
        grad_probabilities = np.zeros(probabilities.shape, np.float64)
        partial_inputs = []
        name = f"layers/{layer:02d}/experts/"
        weight_grads = np.zeros(weights.shape, F32)
        bias_grads = np.zeros((experts, weights.shape[1]), F32)
        for rank, rank_experts in enumerate(self.expert_ranks_of(experts)):
            total = np.zeros(x.shape, np.float64)
            for expert in rank_experts:
                tokens, pre, out = saved["experts"][expert]
                scale = probabilities[tokens, expert][:, None]
                grad_out = self.round(fp32(scale.astype(np.float64) * grad_output[tokens]))
                grad_pre = fp32(np.asarray(grad_out, np.float64) * gelu_derivative(pre))
                if self.variant != "unrounded_grad_pre":
                    grad_pre = self.round(grad_pre)
                weight_grads[expert] = self.matmul(grad_pre.T, x[tokens])
                bias_grads[expert] = fp32(np.sum(np.asarray(grad_pre, np.float64), axis=0))
                grad_probabilities[tokens, expert] = fp32(np.sum(np.asarray(grad_output[tokens], np.float64) * out,
                                                                 axis=1))
                total[tokens] += self.round(self.matmul(grad_pre, weights[expert]))  # the rows travel rounded
            partial_inputs.append(total)
        self.add(grads, name + "weight", weight_grads)
        self.add(grads, name + "bias", bias_grads)
        # The router: d p plus the balancing loss's a E f_e / (T M) on every token, through the
        # softmax in fp32, rounded.
        fraction = np.array([np.count_nonzero(chosen == expert) for expert in range(experts)]) / (
            self.top_k * tokens_in_micro_batch)
        grad_probabilities += (self.aux_loss_coef * experts * fraction / (tokens_in_micro_batch * self.micro_batches)
                               * self.loss_scale)[None, :]
        grad_probabilities = fp32(grad_probabilities).astype(np.float64)
        p = probabilities.astype(np.float64)
        grad_logits = self.round(fp32(p * (grad_probabilities - np.sum(p * grad_probabilities, axis=1, keepdims=True))))
        self.add(grads, f"layers/{layer:02d}/router/weight", self.matmul(grad_logits.T, x))
        partial_inputs[0] = partial_inputs[0] + self.matmul(grad_logits, router)
        return self.sum_partials([self.round(fp32(partial)) for partial in partial_inputs])

    @staticmethod
    def add(grads, name, value):
        grads[name] = fp32(grads[name].astype(np.float64) + value) if name in grads else fp32(value)

    def micro_batch(self, x, y, global_samples, grads):
        activations = [self.round(x)]
        saved = {}
        pres = []
        for layer in range(self.layer_count):
            last = layer == self.layer_count - 1
            if layer in self.moe_layers:
                saved[layer] = {}
                output = self.moe_forward(layer, activations[-1], saved[layer])
                pres.append(None)
            else:
                pre = self.linear(layer, activations[-1])
                pres.append(pre)
                output = pre if last else self.round(fp32(gelu(pre)))
            activations.append(output)
        prediction = activations[-1].astype(F32)  # widened; the loss in fp32
        normalizer = global_samples * y.shape[1]
        grad = fp32(fp32(F32(2.0 / normalizer) * (prediction - y)) * F32(self.loss_scale))
        grad = self.round(grad)
        for layer in reversed(range(self.layer_count)):
            if layer in self.moe_layers:
                grad = self.moe_backward(layer, grad, saved[layer], x.shape[0], grads)
            else:
                grad = self.linear_backward(layer, activations[layer], pres[layer], grad,
                                            layer != self.layer_count - 1, grads)
        return float(np.sum((prediction.astype(np.float64) - y) ** 2) / normalizer)

    def gradients(self, x, y):
        """The step's fp32 gradients, unscaled (keyed like the checkpoint's tensors) and its loss."""
        grads = {}
        rows = x.shape[0] // self.micro_batches
        loss = 0.0
        for index in range(self.micro_batches):
            part = slice(index * rows, (index + 1) * rows)
            loss += self.micro_batch(x[part], y[part], x.shape[0], grads)
        inverse = F32(1.0 / self.loss_scale)
        return {name: fp32(value * inverse) for name, value in grads.items()}, loss


def adamw_first_update(gradient, learning_rate=1.0, eps=1.0):
    """AdamW's first step without weight decay: m and v bias-corrected are g and g^2, so the
    update is -lr g / (|g| + eps)."""
    g = np.asarray(gradient, np.float64)
    return -learning_rate * g / (np.abs(g) + eps)


def relative_l2(value, reference):
    """|value - reference| / |reference|; against a zero reference, relative to the value (1 for
    any value but zeros), so that a gradient lost altogether counts in full."""
    value, reference = np.asarray(value, np.float64), np.asarray(reference, np.float64)
    return float(np.linalg.norm(value - reference) / (np.linalg.norm(reference) or np.linalg.norm(value) or 1.0))
