"""The checkpoint layout of DESIGN.md §2.5, read with h5py and the HDF5 command-line tools:
names, shapes, root attributes, per-dataset CRC-32 (checked here with zlib), `latest`, and no
temporary files left behind."""
import os
import shutil
import subprocess
import unittest
import zlib

import h5py
import numpy as np

from common import TrainingTestCase, run


class CheckpointFormat(TrainingTestCase):
    def test_layout_attributes_and_checksums(self):
        directory = self.path("checkpoints")
        run(["--layers", "3", "--hidden", "8", "--input-dim", "5", "--output-dim", "2",
             "--global-batch", "8", "--steps", "6", "--save-every", "3", "--log-every", "0",
             "--checkpoint-dir", directory], 2)
        self.assertEqual(sorted(os.listdir(directory)),
                         ["latest", "step_00000003.h5", "step_00000006.h5"])
        with open(os.path.join(directory, "latest")) as handle:
            self.assertEqual(handle.read().strip(), "step_00000006.h5")
        with h5py.File(os.path.join(directory, "step_00000006.h5"), "r") as file:
            self.assertEqual(file.attrs["format"], "mlptrain-checkpoint")
            self.assertEqual(file.attrs["format_version"], 1)
            self.assertEqual(file.attrs["step"], 6)
            self.assertEqual(file.attrs["seed"], 1234)
            self.assertEqual(file.attrs["layout"], "dp=2 tp=1 pp=1 ep=1 zero=0")
            self.assertIn("hidden = 8", file.attrs["config"])
            self.assertEqual(file["optimizer"].attrs["step"], 6)
            shapes = {"layers/00/weight": (8, 5), "layers/00/bias": (8,),
                      "layers/01/weight": (8, 8), "layers/01/bias": (8,),
                      "layers/02/weight": (2, 8), "layers/02/bias": (2,)}
            for prefix in ("model", "optimizer/exp_avg", "optimizer/exp_avg_sq"):
                for name, shape in shapes.items():
                    dataset = file[f"{prefix}/{name}"]
                    self.assertEqual(dataset.shape, shape)
                    self.assertEqual(dataset.dtype, np.float32)
                    data = dataset[()].astype("<f4").tobytes()
                    self.assertEqual(int(dataset.attrs["crc32"]), zlib.crc32(data), f"{prefix}/{name}")
            self.assertTrue(np.all(file["optimizer/exp_avg_sq/layers/01/weight"][()] > 0))

    @unittest.skipUnless(shutil.which("h5ls"), "h5ls (hdf5-tools) is not installed")
    def test_hdf5_tools_read_it(self):
        directory = self.path("checkpoints")
        run(["--steps", "1", "--log-every", "0", "--checkpoint-dir", directory], 1)
        listing = subprocess.run(["h5ls", "-r", os.path.join(directory, "step_00000001.h5")],
                                 capture_output=True, text=True, check=True).stdout
        self.assertIn("/model/layers/03/weight", listing)
        self.assertIn("/optimizer/exp_avg_sq/layers/00/bias", listing)
        dump = subprocess.run(["h5dump", "-a", "/format", os.path.join(directory, "step_00000001.h5")],
                              capture_output=True, text=True, check=True).stdout
        self.assertIn("mlptrain-checkpoint", dump)


if __name__ == "__main__":
    unittest.main()
