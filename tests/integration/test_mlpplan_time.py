"""mlpplan's step time: its arithmetic from a calibration written here (GEMMs at the share of the
rate their rows reach, bias/GELU passes, MoE layers' moved rows, AdamW, the samples' reads), each
pipeline schedule's bubble from its own lists, and layerbench's lines as the calibration reads them
under mpiexec."""
import json
import math
import os
import subprocess
import sys
import unittest

import h5py
import numpy as np

from common import MPIEXEC, SOURCE_ROOT, TrainingTestCase
from test_mlpplan import MLPPLAN, SMALL, plan_json


class MlpplanTime(TrainingTestCase):
    def test_layerbench_under_mpiexec_prints_each_ranks_line_whole(self):
        """The calibration's input: run as the world runs, every rank's object on a line of its
        own, in rank order (merged by mpiexec from two processes, lines had interleaved)."""
        layerbench = os.path.join(os.path.dirname(MLPPLAN), "layerbench")
        for _ in range(3):
            result = subprocess.run([MPIEXEC, "-n", "2", layerbench, "16", "32", "32", "2", "--dtype", "fp32,bf16"],
                                    capture_output=True, text=True, timeout=120, check=True)
            lines = result.stdout.splitlines()
            self.assertEqual([json.loads(line)["dtype"] for line in lines], ["fp32", "fp32", "bf16", "bf16"])

    def test_layerbench_times_a_steps_sequence_of_gemms_on_a_device(self):
        """--sequence on a device (the loopback device: host memory reached as a GPU's is) times
        the device's own GEMMs in a step's order, the rate a GPU's calibration then plans with."""
        layerbench = os.path.join(os.path.dirname(MLPPLAN), "layerbench")
        for device in ("cpu", "loopback"):
            result = subprocess.run([layerbench, "16", "32", "32", "2", "--device", device, "--sequence", "3"],
                                    capture_output=True, text=True, timeout=120, check=True)
            row = json.loads(result.stdout.splitlines()[0])
            self.assertEqual(row["sequence_layers"], 3, device)
            self.assertGreater(row["library_sequence_gemm_ms"], 0, device)

    def test_step_time_from_a_calibration(self):
        """The step's arithmetic on one rank from rates written here: GEMMs at 6 multiply-adds'
        FLOPs per parameter-sample, the bias/GELU passes three times per output element, the
        update per parameter."""
        gemm_gflops, threads, adamw_ms, gelu_ms = 50.0, 1, 2.0, 0.5
        bench = self.path("bench.jsonl")
        rows = [{"dtype": "fp32", "gemm_gflops": gemm_gflops, "kernels": f"test; {threads} GEMM thread(s)",
                 "adamw_ms": adamw_ms, "gelu_forward_ms": gelu_ms, "rows": 100, "in": 99, "out": 100},
                {"collective": "all_reduce", "path": "mpi-host", "dtype": "fp32", "bytes": 8, "time_us": 10.0,
                 "busbw_gbps": 1.0, "correct": True}]
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        row = plan_json(SMALL + ["--world", 1, "--calibrate", bench])
        widths = [(16, 32), (32, 32), (32, 32), (32, 8)]
        parameters = sum(i * o + o for i, o in widths)
        elements = sum(o for _, o in widths) * 32
        cores = os.cpu_count()
        # Nothing needs the gradient of the model's inputs: the first layer does not compute it.
        first = 16 * 32 + 32
        gemm = (6 * parameters - 2 * first) * 32 / (gemm_gflops * 1e9 * cores / threads)
        elementwise = 3 * elements / (100 * 100 / (gelu_ms * 1e-3))
        update = parameters / ((99 * 100 + 100) / (adamw_ms * 1e-3))
        step = row["step_ms"]
        self.assertAlmostEqual(step["compute"], 1e3 * (gemm + elementwise + update), delta=1e-9)
        self.assertEqual((step["exposed_comm"], step["bubble"], step["data"]), (0, 0, 0))  # no data rates given
        self.assertAlmostEqual(row["samples_per_s"], 32 / (step["total"] * 1e-3), delta=1e-6)
        # The samples' inputs at one core's measured rate (the bench read 100 samples of 99 values),
        # on the step's path: the built-in teacher data here, the held file's rate for a file that
        # fits under --data-memory-mb, and nothing modelled for one read a batch at a time.
        teacher_ms, held_ms = 0.8, 0.05
        rows[0].update({"teacher_read_ms": teacher_ms, "held_file_read_ms": held_ms})
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        fed = plan_json(SMALL + ["--world", 1, "--calibrate", bench])["step_ms"]
        self.assertAlmostEqual(fed["data"], 1e3 * 32 * 16 / (100 * 99 / (teacher_ms * 1e-3)), delta=1e-9)
        self.assertAlmostEqual(fed["total"], fed["compute"] + fed["data"], delta=1e-9)
        two_stages = plan_json(SMALL + ["--world", 2, "--pp", 2, "--calibrate", bench])["step_ms"]
        self.assertAlmostEqual(two_stages["data"], fed["data"], delta=1e-9)  # the first stage reads the inputs
        data = self.path("data.h5")
        with h5py.File(data, "w") as file:
            file["x"] = np.zeros((64, 16), np.uint8)
            file["y"] = np.zeros((64, 8), np.float32)
        held = plan_json(["--layers", 4, "--hidden", 32, "--global-batch", 32, "--dataset", "hdf5", "--data-path", data,
                          "--world", 1, "--calibrate", bench])["step_ms"]
        self.assertAlmostEqual(held["data"], 1e3 * 32 * 16 / (100 * 99 / (held_ms * 1e-3)), delta=1e-9)
        read = plan_json(["--layers", 4, "--hidden", 32, "--global-batch", 32, "--dataset", "hdf5", "--data-path", data,
                          "--data-memory-mb", 0, "--world", 1, "--calibrate", bench])["step_ms"]
        self.assertEqual(read["data"], 0)
        # With --sequence, the GEMMs of a step's sequence set the rate.
        sequence_ms = 4.0
        rows[0].update({"sequence_layers": 6, "library_sequence_gemm_ms": sequence_ms})
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        sequenced = plan_json(SMALL + ["--world", 1, "--calibrate", bench])["step_ms"]
        rate = 2 * 100 * 99 * 100 / (sequence_ms * 1e-3) * cores / threads
        self.assertAlmostEqual(sequenced["compute"],
                               1e3 * ((6 * parameters - 2 * first) * 32 / rate + elementwise + update),
                               delta=1e-9)
        # Timed at two row counts, the GEMMs of the step's 32 rows run at the share of the best
        # rate interpolated in log rows between them: half of it at 25 rows, all at 100.
        fewer_rows = {"dtype": "fp32", "gemm_gflops": gemm_gflops, "kernels": f"test; {threads} GEMM thread(s)",
                      "rows": 25, "in": 99, "out": 100, "sequence_layers": 6, "library_sequence_gemm_ms": sequence_ms / 2}
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows + [fewer_rows]) + "\n")
        by_rows = plan_json(SMALL + ["--world", 1, "--calibrate", bench])["step_ms"]
        share = 0.5 + 0.5 * math.log(32 / 25) / math.log(100 / 25)
        self.assertAlmostEqual(by_rows["compute"],
                               1e3 * ((6 * parameters - 2 * first) * 32 / (rate * share) + elementwise + update),
                               delta=1e-9)
        # MoE layers (1 and 2 here): router and k experts' GEMMs, the experts' bias/GELU passes
        # (k rows a token, backward two), and the rows they move at the gather rate: forward
        # gathers k rows and sums k into each token's row (written once), backward gathers, dots
        # and sums k each into fp32 rows of the input gradient, which are then rounded.
        gather_ms, experts, top_k = 0.05, 4, 2
        del rows[0]["sequence_layers"], rows[0]["library_sequence_gemm_ms"]
        rows[0]["gather_rows_ms"] = gather_ms
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        moe = plan_json(SMALL + ["--world", 1, "--calibrate", bench, "--moe-every", 1, "--experts", experts,
                                 "--top-k", top_k])["step_ms"]
        expert = 32 * 32 + 32
        multiply_adds = (16 * 32 + 32) + (32 * 8 + 8) + 2 * (experts * 32 + top_k * expert)
        gemm = (6 * multiply_adds - 2 * first) * 32 / (gemm_gflops * 1e9 * cores / threads)
        passes = 3 * (32 + 8 + 2 * top_k * 32) * 32
        moved = 2 * ((2 + 3) * top_k * 32 + 32) * 32
        parameters = (16 * 32 + 32) + (32 * 8 + 8) + 2 * (experts * 32 + experts * expert)
        update = parameters / ((99 * 100 + 100) / (adamw_ms * 1e-3))
        expected = gemm + passes / (100 * 100 / (gelu_ms * 1e-3)) + moved / (100 * 100 / (gather_ms * 1e-3)) + update
        self.assertAlmostEqual(moe["compute"], 1e3 * expected, delta=1e-9)
        # Timed at two row counts: an expert's GEMMs run at the share of its rows when evenly
        # routed (32 rows x 2 / 4 experts = 16, below the 25 timed: half the rate), the dense
        # layers' at the step's 32 rows.
        rows[0].update({"sequence_layers": 6, "library_sequence_gemm_ms": sequence_ms})
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows + [fewer_rows]) + "\n")
        moe_by_rows = plan_json(SMALL + ["--world", 1, "--calibrate", bench, "--moe-every", 1, "--experts", experts,
                                         "--top-k", top_k])["step_ms"]
        dense = (16 * 32 + 32) + (32 * 8 + 8)
        gemm = ((6 * dense - 2 * first) * 32 / (rate * share) +
                6 * (multiply_adds - dense) * 32 / (rate * 0.5))
        expected = gemm + passes / (100 * 100 / (gelu_ms * 1e-3)) + moved / (100 * 100 / (gather_ms * 1e-3)) + update
        self.assertAlmostEqual(moe_by_rows["compute"], 1e3 * expected, delta=1e-9)

    def write_rows(self, name, rows):
        path = self.path(name)
        with open(path, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        return path

    def test_side_by_side_processes_plan_at_the_slowest(self):
        """layerbench run by two processes side by side writes a line each: every time the plan
        reads is the slower process's (a synchronous step waits for its slowest rank), whichever
        line comes first."""
        base = {"dtype": "fp32", "kernels": "test; 1 GEMM thread(s)", "rows": 100, "in": 99, "out": 100}
        fast = dict(base, gemm_gflops=80.0, adamw_ms=1.0, gelu_forward_ms=0.25)
        slow = dict(base, gemm_gflops=50.0, adamw_ms=2.0, gelu_forward_ms=0.5)
        comm = {"collective": "all_reduce", "path": "mpi-host", "dtype": "fp32", "bytes": 8, "time_us": 10.0,
                "busbw_gbps": 1.0, "correct": True}
        alone = plan_json(SMALL + ["--world", 1, "--calibrate", self.write_rows("slow.jsonl", [slow, comm])])
        for order in ([fast, slow], [slow, fast]):
            both = plan_json(SMALL + ["--world", 1, "--calibrate", self.write_rows("both.jsonl", order + [comm])])
            self.assertEqual(both["step_ms"], alone["step_ms"])

    def test_a_gpu_calibration_plans_the_gpu_and_the_communication_path(self):
        """layerbench --device cuda rows plan --device cuda: the GPU's own rate (not scaled by the
        host's cores), TF32's with --tf32, its memory, and the built-in samples at the device
        generator's rate, a bf16 model's update at the bf16 row's rate; commbench's rows of the
        planned path: host-staged MPI (mpi-staged) for --comm mpi, NCCL for --comm nccl. The
        CPU's rows plan the CPU. A path not calibrated is refused with its name where ranks
        communicate; one rank needs none."""
        cpu = {"dtype": "fp32", "gemm_gflops": 50.0, "kernels": "test; 1 GEMM thread(s)", "adamw_ms": 2.0,
               "gelu_forward_ms": 0.5, "rows": 100, "in": 99, "out": 100}
        gpu = dict(cpu, device="cuda", tf32=False, gemm_gflops=20000.0, adamw_ms=0.02, gelu_forward_ms=0.005,
                   kernels="cuBLAS", devices=1, device_memory_bytes=141e9,
                   kernel_table=[{"kernel": "generate_mixture_samples", "ms": 0.01, "samples": 100}])
        tf32 = dict(gpu, tf32=True, gemm_gflops=100000.0)
        bf16 = dict(gpu, dtype="bf16", gemm_gflops=400000.0, adamw_ms=0.03)
        comm = [{"collective": "all_reduce", "path": path, "dtype": "fp32", "bytes": 8, "time_us": 10.0,
                 "busbw_gbps": rate, "correct": True} for path, rate in (("mpi-host", 1.0), ("mpi-staged", 4.0))]
        bench = self.write_rows("gpu.jsonl", [cpu, gpu, tf32, bf16] + comm)
        widths = [(16, 32), (32, 32), (32, 32), (32, 8)]
        parameters = sum(i * o + o for i, o in widths)
        multiply_adds = 6 * parameters - 2 * (16 * 32 + 32)
        elements = sum(o for _, o in widths) * 32

        def compute_ms(gemm_flops, gelu_ms, adamw_ms):
            return 1e3 * (multiply_adds * 32 / gemm_flops + 3 * elements / (100 * 100 / (gelu_ms * 1e-3)) +
                          parameters / ((99 * 100 + 100) / (adamw_ms * 1e-3)))

        on_gpu = plan_json(SMALL + ["--world", 1, "--device", "cuda", "--calibrate", bench])
        self.assertAlmostEqual(on_gpu["step_ms"]["compute"], compute_ms(20000e9, 0.005, 0.02), delta=1e-9)
        self.assertEqual(on_gpu["memory_capacity_bytes"], 141e9)
        on_tf32 = plan_json(SMALL + ["--world", 1, "--device", "cuda", "--tf32", "--calibrate", bench])
        self.assertAlmostEqual(on_tf32["step_ms"]["compute"], compute_ms(100000e9, 0.005, 0.02), delta=1e-9)
        on_bf16 = plan_json(SMALL + ["--world", 1, "--device", "cuda", "--param-dtype", "bf16", "--calibrate", bench])
        self.assertAlmostEqual(on_bf16["step_ms"]["compute"], compute_ms(400000e9, 0.005, 0.03), delta=1e-9)
        on_cpu = plan_json(SMALL + ["--world", 1, "--calibrate", bench])
        self.assertAlmostEqual(on_cpu["step_ms"]["compute"], compute_ms(50e9 * os.cpu_count(), 0.5, 2.0), delta=1e-9)
        mixture = plan_json(SMALL + ["--world", 1, "--device", "cuda", "--dataset", "mixture", "--calibrate", bench])
        self.assertAlmostEqual(mixture["step_ms"]["data"], 1e3 * 32 * 16 / (100 * 99 / 0.01e-3), delta=1e-9)
        # Two ranks sharing the GPU, their gradients summed host-staged: at the staged rows'
        # latency (this small model's sums are a latency each), not the host path's.
        slower = self.write_rows("slower.jsonl", [cpu, gpu, tf32, bf16] + [
            dict(row, time_us=row["time_us"] * (2 if row["path"] == "mpi-staged" else 1)) for row in comm])
        staged, twice = (plan_json(SMALL + ["--world", 2, "--dp", 2, "--device", "cuda", "--calibrate", path])
                         for path in (bench, slower))
        self.assertEqual(staged["bus_bytes_per_step"], twice["bus_bytes_per_step"])
        self.assertGreater(staged["step_ms"]["exposed_comm"], 0)
        self.assertAlmostEqual(twice["step_ms"]["exposed_comm"] / staged["step_ms"]["exposed_comm"], 2, delta=0.1)
        refused = subprocess.run([MLPPLAN] + [str(a) for a in SMALL + ["--world", 2, "--dp", 2, "--device", "cuda",
                                                                       "--comm", "nccl", "--calibrate", bench]],
                                 capture_output=True, text=True)
        self.assertEqual(refused.returncode, 2, refused.stderr)
        self.assertIn("no commbench fp32 all_reduce rows on nccl", refused.stderr)
        alone = plan_json(SMALL + ["--world", 1, "--device", "cuda", "--comm", "nccl", "--calibrate", bench])
        self.assertEqual(alone["step_ms"], on_gpu["step_ms"])

    def test_a_calibration_run_plans_the_update_as_the_loop_runs_it(self):
        """A calibration run's metrics (mlptrain --metrics, its summary) carry rank 0's update
        time and the parameters it updated (all of them alone, its shard under ZeRO); given to
        --calibrate beside layerbench's rows, the update is planned at that rate, not the bench's
        AdamW. A GPU plan keeps the bench's: a GPU's update time on the host is its launch."""
        model = ["--layers", 3, "--hidden", 64, "--input-dim", 16, "--output-dim", 8, "--global-batch", 32,
                 "--dataset", "mixture", "--steps", 4]
        steps, summary, _ = self.train("alone", model)
        _, shard, _ = self.train("sharded", model + ["--zero", 1], ranks=2)
        self.assertGreater(summary["update_ms"], 0)
        self.assertTrue(all(step["update_ms"] > 0 for step in steps))
        self.assertEqual(summary["updated_parameters"], summary["parameters"])
        self.assertLess(shard["updated_parameters"], 0.6 * shard["parameters"])
        cpu = {"dtype": "fp32", "gemm_gflops": 50.0, "kernels": "test; 1 GEMM thread(s)", "adamw_ms": 2.0,
               "gelu_forward_ms": 0.5, "rows": 100, "in": 99, "out": 100}
        gpu = dict(cpu, device="cuda", kernels="cuBLAS", devices=1)
        run_row = {"summary": True, "update_ms": 4.0, "updated_parameters": 1000, "param_dtype": "fp32"}
        bench = self.write_rows("bench.jsonl", [cpu, gpu])
        with_run = self.write_rows("with_run.jsonl", [cpu, gpu, run_row])
        parameters = sum(i * o + o for i, o in [(16, 32), (32, 32), (32, 32), (32, 8)])
        by_bench, by_run = (plan_json(SMALL + ["--world", 1, "--calibrate", path])["step_ms"] for path in (bench, with_run))
        self.assertAlmostEqual(by_bench["compute_parts"]["optimizer"], 1e3 * parameters / ((99 * 100 + 100) / 2e-3),
                               delta=1e-9)
        self.assertAlmostEqual(by_run["compute_parts"]["optimizer"], 1e3 * parameters / (1000 / 4e-3), delta=1e-9)
        self.assertEqual(by_bench["compute_parts"]["forward"], by_run["compute_parts"]["forward"])
        on_gpu = [plan_json(SMALL + ["--world", 1, "--device", "cuda", "--calibrate", path])["step_ms"]
                  for path in (bench, with_run)]
        self.assertEqual(on_gpu[0], on_gpu[1])

    def test_gpus_hide_reductions_behind_backward_and_a_cpu_does_not(self):
        """On a CPU whose ranks fill the cores, a data-parallel reduction is worked by those cores
        (the communication engine's thread takes its turns from the computation's), so a
        calibrated CPU plans it whole after backward (its bus bytes at the measured bandwidth, at
        least). On GPUs, NCCL's reductions run beside backward, and so do host-staged ones (--comm
        mpi: the rank's engine stages and exchanges them while the host launches the backward):
        with the same rates, all but the last layer's share hides."""
        cores = os.cpu_count()
        cpu = {"dtype": "fp32", "gemm_gflops": 50.0, "kernels": "test; 1 GEMM thread(s)", "adamw_ms": 2.0,
               "gelu_forward_ms": 0.5, "rows": 100, "in": 99, "out": 100}
        gpu = dict(cpu, device="cuda", gemm_gflops=50.0 * cores, kernels="cuBLAS", devices=2)
        comm = [{"collective": "all_reduce", "path": path, "dtype": "fp32", "bytes": 8, "time_us": 10.0,
                 "busbw_gbps": 1.0, "correct": True} for path in ("mpi-host", "mpi-staged", "nccl")]
        bench = self.write_rows("both.jsonl", [cpu, gpu] + comm)
        model = ["--layers", 8, "--hidden", 256, "--input-dim", 256, "--output-dim", 16, "--global-batch", 256,
                 "--world", 2, "--dp", 2, "--calibrate", bench]
        on_cpu, staged, nccl = (plan_json(model + device) for device in
                                ([], ["--device", "cuda", "--comm", "mpi"], ["--device", "cuda", "--comm", "nccl"]))
        for plan in (staged, nccl):
            self.assertEqual(plan["bus_bytes_per_step"], on_cpu["bus_bytes_per_step"])
            self.assertLess(plan["step_ms"]["exposed_comm"], 0.5 * on_cpu["step_ms"]["exposed_comm"])
        self.assertGreaterEqual(on_cpu["step_ms"]["exposed_comm"], 1e3 * on_cpu["bus_bytes_per_step"]["intra_node"] / 1e9)

    def test_gpu_layouts_script_runs_on_loopback(self):
        """scripts/gpu/plan_vs_layouts.py (the GPU check's planner phase) end to end on the device
        path's loopback: one process and four two-rank layouts in two precisions, each planned
        from the calibration it wrote, each plan's memory states and bytes equal to its run's
        ledger, and each ratio the plan over that run's median step."""
        result = subprocess.run([sys.executable, os.path.join(SOURCE_ROOT, "scripts", "gpu", "plan_vs_layouts.py"),
                                 "--device", "loopback", "--layers", "2", "--hidden", "64", "--batch", "64",
                                 "--steps", "4", "--max-bytes", "64K", "--output-dir", self.directory],
                                capture_output=True, text=True, timeout=300)
        self.assertEqual(result.returncode, 0, result.stdout + result.stderr)
        with open(self.path("plan_vs_layouts.json")) as handle:
            written = json.load(handle)
        rows = written["rows"]
        self.assertEqual([(row["precision"], row["ranks"]) for row in rows],
                         [(precision, ranks) for precision in ("fp32", "bf16") for ranks in (1, 2, 2, 2, 2)])
        self.assertEqual(written["summary"]["memory_and_bytes_agree"], len(rows), [row["problems"] for row in rows])
        for row in rows:
            self.assertAlmostEqual(row["step_time_ratio"], row["planned_step_ms"]["total"] / row["measured_step_ms"])
            # Two ranks communicate in plan and run alike; one process neither.
            self.assertEqual(row["ranks"] > 1, row["planned_step_ms"]["exposed_comm"] > 0, row)
            measured = row["measured_comm"]
            self.assertEqual(row["ranks"] > 1, bool(measured["operations_ms"]), row)
            # Wall time: no more than the operations' own times summed, the waits inside it.
            self.assertLessEqual(measured["busy_ms"], measured["operations_sum_ms"] + 1e-6, row)
            self.assertLessEqual(measured["wait_ms"], measured["busy_ms"] + 0.5, row)
        self.assertEqual(sorted(written["calibration"]), ["calibration_commbench.jsonl", "calibration_layerbench.jsonl"])

    def test_a_presets_gpus_communicate_host_staged_or_through_nccl(self):
        """On a preset, --device cuda with --comm mpi plans the host-staged path (the tensor
        group's sums at the host's MPI within the node, the PCIe copies beside it: 4.75 GB/s here
        against NVLink's 450 for NCCL); --comm nccl and a plan without --device cuda take the preset's
        GPU-direct links. The same bytes travel either way."""
        layout = ["--world", 8, "--tp", 8, "--layers", 4, "--hidden", 4096, "--global-batch", 64, "--input-dim", 4096,
                  "--output-dim", 16, "--param-dtype", "bf16"]
        staged = plan_json(layout + ["--device", "cuda"])
        nccl = plan_json(layout + ["--device", "cuda", "--comm", "nccl"])
        unnamed = plan_json(layout)
        self.assertEqual(nccl["step_ms"], unnamed["step_ms"])
        self.assertEqual(staged["bus_bytes_per_step"], nccl["bus_bytes_per_step"])
        # Sums of a few MB each: the exposed time grows by most of the ratio of the rates.
        self.assertGreater(staged["step_ms"]["exposed_comm"], 10 * nccl["step_ms"]["exposed_comm"])

    def test_host_staging_runs_at_the_slowest_stage_and_hides_started_operations(self):
        """Host-staged MPI (--device cuda --comm mpi) as the trainer's communication engine runs it:
        every operation goes in pieces whose copies down and up run beside the host's exchange,
        at its slowest stage. A rank copies down what it sends and up what it keeps: an all-reduce
        its whole buffer both ways, a reduce-scatter of 2 ranks the whole down and half up, an
        all-gather the reverse. Started operations (data parallelism's buckets, ZeRO's shards)
        hide behind the backward as far as it lasts: with next to no computation nothing hides;
        with a slow one all but the last layer's share (a blocking sum of tensor parallelism
        hides nothing either way). Two ranks in one node; latencies a picosecond, so the seconds
        are the bytes' alone."""
        copy, host = 2e9, 5e9  # a direction's copies, the host MPI's bus bandwidth (bytes/s)
        rates = {"latency_us": 1e-6, "bus_gb_per_s": 100}
        # Seconds per byte of each operation's size: the slowest of down / copy, up / copy and the
        # bus factor / host.
        staged = {"all_reduce": max(1 / copy, 1 / host), "reduce_scatter": max(1 / copy, 0.5 / copy, 0.5 / host),
                  "all_gather": max(0.5 / copy, 1 / copy, 0.5 / host)}
        layers = 4
        for speed, tflops in (("fast", 1e9), ("slow", 1e-3)):
            cluster = self.path(f"staging_{speed}.json")
            with open(cluster, "w") as handle:
                json.dump({"name": "staging", "devices_per_node": 8, "device_memory_gb": 80,
                           "gemm_tflops": {"fp32": tflops, "bf16": tflops, "fp16": tflops}, "memory_gb_per_s": 1e9,
                           "intra_node": rates, "inter_node": rates,
                           "host_staging": {"copy_gb_per_s": copy / 1e9,
                                            "intra_node": {"latency_us": 1e-6, "bus_gb_per_s": host / 1e9}}}, handle)
            model = ["--layers", layers, "--hidden", 1024, "--input-dim", 256, "--output-dim", 16,
                     "--global-batch", 256, "--world", 2, "--device", "cuda", "--cluster", cluster]
            # What stays exposed of a started operation's seconds: all of it behind no
            # computation, a layer's share behind a slow backward. Every layout also sums the
            # step's loss over the world, blocking: 56 bytes (under --dp 2 in the buckets' count).
            exposed = 1 if speed == "fast" else 1 / layers
            for layout, share in [(["--dp", 2], {"all_reduce": exposed}),
                                  (["--dp", 2, "--zero", 2], {"all_reduce": 1, "reduce_scatter": exposed,
                                                              "all_gather": 1}),
                                  (["--tp", 2], {"all_reduce": 1})]:
                with self.subTest(speed=speed, layout=layout):
                    plan = plan_json(model + layout)
                    moved = {op: size for op, size in plan["comm_bytes_per_step"].items() if size > 0}
                    self.assertEqual(sorted(moved), sorted(share))
                    expected = sum(size * staged[op] * share[op] for op, size in moved.items())
                    self.assertAlmostEqual(plan["step_ms"]["exposed_comm"] / 1e3 / expected, 1, delta=1e-3)

    def test_fp8_plans_dense_gemms_at_the_devices_fp8_rate(self):
        """On the H100 preset (989.4 bf16, 1978.9 fp8 dense TFLOP/s) --fp8 takes the dense layers'
        GEMM FLOPs, 6 multiply-adds a parameter and sample less the first layer's input
        gradient, from bf16's rate to fp8's and leaves the rest of the step; on the A100 preset
        (no fp8 tensor cores) it changes nothing."""
        model = ["--world", 1, "--param-dtype", "bf16", "--layers", 4, "--hidden", 1024, "--global-batch", 1024,
                 "--input-dim", 256, "--output-dim", 16]
        layer_macs = [256 * 1024 + 1024, 1024 * 1024 + 1024, 1024 * 1024 + 1024, 1024 * 16 + 16]  # the bias as above
        flops = 2 * (3 * sum(layer_macs) - layer_macs[0]) * 1024
        bf16, fp8 = (plan_json(model + fp8_flags)["step_ms"]["compute"] for fp8_flags in ([], ["--fp8", "tensorwise"]))
        self.assertAlmostEqual(bf16 - fp8, 1e3 * flops * (1 / 989.4e12 - 1 / 1978.9e12), delta=1e-9)
        a100 = ["--cluster", "a100-80gb-8"]
        self.assertEqual(plan_json(model + a100)["step_ms"], plan_json(model + a100 + ["--fp8", "rowwise"])["step_ms"])

    def test_expert_imbalance_paces_expert_parallel_moe_layers(self):
        """--expert-imbalance F plans the busiest expert rank's MoE work (its experts' GEMMs, the
        rows it moves, its exchanges' transfer) at F times the balanced share, linearly in F;
        where one rank holds every expert (no expert or tensor split) the rows all land on it
        whatever the routing, and a dense model has no experts: neither plan moves. The most
        uneven step's factor (--expert-peak-imbalance, the activations') leaves the time alone.
        F below 1 is refused with one line."""
        moe = ["--world", 2, "--layers", 4, "--hidden", 1024, "--global-batch", 1024, "--input-dim", 256,
               "--output-dim", 16, "--moe-every", 2, "--experts", 4, "--top-k", 2]

        def step(flags, factor):
            return plan_json(moe + flags + ["--expert-imbalance", factor])["step_ms"]

        steps = [step(["--ep", 2], factor) for factor in (1, 2, 3)]
        for part in ("compute", "exposed_comm"):
            first, second = steps[1][part] - steps[0][part], steps[2][part] - steps[1][part]
            self.assertGreater(first, 0, part)
            self.assertAlmostEqual(first, second, delta=1e-9 * steps[2][part])
        self.assertEqual(step(["--dp", 2], 1), step(["--dp", 2], 2))
        self.assertEqual(steps[1], step(["--ep", 2, "--expert-peak-imbalance", 3], 2))
        dense = moe[:-6]
        self.assertEqual(plan_json(dense + ["--dp", 2])["step_ms"],
                         plan_json(dense + ["--dp", 2, "--expert-imbalance", 2])["step_ms"])
        refused = subprocess.run([MLPPLAN] + [str(a) for a in moe] + ["--expert-imbalance", "0.5"],
                                 capture_output=True, text=True)
        self.assertEqual(refused.returncode, 2)
        self.assertEqual(refused.stderr.strip().splitlines(), ["mlpplan: error: --expert-imbalance '0.5' is not a "
                                                               "number of at least 1"])

    def test_a_pipeline_bubble_shrinks_with_micro_batches(self):
        bubbles = []
        for micro_batches in (2, 4, 8):
            row = plan_json(SMALL[:-2] + ["--global-batch", 64, "--world", 4, "--pp", 4, "--micro-batches", micro_batches])
            step = row["step_ms"]
            self.assertAlmostEqual(step["compute"] + step["exposed_comm"] + step["bubble"], step["total"], delta=1e-9)
            bubbles.append(step["bubble"] / step["total"])
        self.assertTrue(bubbles[0] > bubbles[1] > bubbles[2] > 0, bubbles)

    def test_each_schedules_bubble_from_its_own_lists(self):
        """On equal stages whose forward, input gradient and weight gradient take equal time
        (hidden-wide layers behind a first layer of one input, whose work is 0.2 % of a stage's;
        transfers and elementwise passes nearly free) the planner's bubble,
        from the trainer's own lists per chunk with B and W apart, is each schedule's theory:
        (P-1)/(M+P-1) for GPipe and 1F1B, (P-1)/(VM+P-1) interleaved, (P-1)/(3M+P-1) ZB-H1,
        (P-1)/(6M+P-1) ZB-V (M >= 2P-1)."""
        bench = self.path("free_transfers.jsonl")
        rows = [{"dtype": "fp32", "gemm_gflops": 1.0, "kernels": "test; 1 GEMM thread(s)", "adamw_ms": 1e-9,
                 "gelu_forward_ms": 1e-9, "rows": 100, "in": 99, "out": 100},
                *({"collective": collective, "path": "mpi-host", "dtype": "fp32", "bytes": 8, "time_us": 0.0,
                   "busbw_gbps": 1e9, "correct": True} for collective in ("send_recv", "all_reduce"))]
        with open(bench, "w") as handle:
            handle.write("\n".join(json.dumps(row) for row in rows) + "\n")
        stages, micro_batches = 4, 8
        model = ["--layers", 17, "--hidden", 512, "--input-dim", 1, "--output-dim", 512, "--global-batch", 64,
                 "--world", stages, "--pp", stages, "--micro-batches", micro_batches, "--calibrate", bench]
        for schedule, chunks, work in (("gpipe", 1, 1), ("1f1b", 1, 1), ("interleaved", 2, 2), ("interleaved", 4, 4),
                                       ("zb-h1", 1, 3), ("zb-v", 1, 6)):
            with self.subTest(schedule=schedule, chunks=chunks):
                step = plan_json(model + ["--schedule", schedule] +
                                 (["--virtual-stages", chunks] if chunks > 1 else []))["step_ms"]
                theory = (stages - 1) / (work * micro_batches + stages - 1)
                self.assertAlmostEqual(step["bubble"] / step["total"], theory, delta=1e-3)

if __name__ == "__main__":
    unittest.main()
