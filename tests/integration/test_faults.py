"""A rank killed with SIGKILL in the middle of a run ends the whole job within 30 s; `latest` names
a whole checkpoint, every checkpoint under a final name is whole, and resuming from `latest`
continues exactly like a run that was never interrupted."""
import glob
import os
import unittest

import h5py
import numpy as np

from common import TrainingTestCase, background_run, kill_a_rank, read_checkpoint, run, wait_until

ARGUMENTS = ["--layers", "4", "--hidden", "32", "--global-batch", "32", "--log-every", "0",
             "--save-every", "20", "--shuffle"]


class Faults(TrainingTestCase):
    def test_killed_rank_ends_the_job_and_the_run_resumes_exactly(self):
        directory = self.path("interrupted")
        latest = os.path.join(directory, "latest")
        def saved_step_40():
            if not os.path.exists(latest) or os.path.getsize(latest) == 0:
                return False
            with open(latest) as handle:
                return int(handle.read().strip()[5:13]) >= 40

        with background_run(ARGUMENTS + ["--steps", "100000000", "--checkpoint-dir", directory]) as launcher:
            wait_until(saved_step_40)
            kill_a_rank(self, launcher, directory)
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
