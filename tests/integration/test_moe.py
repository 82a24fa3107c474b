"""MoE layers and expert parallelism: every layout (data parallel, expert parallel at 2 and 4
ranks, expert x pipeline parallel, ZeRO-1 on the dense layers) reproduces the one-process MoE run, top-1 and top-2, dropless
and at capacity; the loss, auxiliary loss, expert loads and dropped assignments of a step equal an
independent computation of DESIGN.md's formulas from the initial checkpoint; all-to-all bytes
predicted from the routing counts equal the ledger's; experts are checkpointed whole and resume
across EP sizes; expert parameter memory per rank shrinks by the EP size."""
import math
import os
import unittest

import h5py
import numpy as np

from common import TrainingTestCase, read_checkpoint, read_metrics, run

HIDDEN, EXPERTS, LAYERS = 16, 4, 4
BASE = ["--dataset", "teacher", "--input-dim", "6", "--output-dim", "3", "--layers", LAYERS,
        "--hidden", HIDDEN, "--moe-every", "1", "--experts", EXPERTS, "--global-batch", "32",
        "--micro-batches", "2", "--log-every", "0", "--lr", "1e-2", "--aux-loss-coef", "0.05"]
ROUTINGS = {"top-1 at capacity 1.0": ["--top-k", "1", "--capacity-factor", "1.0"],
            "top-2 dropless": ["--top-k", "2"],
            "top-1 dropless": ["--top-k", "1"],
            "top-2 at capacity 0.75": ["--top-k", "2", "--capacity-factor", "0.75"]}
# (flags, ranks): DP 2, EP 2, EP 4 with DP 4, EP 2 with DP 4, EP 2 x PP 2.
LAYOUTS = [(["--dp", "2"], 2), (["--ep", "2"], 2), (["--ep", "4"], 4), (["--ep", "2"], 4),
           (["--ep", "2", "--pp", "2"], 4)]


def gelu(values):
    return values * 0.5 * (1.0 + np.frompyfunc(math.erf, 1, 1)(values / math.sqrt(2.0)).astype(np.float64))


def softmax(logits):
    shifted = np.exp(logits - logits.max(axis=1, keepdims=True))
    return shifted / shifted.sum(axis=1, keepdims=True)


def moe_reference(tensors, x, y, layers, micro_batches, top_k, capacity_factor, aux_coef):
    """The step's loss, aux loss, expert loads and dropped assignments of DESIGN.md §2.1, in
    float64, written from the formulas and independent of mlptrain's code."""
    loss_sum, aux_total, dropped = 0.0, 0.0, 0
    loads = {}
    for chunk_x, chunk_y in zip(np.split(x, micro_batches), np.split(y, micro_batches)):
        h = chunk_x.astype(np.float64)
        for layer in range(layers):
            base = f"model/layers/{layer:02d}/"
            if base + "router/weight" in tensors:
                router = tensors[base + "router/weight"].astype(np.float64)
                weights = tensors[base + "experts/weight"].astype(np.float64)
                biases = tensors[base + "experts/bias"].astype(np.float64)
                experts, tokens = router.shape[0], h.shape[0]
                p = softmax(h @ router.T)
                # top-k, ties to the lower index; capacity in token order
                chosen = [sorted(range(experts), key=lambda e: (-p[t, e], e))[:top_k] for t in range(tokens)]
                capacity = math.ceil(capacity_factor * top_k * tokens / experts) if capacity_factor > 0 else math.inf
                counts = np.zeros(experts)
                out = np.zeros_like(h)
                for t in range(tokens):
                    for e in chosen[t]:
                        if counts[e] < capacity:
                            out[t] += p[t, e] * gelu(h[t] @ weights[e].T + biases[e])
                        counts[e] += 1
                fraction = counts / (top_k * tokens)
                aux_total += aux_coef * experts * float(np.sum(fraction * p.mean(axis=0)))
                dropped += int(np.sum(np.maximum(counts - capacity, 0))) if capacity_factor > 0 else 0
                loads[layer] = loads.get(layer, 0) + counts
                h = out
            else:
                h = h @ tensors[base + "weight"].astype(np.float64).T + tensors[base + "bias"]
                if layer < layers - 1:
                    h = gelu(h)
        loss_sum += float(np.sum((h - chunk_y) ** 2))
    loss = loss_sum / y.size
    return loss, aux_total / micro_batches, [list(loads[layer]) for layer in sorted(loads)], dropped


