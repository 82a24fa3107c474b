"""commbench on the MPI host path and on the host-staged path over loopback device buffers: every
collective at 2 and 4 ranks gives exactly the expected result at every size (in fp32, bf16 and fp16),
with sizes in nccl-tests' convention and bus bandwidth the algorithm
bandwidth times nccl-tests' bus factor, in place and out of place; the identity rows hold the
all-reduce against reduce-scatter plus all-gather; a list of element types, each --report mode and the CSV
file give what they say; the plot script draws its output; bad flags get one line
and exit 2 on every rank. The device paths' pinned copies are exact too, and the GPU speed script
(scripts/gpu/bench.py) runs end to end on loopback. Where a GPU is present, the NCCL path at world
size 1 is exact too (elsewhere that test says why it skips)."""
import csv
import json
import os
import shutil
import subprocess
import sys
import unittest

from common import SOURCE_ROOT, MPIEXEC, TrainingTestCase

COMMBENCH = os.path.join(os.path.dirname(os.environ.get("MLPTRAIN", "build/mlptrain")), "commbench")
COLLECTIVES = ["all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "reduce", "gather", "scatter",
               "send_recv"]
IN_PLACE = {"all_reduce", "reduce_scatter", "all_gather", "reduce", "gather", "scatter", "mpi_all_reduce"}


def commbench(arguments, ranks):
    return subprocess.run([MPIEXEC, "-n", str(ranks), COMMBENCH] + arguments, capture_output=True,
                          text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))


def bus_factor(collective, ranks):
    if collective in ("all_reduce", "mpi_all_reduce"):
        return 2 * (ranks - 1) / ranks
    return 1 if collective in ("broadcast", "reduce", "send_recv") else (ranks - 1) / ranks


def measurements(stdout):
    """The measurement rows of --json output (the identity rows apart)."""
    rows = [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]
    return [row for row in rows if row["collective"] != "identity"], [row for row in rows if row["collective"] == "identity"]


