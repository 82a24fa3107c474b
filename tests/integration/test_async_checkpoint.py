"""Checkpoints written once and behind training: the ranks holding a tensor alike (data-parallel
replicas, tensor-parallel copies of a bias, hybrid-sharding replicas) each write a slice, every
dataset's crc32 attribute is zlib's CRC-32 of its stored bytes, and an asynchronous save gives the
same file as a synchronous one. The save's bytes, time and rate reach the log, the metrics and the
trace, where the writes overlap the following steps (async) or lie inside the pause (sync, and the
run's last save, which no step follows). A rank killed with SIGKILL during a run's first save, an
asynchronous one between, or its last leaves `latest` naming the previous checkpoint (or none),
which resumes exactly; a write that fails (a full disk, simulated by a preloaded library) stops
every rank with one line naming the file."""
import glob
import json
import os
import signal
import subprocess
import time
import unittest
import zlib

import numpy as np

from common import (MLPTRAIN, MPIEXEC, TrainingTestCase, h5py, rank_processes, read_checkpoint,
                    read_metrics, run)

SMALL = ["--layers", "4", "--hidden", "512", "--global-batch", "16", "--log-every", "0", "--steps", "6",
         "--save-every", "3"]
# Weights of 4 MiB: a replica's slice of one is 1 MiB or more (what the failing library refuses).
LARGE = ["--layers", "3", "--hidden", "1024", "--global-batch", "16", "--log-every", "0", "--shuffle"]
# A 50 MB checkpoint: its save is in flight for at least a step and the copy, write and fsync of
# that much, far longer than noticing its partial file takes.
KILLED = ["--layers", "3", "--hidden", "2048", "--global-batch", "16", "--log-every", "0", "--shuffle",
          "--save-every", "4"]
FAIL_LARGE_WRITES = os.environ.get("MLPTRAIN_FAIL_LARGE_WRITES", "build/tests/libfail_large_writes.so")


def parameters_of(summary):
    return summary["parameters"]


def write_spans(trace):
    """Per rank: the checkpoint writes' (start, end, bytes) in microseconds, and the compute spans."""
    writes, compute, begins = {}, {}, {}
    for event in trace["traceEvents"]:
        rank = event.get("pid")
        if event.get("cat") == "storage" and event["ph"] == "b":
            begins[event["id"]] = event
        elif event.get("cat") == "storage" and event["ph"] == "e":
            begin = begins.pop(event["id"])
            writes.setdefault(rank, []).append((begin["ts"], event["ts"], begin["args"]["bytes"]))
        elif event.get("ph") == "X":
            compute.setdefault(rank, []).append((event["name"], event["ts"], event["ts"] + event["dur"]))
    return writes, compute


