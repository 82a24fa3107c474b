"""What the precision reference tests share (test_precision_reference.py, test_fp8_reference.py):
a data file and the model's initial masters made once, one training step of a layout with
AdamW's eps = 1 (its first-step update read from the checkpoint's moments), the reference's
update from precision_reference.Reference, and the measure between them (each tensor's relative
L2 error; the median over the model's tensors and the largest)."""
import os
import shutil
import tempfile
import unittest

import h5py
import numpy as np

from common import read_checkpoint, read_metrics, run
from precision_reference import Reference, adamw_first_update, relative_l2

SAMPLES, INPUTS, OUTPUTS = 64, 16, 8
MODEL = ["--dataset", "hdf5", "--layers", "8", "--hidden", "64", "--global-batch", str(SAMPLES), "--log-every", "0",
         "--lr", "1", "--eps", "1", "--weight-decay", "0", "--seed", "5"]
MOE = ["--moe-every", "2", "--experts", "4", "--top-k", "2"]
PIPELINE = ["--pp", "2", "--micro-batches", "4"]
# On a GPU (where one is present): the layout families once each, ranks sharing the GPU over
# host-staged MPI; (name, ranks, flags, tensor ranks of the reference).
GPU_LAYOUTS = [
    ("gpu one process", 1, [], 1),
    ("gpu dp", 2, ["--dp", "2"], 1),
    ("gpu zero-3", 2, ["--zero", "3"], 1),
    ("gpu tp+sp", 2, ["--tp", "2", "--sequence-parallel"], 2),
    ("gpu pp 1f1b", 2, PIPELINE, 1),
]


class ReferenceRuns(unittest.TestCase):
    """The data file and the initial masters are made once; each test trains one step per layout.
    `errors` collects what the checks measured, for a subclass's report."""

    @classmethod
    def setUpClass(cls):
        cls.directory = tempfile.mkdtemp(prefix="mlptrain-precision-")
        cls.errors = {}
        generator = np.random.default_rng(11)
        cls.x = generator.normal(0, 1, (SAMPLES, INPUTS)).astype(np.float32)
        cls.y = generator.normal(0, 1, (SAMPLES, OUTPUTS)).astype(np.float32)
        cls.data = os.path.join(cls.directory, "data.h5")
        with h5py.File(cls.data, "w") as file:
            file["x"], file["y"] = cls.x, cls.y
        cls.initial = {}
        for name, flags in (("dense", []), ("moe", MOE)):
            directory = os.path.join(cls.directory, "initial-" + name)
            run(cls.model(flags) + ["--steps", "0", "--checkpoint-dir", directory])
            cls.initial[name] = cls.masters(directory)

    # A subclass's report: the variable naming its result file, and its tolerance.
    report_variable = None
    tolerance = None

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.directory, ignore_errors=True)
        report = os.environ.get(cls.report_variable) if cls.report_variable else None
        if report:  # results/*_reference.json: the errors, with the command, machine and date
            from benchlib import write_result
            write_result(report, {"tolerance": cls.tolerance, "measure": "median over tensors of the relative L2 "
                                  "error of the first-step update (largest tensor beside it)",
                                  "errors": cls.errors})

    @classmethod
    def model(cls, flags):
        return MODEL + ["--data-path", cls.data] + list(flags)

    @staticmethod
    def masters(directory, prefix="model/"):
        with open(os.path.join(directory, "latest")) as handle:
            tensors = read_checkpoint(os.path.join(directory, handle.read().strip()))
        return {name[len(prefix):]: value for name, value in tensors.items() if name.startswith(prefix)}

    def first_update(self, name, flags, ranks):
        """The run's first-step update of every tensor (from its moments, checked against its
        masters' change), and its metrics."""
        directory = os.path.join(self.directory, name.replace(" ", "-"))
        metrics = directory + ".jsonl"
        run(self.model(flags) + ["--steps", "1", "--checkpoint-dir", directory, "--metrics", metrics], ranks)
        before = self.initial["moe" if "--moe-every" in flags else "dense"]
        after = self.masters(directory)
        exp_avg, exp_avg_sq = (self.masters(directory, f"optimizer/{moment}/") for moment in ("exp_avg", "exp_avg_sq"))
        update = {}
        for tensor, master in before.items():
            m_hat = exp_avg[tensor].astype(np.float64) / (1 - 0.9)
            v_hat = exp_avg_sq[tensor].astype(np.float64) / (1 - 0.999)
            update[tensor] = -m_hat / (np.sqrt(v_hat) + 1.0)
            applied = after[tensor].astype(np.float64) - master
            spacing = np.spacing(np.maximum(np.abs(master), np.abs(after[tensor])))
            np.testing.assert_array_less(np.abs(applied - update[tensor]), 4 * spacing,
                                         f"{name}: {tensor} moved otherwise than its moments say")
        steps, _ = read_metrics(metrics)
        return update, steps

    def reference_update(self, moe, dtype, **settings):
        """The reference's first-step update from the same masters on the same samples."""
        masters = self.initial["moe" if moe else "dense"]
        gradients, _ = Reference(masters, param=dtype, **settings).gradients(self.x, self.y)
        return {name: adamw_first_update(value) for name, value in gradients.items()}

    @staticmethod
    def errors_of(update, reference):
        """(median, largest) over the tensors of their relative L2 errors."""
        errors = [relative_l2(update[name], reference[name]) for name in reference]
        return float(np.median(errors)), max(errors)

    def check_against_reference(self, label, layouts, moe, tolerance, run_flags, dtype, **settings):
        """Each layout's first-step update against the reference's (with `settings`), the median
        error within `tolerance`. A layout is (name, ranks, flags, tensor ranks of the reference)."""
        for name, ranks, flags, tensor_ranks in layouts:
            with self.subTest(layout=name, label=label):
                flags = (MOE if moe else []) + ["--param-dtype", dtype] + list(run_flags) + flags
                update, steps = self.first_update(f"{label} {name}", flags, ranks)
                self.assertEqual(steps[0].get("skipped_steps", 0), 0, "the step was skipped")
                micro_batches = int(flags[flags.index("--micro-batches") + 1]) if "--micro-batches" in flags else 1
                loss_scale = steps[0].get("loss_scale", 1.0)
                reference = self.reference_update(moe, dtype, tensor_ranks=tensor_ranks, micro_batches=micro_batches,
                                                  loss_scale=loss_scale, **settings)
                median, largest = self.errors_of(update, reference)
                self.errors[f"{label} {name}"] = {"median": median, "largest": largest}
                print(f"{label} {name:>18}: first-step update {median:.1e} from the reference "
                      f"(largest tensor {largest:.1e})", flush=True)
                self.assertLessEqual(median, tolerance)
