"""Runs that survive their scheduler. A stop signal (SIGTERM, SIGINT or SIGUSR1, to the launcher,
which forwards it to every rank, or to one rank only) ends a 2-rank run at the next step boundary
every rank agrees on, with a checkpoint of that step, exit status 3 from the ranks, within 30 s;
rerun with --resume auto, the same command continues from that step, and the pair equals one
uninterrupted run bit for bit (every step's loss, the final checkpoint) in data-parallel, ZeRO-3,
pipeline and tensor-parallel layouts. A second signal during the stop's save changes nothing.
--keep-last N keeps exactly the newest N step files; a save that fails on a full disk leaves no
partial file behind, and `latest` still resumes."""
import glob
import os
import signal
import subprocess
import time
import unittest

import numpy as np

from common import TrainingTestCase, background_run, rank_processes, read_checkpoint, read_metrics, run, wait_until

MODEL = ["--layers", "4", "--hidden", "32", "--global-batch", "32", "--log-every", "0", "--shuffle", "--seed", "7"]
# Who gets the signal: the launcher (mpiexec.mpich forwards it to every rank), every rank (as srun
# delivers it), or one rank only (the other learns of it in the step's world sum).
LAYOUTS = [(["--dp", "2"], signal.SIGTERM, "launcher"), (["--dp", "2", "--zero", "3"], signal.SIGUSR1, "ranks"),
           (["--pp", "2", "--micro-batches", "4"], signal.SIGINT, "launcher"), (["--tp", "2"], signal.SIGTERM, "rank 1")]
STOPPED = 3  # the ranks' exit status after a stop signal (DESIGN.md §2.3)


def losses(path):
    steps, _ = read_metrics(path)
    return {step["step"]: step["loss"] for step in steps}


