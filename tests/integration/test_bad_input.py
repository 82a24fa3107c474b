"""Bad input of every kind (flags, INI files, data files, checkpoint directories, checkpoints)
ends the run on every rank within seconds with a non-zero exit code and one clear line from rank
0 naming the offending option or file: never a hang, a crash or a stack trace."""
import os
import shutil
import subprocess
import time
import unittest

import h5py
import numpy as np

from common import MLPTRAIN, MPIEXEC, TrainingTestCase, run

SMALL = ["--layers", "3", "--hidden", "8", "--log-every", "0", "--global-batch", "8"]
TIME_LIMIT_S = 10


class BadInput(TrainingTestCase):
    def expect_failure(self, arguments, ranks, names, code=None):
        """Runs a bad invocation and checks how it fails; `names` must all appear in the line."""
        started = time.monotonic()
        result = subprocess.run([MPIEXEC, "-n", str(ranks), MLPTRAIN] + [str(a) for a in arguments],
                                capture_output=True, text=True, timeout=60)
        elapsed = time.monotonic() - started
        self.assertLess(elapsed, TIME_LIMIT_S, f"{arguments}: took {elapsed:.1f} s")
        self.assertNotEqual(result.returncode, 0, f"{arguments}: exit code 0")
        if code is not None:
            self.assertEqual(result.returncode, code, f"{arguments}: {result.stderr}")
        errors = [line for line in result.stderr.splitlines() if line.strip()]
        self.assertEqual(len(errors), 1, f"{arguments}: expected one line, got:\n{result.stderr}")
        self.assertTrue(errors[0].startswith("mlptrain: error: "), errors[0])
        for name in names:
            self.assertIn(name, errors[0], f"{arguments}: the line does not name {name}")
        for noise in ("terminate called", "Traceback", "Abort", "BAD TERMINATION", "HDF5-DIAG",
                      "Segmentation"):
            self.assertNotIn(noise, result.stdout + result.stderr)
        return errors[0]

    def test_flags_and_values(self):
        cases = [
            (["--no-such-flag"], 2, ["no-such-flag"]),
            (["--layers", "many"], 2, ["--layers"]),
            (["--layers", "1"], 1, ["--layers"]),
            (["--lr", "-1"], 2, ["--lr"]),
            (["--zero", "7"], 2, ["--zero"]),
            (["--dataset", "imagenet"], 2, ["--dataset", "imagenet"]),
            (["--lr-schedule", "linear"], 1, ["--lr-schedule"]),
            (["--on-nan", "ignore"], 2, ["--on-nan", "ignore"]),
            (["--dp", "3"], 2, ["world size 2"]),
            (["--global-batch", "30", "--micro-batches", "4"], 2, ["--global-batch 30", "--micro-batches 4"]),
            (["--global-batch", "6"], 4, ["dp 4"]),
            (["--global-batch", "8", "--global-batch", "9"], 1, ["--global-batch"]),
            (["--pp", "4"], 4, ["--pp 4", "--layers 3"]),
            (["--pp", "2", "--global-batch", "6", "--micro-batches", "2"], 4, ["micro-batch of 3", "dp 2"]),
            (["--pp", "2", "--schedule", "zigzag"], 2, ["--schedule", "zigzag"]),
            (["--trace", "/no/such/directory/trace.json"], 2, ["--trace", "/no/such/directory"]),
            (["--tp", "3"], 3, ["--hidden 8", "--tp 3"]),
            (["--tp", "3"], 2, ["world size 2", "tp"]),
            (["--tf32"], 1, ["--tf32", "needs --device cuda"]),
            (["--save-every", "5"], 1, ["--checkpoint-dir"]),
            (["--moe-every", "1", "--experts", "6", "--ep", "4"], 4, ["--experts 6", "--ep 4"]),
            (["--moe-every", "1", "--experts", "4", "--ep", "4"], 2, ["--ep 4", "dp 2"]),
            (["--moe-every", "1", "--experts", "4", "--ep", "2", "--pp", "2"], 2, ["--ep 2", "dp 1"]),
            (["--moe-every", "1", "--experts", "2", "--top-k", "3"], 1, ["--top-k 3", "--experts 2"]),
            (["--moe-every", "1", "--capacity-factor", "-0.5"], 1, ["--capacity-factor"]),
            (["--moe-every", "5"], 1, ["--moe-every 5", "--layers 3"]),
            (["--ep", "2"], 2, ["--ep", "--moe-every"]),
            (["--moe-every", "1", "--experts", "3", "--tp", "2"], 2, ["--experts 3", "--tp"]),
            (["--offload"], 2, ["--offload", "needs --device cuda"]),
            (["--zero", "3", "--zero-shard-size", "3"], 4, ["--zero-shard-size 3", "dp 4"]),
            (["--zero-shard-size", "2"], 4, ["--zero-shard-size", "--zero"]),
            (["--zero", "1", "--zero-shard-size", "-2"], 2, ["--zero-shard-size"]),
            (["--sequence-parallel"], 2, ["--sequence-parallel", "--tp"]),
            (["--sequence-parallel", "--tp", "4", "--global-batch", "8", "--micro-batches", "4"], 4,
             ["--sequence-parallel", "2 rows", "--tp 4"]),
            (["--param-dtype", "fp8"], 1, ["--param-dtype", "fp8"]),
            (["--reduce-dtype", "int8"], 2, ["--reduce-dtype", "int8"]),
            (["--param-dtype", "bf16", "--reduce-dtype", "fp16"], 2, ["--reduce-dtype fp16", "--param-dtype bf16"]),
            (["--loss-scale", "128"], 1, ["--loss-scale", "fp16"]),
            (["--param-dtype", "bf16", "--loss-scale-window", "10"], 2, ["--loss-scale-window", "fp16"]),
            (["--param-dtype", "fp16", "--loss-scale", "0.5"], 1, ["--loss-scale"]),
            (["--param-dtype", "fp16", "--initial-loss-scale", "4", "--min-loss-scale", "8"], 1,
             ["--min-loss-scale 8", "--initial-loss-scale 4"]),
            (["--fp8", "tensorwise"], 1, ["--fp8 tensorwise", "--param-dtype bf16"]),
            (["--fp8", "blockwise"], 2, ["--fp8", "blockwise", "rowwise"]),
            (["--fp8-grad-format", "e5m2"], 1, ["--fp8-grad-format", "--fp8"]),
            (["--fp8-fast-accumulation"], 1, ["--fp8-fast-accumulation", "--fp8"]),
            (["--param-dtype", "bf16", "--fp8", "rowwise", "--fp8-fast-accumulation"], 2,
             ["--fp8-fast-accumulation", "--device cuda"]),
        ]
        for arguments, ranks, names in cases:
            with self.subTest(arguments=arguments):
                self.expect_failure(SMALL[:-2] + arguments, ranks, names, code=2)

    def test_ini_files(self):
        malformed = self.path("malformed.ini")
        with open(malformed, "w") as handle:
            handle.write("layers 5\n")
        self.expect_failure(["--config", malformed], 2, [malformed], code=2)
        unknown = self.path("unknown.ini")
        with open(unknown, "w") as handle:
            handle.write("hidden = 8\nwidth = 3\n")
        self.expect_failure(["--config", unknown], 2, [unknown, "width"], code=2)
        bad_value = self.path("bad_value.ini")
        with open(bad_value, "w") as handle:
            handle.write("steps = ten\n")
        self.expect_failure(["--config", bad_value], 2, ["steps"], code=2)
        self.expect_failure(["--config", self.path("missing.ini")], 2, ["missing.ini"], code=2)

    def test_data_files(self):
        missing = self.path("missing.h5")
        self.expect_failure(SMALL + ["--dataset", "hdf5", "--data-path", missing], 2, [missing])
        text = self.path("text.h5")
        with open(text, "w") as handle:
            handle.write("x,y\n1,2\n")
        self.expect_failure(SMALL + ["--dataset", "hdf5", "--data-path", text], 2, [text, "not an HDF5"])
        no_labels = self.path("no_labels.h5")
        with h5py.File(no_labels, "w") as file:
            file["x"] = np.zeros((10, 3), np.float32)
        self.expect_failure(SMALL + ["--dataset", "hdf5", "--data-path", no_labels], 2, [no_labels, "/y"])
        mismatched = self.path("mismatched.h5")
        with h5py.File(mismatched, "w") as file:
            file["x"] = np.zeros((10, 3), np.float32)
            file["y"] = np.zeros((9,), np.int64)
        self.expect_failure(SMALL + ["--dataset", "hdf5", "--data-path", mismatched], 2, [mismatched, "rows"])
        good = self.path("good.h5")
        with h5py.File(good, "w") as file:
            file["x"] = np.zeros((10, 3), np.float32)
            file["y"] = np.zeros((10,), np.int64)
        self.expect_failure(SMALL + ["--dataset", "hdf5", "--data-path", good, "--input-dim", "4"], 2,
                            ["--input-dim 4", good])
        self.expect_failure(SMALL + ["--dataset", "hdf5", "--data-path", good, "--eval-every", "2"], 2,
                            ["--eval-every", good])
        # A non-finite input is named by array, file and row: when the file opens if it is held in
        # memory, else by the step that reads it.
        not_finite = self.path("not_finite.h5")
        with h5py.File(not_finite, "w") as file:
            x = np.ones((40, 3), np.float32)
            x[21, 1] = np.inf
            file["x"] = x
            file["y"] = np.arange(40) % 2
        self.expect_failure(SMALL + ["--dataset", "hdf5", "--data-path", not_finite], 2,
                            [not_finite, "/x", "row 21", "non-finite"])
        self.expect_failure(SMALL[:-2] + ["--dataset", "hdf5", "--data-path", not_finite, "--data-memory-mb", "0",
                                          "--global-batch", "8", "--steps", "4"], 2,
                            [not_finite, "/x", "row 21"], code=1)

    def test_data_that_fails_on_one_rank_only(self):
        """A corrupted chunk that only rank 1 reads, in the middle of training."""
        path = self.path("one_bad_chunk.h5")
        with h5py.File(path, "w") as file:
            file.create_dataset("x", data=np.random.default_rng(0).normal(size=(64, 4)).astype(np.float32),
                                chunks=(8, 4), compression="gzip")
            file["y"] = np.arange(64) % 3
        with h5py.File(path, "r") as file:
            chunk = file["x"].id.get_chunk_info(1)  # rows 8-15: rank 1's half of the first batch
        with open(path, "r+b") as handle:
            handle.seek(chunk.byte_offset)
            handle.write(b"\xff" * chunk.size)
        self.expect_failure(SMALL[:-2] + ["--dataset", "hdf5", "--data-path", path, "--data-memory-mb", "0",
                                          "--global-batch", "16", "--steps", "3"], 2, [path], code=1)
        # Held in memory, the whole file is read when it opens, and the damage is found there.
        self.expect_failure(SMALL[:-2] + ["--dataset", "hdf5", "--data-path", path,
                                          "--global-batch", "16", "--steps", "3"], 2, [path], code=2)

    def test_unwritable_checkpoint_directory(self):
        blocker = self.path("a-file")
        with open(blocker, "w") as handle:
            handle.write("not a directory")
        self.expect_failure(SMALL + ["--checkpoint-dir", os.path.join(blocker, "sub")], 2, ["--checkpoint-dir"])
        self.expect_failure(SMALL + ["--metrics", os.path.join(blocker, "m.jsonl")], 2, ["--metrics"])

    def test_checkpoints(self):
        directory = self.path("good")
        run(SMALL + ["--steps", "2", "--checkpoint-dir", directory], 2)
        checkpoint = os.path.join(directory, "step_00000002.h5")
        self.expect_failure(SMALL + ["--resume", self.path("nowhere")], 2, ["--resume", "nowhere"])
        self.expect_failure(SMALL + ["--resume", self.directory], 2, ["latest"])
        # Runs that survive their scheduler: the new options' rules, and a `latest` naming a
        # file that is gone (--resume auto takes it as the folder's word, and stops there).
        self.expect_failure(SMALL + ["--checkpoint-dir", directory, "--keep-last", "0"], 2, ["--keep-last", "0"], 2)
        self.expect_failure(SMALL + ["--checkpoint-dir", directory, "--keep-last", "-1"], 2, ["--keep-last", "-1"], 2)
        self.expect_failure(SMALL + ["--keep-last", "2"], 2, ["--keep-last", "--checkpoint-dir"], 2)
        self.expect_failure(SMALL + ["--resume", "auto"], 2, ["--resume auto", "--checkpoint-dir"], 2)
        dangling = self.path("dangling")
        os.makedirs(dangling)
        with open(os.path.join(dangling, "latest"), "w") as handle:
            handle.write("step_00000009.h5\n")
        self.expect_failure(SMALL + ["--checkpoint-dir", dangling, "--resume", "auto"], 2,
                            ["--resume", "latest", "step_00000009.h5"], 2)
        # Shapes that do not fit the model, and a different number of layers.
        # The message names the options that differ from the configuration the checkpoint stores.
        self.expect_failure(SMALL[:2] + ["--hidden", "9"] + SMALL[4:] + ["--resume", checkpoint], 2,
                            ["/model/layers/00/weight", "[8, 32]", "[9, 32]", "--hidden 8 (this run: 9)"])
        self.expect_failure(["--layers", "4"] + SMALL[2:] + ["--resume", checkpoint], 2,
                            ["3 layers", "--layers 3 (this run: 4)"])
        # Flipped bytes inside a tensor: the checksum names it.
        corrupted = self.path("corrupted.h5")
        shutil.copy(checkpoint, corrupted)
        with h5py.File(corrupted, "r") as file:
            offset = file["model/layers/01/weight"].id.get_offset()
        with open(corrupted, "r+b") as handle:
            handle.seek(offset + 16)
            handle.write(b"\x7f\x7f\x7f\x7f")
        self.expect_failure(SMALL + ["--resume", corrupted], 2, ["checksum mismatch", "/model/layers/01/weight"])
        # A truncated file, an HDF5 file that is not a checkpoint, and a missing dataset.
        truncated = self.path("truncated.h5")
        with open(checkpoint, "rb") as source, open(truncated, "wb") as target:
            target.write(source.read(1000))
        self.expect_failure(SMALL + ["--resume", truncated], 2, [truncated])
        stranger = self.path("stranger.h5")
        with h5py.File(stranger, "w") as file:
            file["x"] = np.zeros(3)
        self.expect_failure(SMALL + ["--resume", stranger], 2, ["not an mlptrain checkpoint"])
        incomplete = self.path("incomplete.h5")
        shutil.copy(checkpoint, incomplete)
        with h5py.File(incomplete, "r+") as file:
            del file["optimizer/exp_avg/layers/02/bias"]
        self.expect_failure(SMALL + ["--resume", incomplete], 2, ["/optimizer/exp_avg/layers/02/bias"])


if __name__ == "__main__":
    unittest.main()