class Commbench(TrainingTestCase):
    def exact_rows(self, arguments, ranks):
        """commbench's JSON rows for every collective, each checked correct."""
        result = commbench(arguments + ["--iterations", "2", "--warmup", "1", "--json"], ranks)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows, _ = measurements(result.stdout)
        self.assertEqual(sorted({row["collective"] for row in rows}), sorted(COLLECTIVES))
        for row in rows:
            self.assertTrue(row["correct"], row)
            self.assertEqual(row["wrong"], 0, row)
            # An in-place column exactly for the operations that have one.
            self.assertEqual("in_place_wrong" in row, row["collective"] in IN_PLACE, row)
            self.assertEqual(row.get("in_place_wrong", 0), 0, row)
        return result, rows

    def test_half_elements_are_exact_and_named(self):
        staged = ["--path", "mpi-staged", "--device", "loopback"]
        for dtype, ranks, path in [("bf16", 2, []), ("fp16", 4, []), ("bf16", 4, staged + ["--chunk-bytes", "1K"])]:
            with self.subTest(dtype=dtype, ranks=ranks, path=path):
                _, rows = self.exact_rows(["--dtype", dtype, "--min-bytes", "8", "--max-bytes", "64K",
                                           "--step-factor", "8"] + path, ranks)
                for row in rows:
                    self.assertEqual(row["dtype"], dtype)
                    per_rank = row["collective"] in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter")
                    self.assertEqual(row["bytes"] % (2 * ranks if per_rank else 2), 0, row)

    def test_half_sums_within_the_format_bound(self):
        """A sum of 16-bit floats is held within n u sum|x| of the fp32 sum of the same inputs (each
        at least 1): the bound lies between n^2 u and 2 n^2 u, below 1, so a missing or doubled
        contribution (a change of at least 1) would count as wrong; bf16 sums do round within it,
        fp16 ones (inputs k/128 apart, sums below 16) come out exact."""
        staged = ["--path", "mpi-staged", "--device", "loopback"]
        for ranks, path in [(4, []), (4, staged), (2, [])]:
            with self.subTest(ranks=ranks, path=path):
                _, rows = self.exact_rows(["--dtype", "bf16,fp16", "--min-bytes", "64", "--max-bytes", "16K",
                                           "--step-factor", "16"] + path, ranks)
                sums = [row for row in rows if row["collective"] in ("all_reduce", "reduce", "reduce_scatter")]
                for row in sums:
                    unit = 2.0 ** -8 if row["dtype"] == "bf16" else 2.0 ** -11
                    self.assertLessEqual(row["max_error"], row["error_bound"], row)
                    self.assertGreaterEqual(row["error_bound"], ranks * ranks * unit, row)
                    self.assertLessEqual(row["error_bound"], 2 * ranks * ranks * unit, row)
                    self.assertLess(row["error_bound"], 1.0, row)
                    if row["dtype"] == "fp16":
                        self.assertEqual(row["max_error"], 0.0, row)
                self.assertGreater(max(row["max_error"] for row in sums if row["dtype"] == "bf16"), 0.0)
                for row in rows:  # everything else is exact
                    if row not in sums:
                        self.assertEqual((row["max_error"], row["error_bound"]), (0.0, 0.0), row)

    def test_every_collective_is_exact_at_2_and_4_ranks(self):
        staged = ["--path", "mpi-staged", "--device", "loopback"]
        for ranks, path in [(2, []), (4, []), (2, staged + ["--chunk-bytes", "1K"]),
                            (4, staged), (2, staged + ["--chunk-bytes", "0"])]:
            with self.subTest(ranks=ranks, path=path):
                result, rows = self.exact_rows(["--min-bytes", "8", "--max-bytes", "128K", "--step-factor", "4"] + path,
                                               ranks)
                for row in rows:
                    self.assertEqual((row["path"], row["ranks"], row["device"]),
                                     ("mpi-staged", ranks, "loopback") if path else ("mpi-host", ranks, "cpu"))
                    # A whole float per rank for the per-rank collectives.
                    per_rank = row["collective"] in ("reduce_scatter", "all_gather", "all_to_all", "gather", "scatter")
                    self.assertEqual(row["bytes"] % (4 * ranks if per_rank else 4), 0, row)
                    self.assertAlmostEqual(row["busbw_gbps"], row["algbw_gbps"] * bus_factor(row["collective"], ranks))
                    self.assertAlmostEqual(row["algbw_gbps"], row["bytes"] / (row["time_us"] * 1e3))
                largest = max(row["bytes"] for row in rows if row["collective"] == "all_reduce")
                self.assertEqual(largest, 128 * 1024)  # 8 B x 4^7
                results = self.path(f"commbench{ranks}{'_'.join(path)}.jsonl")
                with open(results, "w") as handle:
                    handle.write(result.stdout)
                picture = self.path(f"commbench{ranks}{len(path)}.png")
                subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "tools", "commbench_plot.py"),
                                results, "--output", picture], check=True, capture_output=True)
                with open(picture, "rb") as handle:
                    self.assertEqual(handle.read(8), b"\x89PNG\r\n\x1a\n")

    def test_device_copies_are_exact(self):
        result = commbench(["--path", "mpi-staged", "--device", "loopback", "--collectives",
                            "copy_to_host,copy_to_device", "--min-bytes", "4", "--max-bytes", "1M",
                            "--step-factor", "16", "--iterations", "2", "--json"], 2)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows = [json.loads(line) for line in result.stdout.splitlines()]
        self.assertEqual([(r["collective"], r["bytes"]) for r in rows],
                         [(c, 4 * 16 ** i) for c in ("copy_to_host", "copy_to_device") for i in range(5)])
        for row in rows:
            self.assertTrue(row["correct"], row)
            self.assertEqual(row["busbw_gbps"], row["algbw_gbps"])

    def test_gpu_speed_script_runs_on_loopback(self):
        result = subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "gpu", "bench.py"),
                                 "--device", "loopback", "--tiny", "--rounds", "1", "--output-dir", self.directory],
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        with open(self.path("step.json")) as handle:
            steps = json.load(handle)
        step = steps["fp32"]
        # fp8 steps against a bf16 step of the same run (the CPU's emulation here).
        self.assertEqual({"tensorwise", "rowwise", "bf16_step_ms", "bf16_losses"}, set(steps["fp8"]))
        for recipe in ("tensorwise", "rowwise"):
            self.assertAlmostEqual(steps["fp8"][recipe]["step_over_bf16"],
                                   steps["fp8"][recipe]["step_ms"] / steps["fp8"]["bf16_step_ms"])
        # Every timed run trained: its losses kept, the last below the first; fp8's against bf16's.
        for losses in [step["losses"], steps["fp8"]["bf16_losses"]] + [steps["fp8"][r]["losses"] for r in ("tensorwise", "rowwise")]:
            self.assertEqual(len(losses["every_step"]), 60)
            self.assertLess(losses["last"], losses["first"])
            self.assertNotIn("refused", losses)
        for recipe in ("tensorwise", "rowwise"):
            self.assertAlmostEqual(steps["fp8"][recipe]["last_loss_over_bf16"],
                                   steps["fp8"][recipe]["losses"]["last"] / steps["fp8"]["bf16_losses"]["last"])
        self.assertGreater(step["gemm_ms_per_step"], 0)
        self.assertAlmostEqual(step["gemm_share_of_step"], step["gemm_ms_per_step"] / step["step_ms"])
        self.assertAlmostEqual(step["data_wait_share_of_step"], step["data_wait_ms"] / step["step_ms"])
        with open(self.path("kernels.json")) as handle:
            kernels = {row["kernel"]: row for row in json.load(handle)["precisions"]["fp32"]["kernels"]}
        self.assertTrue({"gelu_forward", "gelu_backward_with_bias_grad", "column_sums", "adamw",
                         "generate_mixture_samples"} <= set(kernels))
        for row in kernels.values():
            self.assertGreater(row["ms"], 0)
        with open(self.path("staging.json")) as handle:
            staging = json.load(handle)
        self.assertEqual([row["ranks"] for row in staging["world_sizes"]], [1, 2])
        for row in staging["world_sizes"]:
            # The chunk size staged fastest, and the bound at it: its slowest stage alone.
            best = row["sweep"][row["best_chunk_bytes"]]
            self.assertEqual(row["staged_chunked_gbps"], max(chunk["staged_gbps"] for chunk in row["sweep"].values()))
            bound = min(row["copy_to_host_gbps"], row["copy_to_device_gbps"], best["mpi_host_all_reduce_gbps"])
            self.assertAlmostEqual(row["chunked_over_bound"], row["staged_chunked_gbps"] / bound)
        with open(self.path("commbench.json")) as handle:
            rows = [row for row in json.load(handle)["rows"] if "busbw_gbps" in row]  # not the identity lines
        # Every collective staged, each size checked exactly (no NCCL without a GPU).
        self.assertEqual({row["path"] for row in rows}, {"mpi-staged"})
        self.assertTrue({"all_reduce", "reduce_scatter", "all_gather", "all_to_all", "broadcast", "send_recv"} <=
                        {row["collective"] for row in rows})
        self.assertTrue(all(row["correct"] for row in rows))
        # A diverging run gives no figure: its speed refused, the reason beside its losses.
        diverging = os.path.join(self.directory, "diverging")
        result = subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "gpu", "bench.py"),
                                 "--device", "loopback", "--tiny", "--parts", "fp8", "--lr", "5", "--steps", "20",
                                 "--output-dir", diverging], capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        with open(os.path.join(diverging, "step.json")) as handle:
            fp8 = json.load(handle)["fp8"]
        self.assertIsNone(fp8["bf16_step_ms"])
        for recipe in ("tensorwise", "rowwise"):
            self.assertIsNone(fp8[recipe]["step_ms"])
            self.assertIsNone(fp8[recipe]["step_over_bf16"])
            self.assertIn("rose tenfold", fp8[recipe]["losses"]["refused"])
        # A short loan measures a part alone: staging at the world sizes asked, nothing else written.
        part = os.path.join(self.directory, "part")
        result = subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "gpu", "bench.py"),
                                 "--device", "loopback", "--tiny", "--rounds", "1", "--parts", "staging",
                                 "--world-sizes", "1", "--output-dir", part], capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        self.assertEqual(os.listdir(part), ["staging.json"])
        with open(os.path.join(part, "staging.json")) as handle:
            self.assertEqual([row["ranks"] for row in json.load(handle)["world_sizes"]], [1])

    def test_started_operations_and_what_computation_hides(self):
        """--issue started starts each operation as the strategies do and waits for it, exact like the
        blocking rows; with --overlap each started row is timed again while the host computes for as
        long as the operation took alone, and the hidden fraction is what that says: the share of the
        operation that ran during the computation, (2 compute - time) / compute within [0, 1]."""
        for path in ([], ["--path", "mpi-staged", "--device", "loopback", "--chunk-bytes", "64K"]):
            with self.subTest(path=path):
                result = commbench(path + ["--collectives", "all", "--issue", "blocking,started", "--overlap",
                                           "--min-bytes", "256K", "--max-bytes", "256K", "--iterations", "2",
                                           "--warmup", "1", "--json"], 2)
                self.assertEqual(result.returncode, 0, result.stderr)
                rows, _ = measurements(result.stdout)
                self.assertEqual({(row["collective"], row["issue"]) for row in rows},
                                 {(c, i) for c in COLLECTIVES for i in ("blocking", "started")})
                for row in rows:
                    self.assertTrue(row["correct"], row)
                    self.assertEqual("hidden_fraction" in row, row["issue"] == "started", row)
                    if row["issue"] != "started":
                        continue
                    self.assertEqual(row["compute_us"], row["time_us"])
                    expected = (2 * row["compute_us"] - row["overlap_time_us"]) / row["compute_us"]
                    self.assertAlmostEqual(row["hidden_fraction"], min(max(expected, 0.0), 1.0))
                    # Computing first cannot make the pair faster than the computation alone.
                    self.assertGreaterEqual(row["overlap_time_us"], row["compute_us"] * 0.999)

    def test_table_output(self):
        result = commbench(["--collectives", "all_reduce,send_recv", "--max-bytes", "64", "--iterations", "1"], 2)
        self.assertEqual(result.returncode, 0, result.stderr)
        lines = [line for line in result.stdout.splitlines() if not line.startswith("#")]
        self.assertEqual([line.split()[0] for line in lines], ["all_reduce"] * 4 + ["send_recv"] * 4)
        header = [line for line in result.stdout.splitlines() if line.startswith("# collective")][0].split()[1:]
        self.assertEqual(header, ["collective", "type", "issue", "bytes", "time_us", "spread_%", "algbw", "busbw",
                                  "#wrong", "|", "ip_time_us", "ip_algbw", "ip_busbw", "ip_#wrong"])
        # No wrong element out of place (and in place, where the operation has that form).
        self.assertEqual([line.split()[8] for line in lines], ["0"] * 8)
        self.assertEqual({line.split()[2] for line in lines}, {"blocking"})
        self.assertEqual([line.split()[-1] for line in lines], ["0"] * 4 + ["-"] * 4)

    def test_table_bandwidths(self):
        """algbw is the size over the time, busbw that times the bus factor (2(n-1)/n = 1.5 for an
        all-reduce at 4 ranks), both in GB/s, out of place and in place."""
        result = commbench(["--collectives", "all_reduce", "--min-bytes", "1M", "--max-bytes", "1M",
                            "--iterations", "2"], 4)
        self.assertEqual(result.returncode, 0, result.stderr)
        row = [line.split() for line in result.stdout.splitlines() if not line.startswith("#")][0]
        size, time_us, algbw, busbw = int(row[3]), float(row[4]), float(row[6]), float(row[7])
        self.assertAlmostEqual(algbw, size / (time_us * 1e3), delta=0.002 + 0.01 * algbw)
        self.assertAlmostEqual(busbw, 1.5 * algbw, delta=0.002)
        in_place_time_us, in_place_algbw, in_place_busbw = float(row[10]), float(row[11]), float(row[12])
        self.assertAlmostEqual(in_place_algbw, size / (in_place_time_us * 1e3), delta=0.002 + 0.01 * in_place_algbw)
        self.assertAlmostEqual(in_place_busbw, 1.5 * in_place_algbw, delta=0.002)

    def test_identity_and_the_mpi_baseline(self):
        """Where all-reduce, reduce-scatter and all-gather ran, one identity row per size holds the
        all-reduce's time against the sum of the other two; MPI_Allreduce called directly is
        measured and checked like the communicator's all-reduce."""
        result = commbench(["--collectives", "all_reduce,reduce_scatter,all_gather,mpi_all_reduce", "--min-bytes", "64",
                            "--max-bytes", "4K", "--step-factor", "4", "--iterations", "2", "--json"], 2)
        self.assertEqual(result.returncode, 0, result.stderr)
        rows, identities = measurements(result.stdout)
        time = {(row["collective"], row["bytes"]): row["time_us"] for row in rows}
        self.assertEqual([row["bytes"] for row in identities], [64, 256, 1024, 4096])
        for row in identities:
            parts = time[("reduce_scatter", row["bytes"])] + time[("all_gather", row["bytes"])]
            self.assertAlmostEqual(row["reduce_scatter_plus_all_gather_us"], parts)
            self.assertAlmostEqual(row["ratio"], time[("all_reduce", row["bytes"])] / parts)
        baseline = [row for row in rows if row["collective"] == "mpi_all_reduce"]
        self.assertEqual(len(baseline), 4)
        self.assertTrue(all(row["correct"] and row["in_place_wrong"] == 0 for row in baseline), baseline)

    def test_types_reports_and_csv(self):
        """A list of element types gives a row per type; each --report picks its time among the
        ranks' (min <= avg <= max, rank 0's between min and max); the CSV file holds the JSON rows."""
        for report in ("rank0", "avg", "min", "max"):
            with self.subTest(report=report):
                csv_path = self.path(f"commbench_{report}.csv")
                result = commbench(["--collectives", "all_reduce,all_to_all", "--dtype", "fp32,bf16,fp16",
                                    "--max-bytes", "1K", "--step-factor", "4", "--iterations", "2",
                                    "--warmup", "1", "--report", report, "--json", "--csv", csv_path], 4)
                self.assertEqual(result.returncode, 0, result.stderr)
                rows = [json.loads(line) for line in result.stdout.splitlines()]
                self.assertEqual(sorted({(row["dtype"], row["collective"]) for row in rows}),
                                 sorted((t, c) for t in ("fp32", "bf16", "fp16") for c in ("all_reduce", "all_to_all")))
                for row in rows:
                    self.assertEqual((row["wrong"], row["correct"], row["time_report"]), (0, True, report))
                    self.assertLessEqual(row["time_min_us"], row["time_us"] * (1 + 1e-12))
                    self.assertLessEqual(row["time_us"], row["time_max_us"] * (1 + 1e-12))
                    if report in ("min", "max"):
                        self.assertEqual(row["time_us"], row[f"time_{report}_us"])
                with open(csv_path) as handle:
                    table = list(csv.DictReader(handle))
                self.assertEqual(len(table), len(rows))
                for line, row in zip(table, rows):
                    # Every field of the JSON row is a column; what the row lacks is empty.
                    self.assertEqual(set(line) - set(row), {"chunk_bytes", "compute_us", "overlap_time_us", "hidden_fraction"} |
                                     ({"in_place_time_us", "in_place_algbw_gbps", "in_place_busbw_gbps", "in_place_wrong"}
                                      if "in_place_wrong" not in row else set()))
                    self.assertEqual((line["collective"], line["dtype"], int(line["bytes"]), int(line["wrong"]),
                                      line["correct"], line["chunk_bytes"]),
                                     (row["collective"], row["dtype"], row["bytes"], row["wrong"],
                                      str(row["correct"]).lower(), ""))
                    for field in ("time_us", "max_error", "error_bound", "algbw_gbps", "busbw_gbps"):
                        self.assertAlmostEqual(float(line[field]), row[field], places=6)

    def test_bad_input_is_one_line_and_exit_2(self):
        for arguments, words in [(["--path", "nccl", "--device", "loopback"], ["--path nccl", "needs --device cuda"]),
                                 (["--path", "gpu"], ["unknown --path 'gpu'"]),
                                 (["--collectives", "copy_to_host"], ["copy_to_host", "needs --path mpi-staged"]),
                                 (["--path", "mpi-staged", "--device", "tpu"], ["unknown --device 'tpu'"]),
                                 (["--collectives", "all_reduce,gossip"], ["unknown collective 'gossip'"]),
                                 (["--max-bytes", "12Q"], ["'12Q' is not a size"]),
                                 (["--min-bytes", "1M", "--max-bytes", "1K"], ["--min-bytes"]),
                                 (["--iterations", "0"], ["--iterations"]),
                                 (["--dtype", "int8"], ["unknown --dtype 'int8'"]),
                                 (["--dtype", "fp32,int64"], ["unknown --dtype 'int64'"]),
                                 (["--report", "median"], ["unknown --report 'median'"]),
                                 (["--issue", "eager"], ["unknown --issue 'eager'"]),
                                 (["--overlap"], ["--overlap", "--issue started"]),
                                 (["--max-bytes", "8", "--csv", "/nonexistent/rows.csv"], ["--csv", "/nonexistent"]),
                                 (["--collectives", "mpi_all_reduce", "--dtype", "bf16"], ["mpi_all_reduce", "fp32"]),
                                 (["--collectives", "mpi_all_reduce", "--path", "mpi-staged", "--device", "loopback"],
                                  ["mpi_all_reduce", "--path mpi-host"]),
                                 (["--frobnicate"], ["frobnicate"])]:
            with self.subTest(arguments=arguments):
                result = commbench(arguments, 2)
                self.assertEqual(result.returncode, 2, result.stdout + result.stderr)
                lines = result.stderr.strip().splitlines()
                self.assertEqual(len(lines), 1, result.stderr)
                for word in words:
                    self.assertIn(word, lines[0])

    def test_nccl_at_world_size_one(self):
        result = commbench(["--path", "nccl", "--max-bytes", "64K", "--iterations", "2", "--json"], 1)
        if result.returncode == 2 and "no GPU" in result.stderr:
            self.skipTest(f"no GPU to test on: commbench says \"{result.stderr.strip()}\"")
        self.assertEqual(result.returncode, 0, result.stderr)
        rows, _ = measurements(result.stdout)
        self.assertLessEqual({"all_reduce", "reduce_scatter", "all_gather", "broadcast", "reduce", "gather", "scatter"},
                             {row["collective"] for row in rows})
        self.assertTrue(all(row["correct"] and row["path"] == "nccl" for row in rows), rows)


if __name__ == "__main__":
    unittest.main()