class Preemption(TrainingTestCase):
    def stopped_run(self, name, arguments, signum, target, at_least_steps=5, second_signal=False):
        """Starts a long run, signals it once it has done a few steps; returns (the launcher's
        result, the step it stopped after, its metrics file)."""
        directory, metrics = self.path(name), self.path(f"{name}.jsonl")

        def stepped():
            if not os.path.exists(metrics):
                return False
            with open(metrics) as handle:
                return len(handle.readlines()) >= at_least_steps

        with background_run(arguments + ["--steps", "100000000", "--checkpoint-dir", directory, "--metrics", metrics],
                            capture=True) as launcher:
            wait_until(stepped)
            ranks = rank_processes(metrics)
            self.assertEqual(len(ranks), 2)
            victims = {"launcher": [launcher.pid], "ranks": ranks, "rank 1": ranks[1:]}[target]
            for victim in victims:
                os.kill(victim, signum)
            signalled = time.monotonic()
            if second_signal:
                time.sleep(0.05)
                for victim in victims:
                    os.kill(victim, signum)  # the ranks are still saving: they end after it
            out, err = launcher.communicate(timeout=60)
            self.assertLess(time.monotonic() - signalled, 30)
        steps, _ = read_metrics(metrics)
        stopped = steps[-1]["step"]
        self.assertTrue(steps[-1].get("stopped"), steps[-1])
        self.assertEqual([step["step"] for step in steps if step.get("stopped")], [stopped])
        self.assertIn(f"stopped by {signal.Signals(signum).name if target != 'rank 1' else 'a stop signal to another rank'}",
                      out)
        self.assertIn(f"after step {stopped} of 100000000: saved in {directory}", out)
        with open(os.path.join(directory, "latest")) as handle:
            self.assertEqual(handle.read().strip(), f"step_{stopped:08d}.h5")
        self.assertEqual(glob.glob(os.path.join(directory, ".*partial")), [])
        return launcher.returncode, stopped, err

    def test_a_stop_signal_saves_and_a_rerun_equals_one_uninterrupted_run(self):
        for layout, signum, target in LAYOUTS:
            with self.subTest(layout=layout, signal=signum.name, to=target):
                name = "_".join(layout).replace("-", "")
                arguments = MODEL + layout + ["--save-every", "1000000"]
                code, stopped, errors = self.stopped_run(name, arguments, signum, target)
                # Signalled itself, the launcher reports either the ranks' status or its own 0 (hydra
                # races the two); signalled ranks exit with theirs, which it passes on.
                self.assertIn(code, (STOPPED, 0) if target == "launcher" else (STOPPED,), errors)
                # Nothing on stderr but the launcher's own note of a forwarded Ctrl-C.
                self.assertEqual([line for line in errors.splitlines() if not line.startswith("[mpiexec@")], [])
                end = stopped + 4
                # The unchanged command, rerun (--resume auto), to a nearby end; and one run straight there.
                rerun = run(arguments + ["--steps", end, "--checkpoint-dir", self.path(name), "--resume", "auto",
                                         "--metrics", self.path(f"{name}_rerun.jsonl")], 2).stdout
                self.assertIn(f"--resume auto: continuing from {self.path(name)}/latest", rerun)
                run(arguments + ["--steps", end, "--checkpoint-dir", self.path(f"{name}_whole"),
                                 "--metrics", self.path(f"{name}_whole.jsonl")], 2)
                interrupted = losses(self.path(f"{name}.jsonl")) | losses(self.path(f"{name}_rerun.jsonl"))
                self.assertEqual(interrupted, losses(self.path(f"{name}_whole.jsonl")))
                resumed = read_checkpoint(os.path.join(self.path(name), f"step_{end:08d}.h5"))
                whole = read_checkpoint(os.path.join(self.path(f"{name}_whole"), f"step_{end:08d}.h5"))
                self.assertEqual(sorted(resumed), sorted(whole))
                for tensor, values in whole.items():
                    self.assertTrue(np.array_equal(resumed[tensor], values), tensor)

    def test_a_second_signal_during_the_save(self):
        # Saves of 200 MB, in the background every other step: the second signal lands while the
        # stop's save (or the one in flight before it) is being written.
        arguments = ["--layers", "3", "--hidden", "2900", "--global-batch", "16", "--log-every", "0",
                     "--save-every", "2"]
        code, stopped, _ = self.stopped_run("twice", arguments, signal.SIGUSR1, "ranks", at_least_steps=3,
                                            second_signal=True)
        self.assertEqual(code, STOPPED)
        # Every file under a final name is whole, and the run continues from `latest`.
        for path in glob.glob(os.path.join(self.path("twice"), "step_*.h5")):
            read_checkpoint(path)
        output = run(arguments + ["--steps", stopped + 2, "--checkpoint-dir", self.path("twice"), "--resume", "auto"],
                     2).stdout
        self.assertIn(f"at step {stopped}", output)

    def test_keep_last_keeps_exactly_the_newest(self):
        directory = self.path("kept")
        run(MODEL + ["--steps", 7, "--save-every", 1, "--checkpoint-dir", directory, "--keep-last", 2], 2)
        self.assertEqual(sorted(os.listdir(directory)), ["latest", "step_00000006.h5", "step_00000007.h5"])
        # Asynchronous saves publish a step late: the newest two still remain, `latest` the last.
        run(MODEL + ["--steps", 7, "--save-every", 1, "--checkpoint-dir", self.path("async"), "--keep-last", 1,
                     "--save-mode", "async"], 2)
        self.assertEqual(sorted(os.listdir(self.path("async"))), ["latest", "step_00000007.h5"])

    def test_a_full_disk_leaves_no_partial_file_and_latest_resumes(self):
        """A tmpfs with room for one checkpoint and a half where the test may mount one (root),
        else the preloaded library that fails large writes to partial files as a full disk does."""
        model = ["--layers", "3", "--hidden", "512", "--global-batch", "16", "--log-every", "0"]
        run(model + ["--steps", 1, "--checkpoint-dir", self.path("sized")], 2)
        size = os.path.getsize(os.path.join(self.path("sized"), "step_00000001.h5"))
        disk = self.path("disk")
        os.makedirs(disk)
        mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size * 3 // 2}", "tmpfs", disk],
                                 capture_output=True).returncode == 0
        if mounted:
            self.addCleanup(subprocess.run, ["umount", disk])
        arguments = model + ["--checkpoint-dir", disk]
        run(arguments + ["--steps", 1], 2)
        preload = {} if mounted else {"LD_PRELOAD": os.environ.get("MLPTRAIN_FAIL_LARGE_WRITES",
                                                                   "build/tests/libfail_large_writes.so")}
        result = run(arguments + ["--steps", 3, "--save-every", 1, "--resume", "auto", "--save-mode", "sync"], 2,
                     check=False, environment=preload)
        self.assertEqual(result.returncode, 1, result.stdout + result.stderr)
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        self.assertEqual(len(lines), 1, result.stderr)
        self.assertIn("No space left on device", lines[0])
        self.assertEqual(sorted(os.listdir(disk)), ["latest", "step_00000001.h5"])
        output = run(arguments + ["--steps", 1, "--resume", "auto"], 2).stdout
        self.assertIn("resumed from", output)


if __name__ == "__main__":
    unittest.main()
