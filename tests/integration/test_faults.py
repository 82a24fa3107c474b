"""A rank killed with SIGKILL in the middle of a run ends the whole job within 30 s; `latest` names
a whole checkpoint, every checkpoint under a final name is whole, and resuming from `latest`
continues exactly like a run that was never interrupted."""
import glob
import os
import signal
import subprocess
import time
import unittest

import h5py
import numpy as np

from common import MLPTRAIN, MPIEXEC, TrainingTestCase, rank_processes, read_checkpoint, run

ARGUMENTS = ["--layers", "4", "--hidden", "32", "--global-batch", "32", "--log-every", "0",
             "--save-every", "20", "--shuffle"]


class Faults(TrainingTestCase):
    def test_killed_rank_ends_the_job_and_the_run_resumes_exactly(self):
        directory = self.path("interrupted")
        latest = os.path.join(directory, "latest")
        launcher = subprocess.Popen([MPIEXEC, "-n", "2", MLPTRAIN] + ARGUMENTS +
                                    ["--steps", "100000000", "--checkpoint-dir", directory],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    env=dict(os.environ, OMP_NUM_THREADS="1"))
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                if os.path.exists(latest) and os.path.getsize(latest) > 0:
                    with open(latest) as handle:
                        if int(handle.read().strip()[5:13]) >= 40:
                            break
                time.sleep(0.05)
            ranks = rank_processes(directory)
            self.assertEqual(len(ranks), 2)
            os.kill(ranks[-1], signal.SIGKILL)
            killed = time.monotonic()
            launcher.wait(timeout=30)
            self.assertLess(time.monotonic() - killed, 30)
            self.assertNotEqual(launcher.returncode, 0)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
        # Every file under a final name is whole; `latest` names one of them.
        with open(latest) as handle:
            name = handle.read().strip()
        for path in glob.glob(os.path.join(directory, "step_*.h5")):
            with h5py.File(path, "r") as file:
                self.assertEqual(file.attrs["format"], "mlptrain-checkpoint")
        step = int(name[5:13])
        self.assertTrue(os.path.exists(os.path.join(directory, name)))
        # Resuming continues exactly where the uninterrupted run would be.
        end = step + 10
        run(ARGUMENTS + ["--steps", end, "--resume", directory, "--checkpoint-dir", self.path("resumed")], 2)
        run(ARGUMENTS + ["--steps", end, "--checkpoint-dir", self.path("whole")], 2)
        resumed = read_checkpoint(os.path.join(self.path("resumed"), f"step_{end:08d}.h5"))
        whole = read_checkpoint(os.path.join(self.path("whole"), f"step_{end:08d}.h5"))
        for tensor, values in whole.items():
            self.assertTrue(np.array_equal(resumed[tensor], values), tensor)


if __name__ == "__main__":
    unittest.main()
