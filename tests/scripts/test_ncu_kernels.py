"""scripts/gpu/ncu_kernels.py, the profile's kernel table: Nsight Compute's CSV (one row per
kernel launch and metric, numbers with thousands separators) becomes one row per kernel with its
calls, time, DRAM bytes, rate against the copy rate and share of the GPU's time, over the
launches of one whole step where the window holds two updates; cuBLAS's kernels count as GEMMs and
template arguments leave the names."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.environ.get("MLPTRAIN_SOURCE", os.path.join(os.path.dirname(__file__), "..", "..")),
                      "scripts", "gpu", "ncu_kernels.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')
GELU = "void mlptrain::(anonymous namespace)::gelu_forward_kernel<mlptrain::(anonymous namespace)::DeviceBf16, 8>" \
       "(const __nv_bfloat16 *, __nv_bfloat16 *, long)"
GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize256x128x64_execute_kernel__5x_cublas"


def row(launch, kernel, metric, value):
    return f'"{launch}","1","mlptrain","host","{kernel}","1","7","(256, 1, 1)","(8192, 1, 1)","0","9.0",' \
           f'"Command line profiler metrics","{metric}","unit","{value}"'


ADAMW = "void mlptrain::(anonymous namespace)::adamw_kernel(float *, const float *, long)"


def kernel_table(lines):
    """The script's table of a profile of `lines`, and its standard error."""
    with tempfile.TemporaryDirectory() as directory:
        profile, output = os.path.join(directory, "profile.csv"), os.path.join(directory, "table.json")
        with open(profile, "w") as handle:
            handle.write("\n".join(lines) + "\n")
        result = subprocess.run([sys.executable, SCRIPT, profile, "--copy-gbps", "4000", "--output", output],
                                capture_output=True, text=True)
        if result.returncode != 0:
            raise AssertionError(result.stderr)
        with open(output) as handle:
            return json.load(handle), result.stderr


class NcuKernels(unittest.TestCase):
    def test_the_table_covers_one_whole_step(self):
        # A window from the middle of one step (a GEMM, its update) through a whole step to the
        # start of the next: the table holds the whole step's launches only, the IDs in their order
        # whatever the rows' order.
        order = [(4, GEMM), (0, GEMM), (1, ADAMW), (2, GELU), (3, GEMM), (5, ADAMW), (6, GELU), (7, GEMM)]
        lines = ["==PROF== Connected to process", HEADER]
        # Each launch takes 1 us more than the one before: the sum says which launches are in.
        lines += [row(launch, kernel, "gpu__time_duration.sum", f"{1000 * (launch + 1):,}") for launch, kernel in order]
        table, _ = kernel_table(lines)
        self.assertTrue(table["whole_step"])
        self.assertEqual({entry["kernel"]: entry["calls"] for entry in table["kernels"]},
                         {GEMM: 2, "gelu_forward_kernel": 1, "adamw_kernel": 1})
        self.assertAlmostEqual(table["gpu_ms"], (3 + 4 + 5 + 6) / 1000)

    def test_launches_become_one_row_a_kernel(self):
        lines = ["==PROF== Connected to process", HEADER]
        for launch in (0, 2):  # two GELU launches of 128 MiB read and written in 70 us each
            lines += [row(launch, GELU, "dram__bytes_read.sum", "134,217,728"),
                      row(launch, GELU, "dram__bytes_write.sum", "134,217,728"),
                      row(launch, GELU, "gpu__time_duration.sum", "70,000")]
        lines += [row(1, GEMM, "gpu__time_duration.sum", "1,400,000"), row(1, GEMM, "dram__bytes_read.sum", "0")]
        table, errors = kernel_table(lines)
        # No update in the window: every launch, and a word that it is not one step.
        self.assertFalse(table["whole_step"])
        self.assertIn("not one whole step", errors)
        kernels = {entry["kernel"]: entry for entry in table["kernels"]}
        self.assertEqual(set(kernels), {"gelu_forward_kernel", GEMM})
        gelu = kernels["gelu_forward_kernel"]
        self.assertEqual(gelu["calls"], 2)
        self.assertAlmostEqual(gelu["ms"], 0.14)
        self.assertAlmostEqual(gelu["gbytes_per_s"], 2 * 134217728 / 70000)
        self.assertAlmostEqual(gelu["of_copy_rate"], gelu["gbytes_per_s"] / 4000)
        self.assertFalse(gelu["gemm"])
        self.assertTrue(kernels[GEMM]["gemm"])
        self.assertAlmostEqual(table["gemm_share_of_gpu_time"], 1.4 / 1.54)


if __name__ == "__main__":
    unittest.main()
