"""The hang watchdog: when one rank leaves out a collective (MLPTRAIN_FAULT, the communicators'
fault injection), every rank's step stalls; after --timeout seconds each rank prints its latest
operations and the job ends, and the two reports show where the ranks diverged. Without a hang it
stays silent. The same holds on the device path, with operations staged on the communication
engine in flight, and when a rank is killed there."""
import os
import re
import subprocess
import time
import unittest

from common import MLPTRAIN, MPIEXEC, TrainingTestCase, background_run, kill_a_rank, run, wait_until

ARGUMENTS = ["--layers", "3", "--hidden", "16", "--global-batch", "16", "--log-every", "0"]


class Watchdog(TrainingTestCase):
    def test_reports_where_the_ranks_diverged(self):
        # The world's all-reduces of doubles are the steps' world sums (the start's agreements sum
        # integers): rank 1 leaves out the third, step 3's.
        environment = dict(os.environ, MLPTRAIN_FAULT="1:world:all_reduce:fp64:3", OMP_NUM_THREADS="1")
        started = time.monotonic()
        result = subprocess.run([MPIEXEC, "-n", "2", MLPTRAIN] + ARGUMENTS + ["--steps", "10", "--timeout", "2"],
                                capture_output=True, text=True, timeout=60, env=environment)
        elapsed = time.monotonic() - started
        self.assertNotEqual(result.returncode, 0)
        self.assertLess(elapsed, 30)
        # Each rank's report: its step, then its last operations; the last one it waits for.
        last = {}
        for rank in (0, 1):
            self.assertRegex(result.stderr, rf"watchdog: rank {rank}: step \d+ has not finished after \d+ s \(--timeout 2\)")
            operations = re.findall(
                rf"watchdog: rank {rank}:   #(\d+) (\w+) on (\w+) \((\d+) bytes of (\w+)\) (done|WAITING)",
                result.stderr)
            self.assertTrue(operations, result.stderr)
            self.assertEqual(operations[-1][5], "WAITING")
            last[rank] = operations[-1]
        # Rank 1 skipped step 3's world sum: at the same position in their sequences, rank 0 waits
        # in that all-reduce on the world, rank 1 already in the next step's on the data-parallel group.
        self.assertEqual(last[0][0], last[1][0])
        # ...of doubles (the world sums), and of the gradients' type (fp32 here).
        self.assertEqual(last[0][1:3] + last[0][4:5], ("all_reduce", "world", "fp64"))
        self.assertEqual(last[1][1:3] + last[1][4:5], ("all_reduce", "dp", "fp32"))
        self.assertRegex(result.stderr, r"watchdog: rank 0: step 3 has not finished")

    def test_staged_operations_in_flight_still_end_the_job_naming_them(self):
        """On the device path (loopback), gradient reductions are staged through host memory on each
        rank's communication engine while backward goes on. Rank 1 leaves out its third bucket
        reduction: rank 0's waits in that started all-reduce until the watchdog names it; and a
        rank killed while such operations are in flight ends the job within 30 s."""
        staged = ["--layers", "6", "--hidden", "16", "--global-batch", "16", "--log-every", "0", "--device", "loopback",
                  "--bucket-mb", "0.001"]
        environment = dict(os.environ, MLPTRAIN_FAULT="1:dp:all_reduce:fp32:3", OMP_NUM_THREADS="1")
        started = time.monotonic()
        result = subprocess.run([MPIEXEC, "-n", "2", MLPTRAIN] + staged + ["--steps", "10", "--timeout", "2"],
                                capture_output=True, text=True, timeout=60, env=environment)
        self.assertNotEqual(result.returncode, 0)
        self.assertLess(time.monotonic() - started, 30)
        waiting = re.findall(r"watchdog: rank 0:   #\d+ (\w+) on (\w+) \(\d+ bytes of (\w+)\) WAITING", result.stderr)
        self.assertIn(("all_reduce", "dp", "fp32"), waiting, result.stderr)

        marker = self.path("killed")
        with background_run(staged + ["--steps", "100000000", "--metrics", marker]) as launcher:
            wait_until(lambda: os.path.exists(marker) and os.path.getsize(marker) >= 2000)
            kill_a_rank(self, launcher, marker)

    def test_a_malformed_fault_plan_is_one_line(self):
        result = run(ARGUMENTS + ["--steps", "1"], 2, check=False, environment={"MLPTRAIN_FAULT": "1:world"})
        self.assertEqual(result.returncode, 2)
        self.assertIn("MLPTRAIN_FAULT='1:world'", result.stderr + result.stdout)

    def test_silent_without_a_hang(self):
        result = run(ARGUMENTS + ["--steps", "5", "--timeout", "1"], 2)
        self.assertNotIn("watchdog", result.stdout + result.stderr)


if __name__ == "__main__":
    unittest.main()