class Moe(TrainingTestCase):
    def test_layouts_reproduce_one_process(self):
        for routing_name, routing in ROUTINGS.items():
            model = BASE + routing + ["--steps", "4"]
            reference_steps, _, reference = self.train("reference", model, 1)
            self.assertTrue(any(step["dropped_tokens"] > 0 for step in reference_steps) or
                            "dropless" in routing_name)
            for flags, ranks in LAYOUTS:
                with self.subTest(routing=routing_name, layout=flags, ranks=ranks):
                    steps, _, tensors = self.train("layout", model + flags, ranks)
                    self.assert_losses_close(steps, reference_steps)
                    for mine, theirs in zip(steps, reference_steps):
                        self.assertLessEqual(abs(mine["aux_loss"] - theirs["aux_loss"]),
                                             1e-5 * theirs["aux_loss"])
                        self.assertEqual(mine["expert_load"], theirs["expert_load"])
                        self.assertEqual(mine["dropped_tokens"], theirs["dropped_tokens"])
                    self.assert_tensors_close(tensors, reference)

    def test_zero_shards_routers_over_dp_and_experts_over_their_replicas(self):
        # Five layers: dense 0, MoE 1-3 (every one), dense 4; clipping checks the global norm.
        model = BASE[:BASE.index("--layers")] + ["--layers", "5"] + BASE[BASE.index("--layers") + 2:]
        model += ROUTINGS["top-1 at capacity 1.0"] + ["--steps", "3", "--grad-clip", "0.05"]
        reference_steps, _, reference = self.train("reference", model, 1)
        for flags, ranks in ((["--zero", "2", "--ep", "2"], 4), (["--zero", "3", "--ep", "2", "--recompute"], 4),
                             (["--zero", "1", "--ep", "2", "--pp", "2"], 4)):
            with self.subTest(layout=flags, ranks=ranks):
                steps, summary, tensors = self.train("zero", model + flags, ranks)
                self.assert_losses_close(steps, reference_steps)
                self.assert_tensors_close(tensors, reference)
                self.assert_predicted(summary)

    def test_step_matches_independent_formulas(self):
        rng = np.random.default_rng(7)
        data = self.path("data.h5")
        x = rng.standard_normal((64, 6)).astype(np.float32)
        y = rng.standard_normal((64, 3)).astype(np.float32)
        with h5py.File(data, "w") as file:
            file["x"], file["y"] = x, y
        for top_k, capacity in ((2, 0.5), (1, 0.0), (2, 0.0)):
            model = ["--dataset", "hdf5", "--data-path", data, "--layers", LAYERS, "--hidden", HIDDEN,
                     "--moe-every", "1", "--experts", EXPERTS, "--top-k", top_k, "--capacity-factor",
                     capacity, "--global-batch", "32", "--micro-batches", "2", "--log-every", "0",
                     "--aux-loss-coef", "0.05"]
            initial = self.path(f"initial{top_k}{capacity}")
            run(model + ["--steps", "0", "--checkpoint-dir", initial])
            tensors = read_checkpoint(os.path.join(initial, "step_00000000.h5"))
            loss, aux, loads, dropped = moe_reference(tensors, x[:32], y[:32], LAYERS, 2, top_k,
                                                      capacity, 0.05)
            if capacity > 0:
                self.assertGreater(dropped, 0)  # the case exercises dropping
            for ranks, flags in ((1, []), (2, ["--ep", "2"])):
                with self.subTest(top_k=top_k, capacity=capacity, ranks=ranks):
                    metrics = self.path("step.jsonl")
                    run(model + ["--steps", "1", "--metrics", metrics] + flags, ranks)
                    step = read_metrics(metrics)[0][0]
                    self.assertLessEqual(abs(step["loss"] - loss), 1e-5 * loss)
                    self.assertLessEqual(abs(step["aux_loss"] - aux), 1e-5 * aux)
                    self.assertEqual(step["expert_load"], loads)
                    self.assertEqual(step["dropped_tokens"], dropped)

    def test_all_to_all_bytes_follow_the_routing(self):
        metrics = self.path("ep.jsonl")
        run(BASE + ROUTINGS["top-2 dropless"] + ["--steps", "3", "--ep", "2", "--metrics", metrics], 2)
        steps, summary = read_metrics(metrics)
        exchanged = summary["comm_per_step"]["all_to_all"]
        self.assertGreater(exchanged["measured_bytes"], 0)
        self.assertLessEqual(abs(exchanged["predicted_bytes"] - exchanged["measured_bytes"]), 1)
        # Dropless top-2: rank 0 sends each of its 8 tokens' 2 rows per micro-batch out and back in
        # forward and backward; what it receives it returns: at least 4 x its own rows per layer.
        own_rows_bytes = 2 * 8 * 2 * 4 * HIDDEN * 2  # rows x micro-batches x bytes x layers
        self.assertTrue(all(step["comm_bytes"]["all_to_all"] >= 2 * own_rows_bytes for step in steps))

    def test_expert_memory_shrinks_with_ep(self):
        memory = {}
        for flags, ranks in (([], 2), (["--ep", "2"], 2)):
            metrics = self.path("memory.jsonl")
            run(BASE + ["--steps", "1", "--metrics", metrics] + flags, ranks)
            placement = read_metrics(metrics)[1]["placement"]["params"]
            self.assertEqual(placement["predicted_bytes"], placement["measured_bytes"])
            memory[len(flags)] = placement["measured_bytes"]
        moe_layers = LAYERS - 2
        expert_bytes = 4 * moe_layers * EXPERTS * (HIDDEN * HIDDEN + HIDDEN)
        self.assertEqual(memory[0] - memory[2], expert_bytes // 2)

    def test_checkpoints_hold_whole_experts_and_resume_across_ep_sizes(self):
        model = BASE + ROUTINGS["top-1 at capacity 1.0"]
        written = self.path("ep4")
        run(model + ["--steps", "1", "--ep", "4", "--checkpoint-dir", written], 4)
        with h5py.File(os.path.join(written, "step_00000001.h5"), "r") as file:
            self.assertEqual(file["model/layers/01/experts/weight"].shape, (EXPERTS, HIDDEN, HIDDEN))
            self.assertEqual(file["model/layers/01/experts/bias"].shape, (EXPERTS, HIDDEN))
            self.assertEqual(file["model/layers/01/router/weight"].shape, (EXPERTS, HIDDEN))
            self.assertEqual(file["optimizer/exp_avg/layers/02/experts/weight"].shape,
                             (EXPERTS, HIDDEN, HIDDEN))
        self.assert_resumes_across_layouts(
            model, [(["--ep", "2"], 2, [], 1), ([], 1, ["--ep", "4"], 4),
                    (["--ep", "4"], 4, ["--ep", "2", "--pp", "2"], 4),
                    # sharded experts (ZeRO over edp) resume whole, and the other way round
                    (["--ep", "2", "--zero", "3"], 4, [], 1), ([], 1, ["--zero", "2"], 4),
                    # experts split over tensor ranks too
                    (["--tp", "2", "--ep", "2", "--zero", "3"], 4, [], 1), ([], 1, ["--tp", "2"], 2)], steps=4)


if __name__ == "__main__":
    unittest.main()