class AsyncCheckpoints(TrainingTestCase):
    def saved(self, name, arguments, ranks):
        """Trains with metrics and a trace; returns (steps, summary, trace, checkpoint directory)."""
        directory = self.path(name)
        metrics, trace = self.path(name + ".jsonl"), self.path(name + ".trace.json")
        result = run(list(arguments) + ["--checkpoint-dir", directory, "--metrics", metrics, "--trace", trace], ranks)
        steps, summary = read_metrics(metrics)
        with open(trace) as handle:
            return steps, summary, json.load(handle), directory, result.stdout

    def test_replicas_write_slices_once_and_async_equals_sync(self):
        # In each layout an element's copies (the ranks over its distinct parts) share its writing,
        # so each rank writes 1/ranks of the file.
        for ranks, layout in ((2, ["--dp", 2]), (4, ["--dp", 2, "--tp", 2]), (2, ["--dp", 2, "--zero", 1]),
                              (4, ["--dp", 4, "--zero", 3, "--zero-shard-size", 2])):
            with self.subTest(layout=layout):
                name = "-".join(map(str, layout))
                steps, summary, trace, directory, _ = self.saved(name, SMALL + layout, ranks)
                file_bytes = 12 * parameters_of(summary)
                writes, _ = write_spans(trace)
                self.assertEqual(sorted(writes), list(range(ranks)))
                for save in range(2):  # steps 3 and 6
                    shares = [writes[rank][save][2] for rank in range(ranks)]
                    self.assertEqual(sum(shares), file_bytes)
                    # Slices are aligned to 4 KiB of each tensor's elements: a tensor's three
                    # parts may tilt by that much, and a bias fall whole to one rank.
                    self.assertLess(max(shares), file_bytes / ranks + 8 * 3 * 4096)
                # zlib's CRC-32 of each dataset's stored bytes is its attribute; async equals sync.
                synchronous = self.path(name + "-sync")
                run(SMALL + layout + ["--checkpoint-dir", synchronous, "--save-mode", "sync"], ranks)
                for step in (3, 6):
                    file_name = f"step_{step:08d}.h5"
                    with h5py.File(os.path.join(directory, file_name), "r") as file:
                        def check(dataset_name, item):
                            if isinstance(item, h5py.Dataset):
                                data = np.ascontiguousarray(item[()], dtype="<f4")
                                self.assertEqual(int(item.attrs["crc32"]), zlib.crc32(data.tobytes()), dataset_name)
                        file.visititems(check)
                    written = read_checkpoint(os.path.join(directory, file_name))
                    blocking = read_checkpoint(os.path.join(synchronous, file_name))
                    self.assertEqual(sorted(written), sorted(blocking))
                    for dataset_name, tensor in written.items():
                        np.testing.assert_array_equal(tensor, blocking[dataset_name], err_msg=dataset_name)

    def test_the_save_reaches_the_log_metrics_and_trace(self):
        for mode in ("async", "sync"):
            with self.subTest(mode=mode):
                steps, summary, trace, directory, stdout = self.saved(mode, SMALL + ["--save-mode", mode], 1)
                file_bytes = 12 * parameters_of(summary)
                saves = summary["checkpoints"]
                self.assertEqual([save["step"] for save in saves], [3, 6])
                for save in saves:
                    self.assertEqual(save["bytes"], file_bytes)
                    self.assertAlmostEqual(save["gb_per_s"], save["bytes"] / save["seconds"] / 1e9, places=6)
                    self.assertGreater(save["paused_ms"], 0)
                    if mode == "sync":  # training waited for all of it
                        self.assertGreaterEqual(save["paused_ms"], save["seconds"] * 1000)
                    self.assertTrue(os.path.exists(save["file"]))
                    self.assertIn(f"saved checkpoint {save['file']} (", stdout)
                # A save that ended during a step is in that step's record.
                ended = [step["checkpoint"] for step in steps if "checkpoint" in step]
                self.assertTrue(all(save in saves for save in ended))
                writes, compute = write_spans(trace)
                pauses = [(start, end) for name, start, end in compute[0] if name == "checkpoint"]
                self.assertEqual(len(pauses), 2)
                first_write, last_write = writes[0][0], writes[0][1]
                # The last save has no step after it to overlap: written before the run goes on,
                # whatever the mode, as a sync save is (its pause covers all of it).
                self.assertTrue(pauses[1][0] <= last_write[0] and last_write[1] <= pauses[1][1])
                self.assertGreaterEqual(saves[1]["paused_ms"], saves[1]["seconds"] * 1000)
                if mode == "sync":
                    # Written before training went on: inside the pause.
                    self.assertTrue(pauses[0][0] <= first_write[0] and first_write[1] <= pauses[0][1])
                else:
                    # Written behind training: the writes start inside the pause and go on past it,
                    # into the following steps' computation.
                    self.assertGreater(first_write[1], pauses[0][1])
                    later = [span for span in compute[0] if span[0] in ("forward", "backward") and span[1] > pauses[0][1]]
                    self.assertTrue(any(start < first_write[1] for _, start, _ in later), "no step overlapped the write")

    def kill_during_save(self, name, steps, save_step):
        """Trains at 2 ranks, saving every 4 steps, and kills a rank with SIGKILL while the save of
        `save_step` is being written (its partial file exists); returns the checkpoint directory."""
        directory = self.path(name)
        launcher = subprocess.Popen([MPIEXEC, "-n", "2", MLPTRAIN] + KILLED +
                                    ["--steps", str(steps), "--checkpoint-dir", directory],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                    env=dict(os.environ, OMP_NUM_THREADS="1"))
        partial = os.path.join(directory, f".step_{save_step:08d}.h5.partial")
        try:
            deadline = time.monotonic() + 120
            ranks = []
            while len(ranks) < 2 and time.monotonic() < deadline:
                ranks = rank_processes(directory)
                time.sleep(0.01)
            self.assertEqual(len(ranks), 2)
            while not os.path.exists(partial) and time.monotonic() < deadline:
                time.sleep(0.0005)
            os.kill(ranks[-1], signal.SIGKILL)
            launcher.wait(timeout=30)
            self.assertNotEqual(launcher.returncode, 0)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()
            launcher.stderr.close()
        return directory

    def test_a_rank_killed_during_a_save_leaves_the_previous_checkpoint(self):
        # A run's first save (its memory made ready behind the steps before it), an asynchronous
        # save between, and the last save (written straight from the state).
        for name, steps, save_step, previous in (("first", 100000, 4, None), ("between", 100000, 8, 4),
                                                 ("last", 8, 8, 4)):
            with self.subTest(save=name):
                directory = self.kill_during_save(name, steps, save_step)
                kept = [] if previous is None else [os.path.join(directory, f"step_{previous:08d}.h5")]
                self.assertEqual(glob.glob(os.path.join(directory, "step_*.h5")), kept)
                latest = os.path.join(directory, "latest")
                if previous is None:
                    self.assertFalse(os.path.exists(latest))
                    continue
                with open(latest) as handle:
                    self.assertEqual(handle.read().strip(), f"step_{previous:08d}.h5")
                # Resuming from it continues exactly where an uninterrupted run would be.
                run(KILLED + ["--steps", 6, "--resume", directory, "--checkpoint-dir", self.path(name + "-resumed")], 2)
                run(KILLED + ["--steps", 6, "--checkpoint-dir", self.path(name + "-whole")], 2)
                resumed = read_checkpoint(os.path.join(self.path(name + "-resumed"), "step_00000006.h5"))
                whole = read_checkpoint(os.path.join(self.path(name + "-whole"), "step_00000006.h5"))
                for dataset_name, tensor in whole.items():
                    np.testing.assert_array_equal(resumed[dataset_name], tensor, err_msg=dataset_name)

    def test_a_failed_write_stops_every_rank_with_one_line(self):
        directory = self.path("full")
        run(LARGE + ["--steps", 2, "--checkpoint-dir", directory], 2)
        for mode in ("async", "sync"):
            with self.subTest(mode=mode):
                started = time.monotonic()
                result = run(LARGE + ["--steps", 8, "--save-every", 2, "--resume", directory, "--checkpoint-dir",
                                      directory, "--save-mode", mode], 2, check=False,
                             environment={"LD_PRELOAD": FAIL_LARGE_WRITES})
                self.assertLess(time.monotonic() - started, 60)
                self.assertEqual(result.returncode, 1, result.stderr)
                lines = [line for line in result.stderr.splitlines() if line.strip()]
                self.assertEqual(len(lines), 1, result.stderr)
                self.assertRegex(lines[0], r"^mlptrain: error: checkpoint: writing '.*/\.step_00000004\.h5\.partial' "
                                           r"failed: No space left on device$")
                with open(os.path.join(directory, "latest")) as handle:
                    self.assertEqual(handle.read().strip(), "step_00000002.h5")
                # Synchronous saves stop before the next step; asynchronous ones by a later one.
                self.assertFalse(os.path.exists(os.path.join(directory, "step_00000004.h5")))
                # The failed save's partial file is gone with it.
                self.assertEqual([name for name in os.listdir(directory) if name.endswith(".partial")], [])


if __name__ == "__main__":
    unittest.main()
