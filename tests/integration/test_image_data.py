"""Image data as the MNIST family ships it: IDX files (gzipped and not) converted by
scripts/datasets/idx_to_hdf5.py into uint8 images with a scale attribute, checked against the bytes the
IDX files hold (parsed here from the format's definition); the images fed as pixel * scale, the
same losses whether the file is held in memory or read a batch at a time, and every layout equal
to one process on these data; bad IDX files named in one line."""
import gzip
import os
import subprocess
import sys
import unittest

import h5py
import numpy as np

from common import SOURCE_ROOT, TrainingTestCase

CONVERTER = os.path.join(SOURCE_ROOT, "scripts", "datasets", "idx_to_hdf5.py")
TRAIN, TEST, SIDE, CLASSES = 96, 32, 6, 4


def idx_bytes(array, type_code):
    """An IDX file's bytes: two zero bytes, the type code, the dimension count, the sizes as
    big-endian 32-bit integers, then the elements big-endian."""
    header = bytes([0, 0, type_code, array.ndim]) + b"".join(int(n).to_bytes(4, "big") for n in array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


class ImageData(TrainingTestCase):
    def make_idx(self, prefix, count, seed, zipped):
        """Images whose brightness pattern depends on the class, and their labels."""
        generator = np.random.default_rng(seed)
        labels = generator.integers(0, CLASSES, count).astype(np.uint8)
        images = generator.integers(0, 120, (count, SIDE, SIDE)).astype(np.uint8)
        for image, label in zip(images, labels):
            image[label, :] += 120  # a bright row per class: learnable
        paths = []
        for name, array, code in ((f"{prefix}-images", images, 0x08), (f"{prefix}-labels", labels, 0x08)):
            data = idx_bytes(array, code)
            path = self.path(name + (".gz" if zipped else ""))
            with (gzip.open(path, "wb") if zipped else open(path, "wb")) as handle:
                handle.write(data)
            paths.append(path)
        return paths, images, labels

    def convert(self, *arguments):
        return subprocess.run([sys.executable, CONVERTER] + list(arguments), capture_output=True, text=True)

    def test_converted_images_train_alike_in_every_layout(self):
        (train_images, train_labels), images, labels = self.make_idx("train", TRAIN, 1, zipped=True)
        (test_images, test_labels), held_images, held_labels = self.make_idx("t10k", TEST, 2, zipped=False)
        data = self.path("images.h5")
        result = self.convert("--images", train_images, "--labels", train_labels, "--test-images", test_images,
                              "--test-labels", test_labels, "--output", data)
        self.assertEqual(result.returncode, 0, result.stderr)
        with h5py.File(data, "r") as file:
            self.assertEqual(file["x"].dtype, np.uint8)
            np.testing.assert_array_equal(file["x"][()], images.reshape(TRAIN, SIDE * SIDE))
            np.testing.assert_array_equal(file["y"][()], labels)
            np.testing.assert_array_equal(file["x_test"][()], held_images.reshape(TEST, SIDE * SIDE))
            np.testing.assert_array_equal(file["y_test"][()], held_labels)
            self.assertAlmostEqual(float(file["x"].attrs["scale"]), 1 / 255)
            self.assertEqual(float(file["x"].attrs["offset"]), 0.0)

        arguments = ["--dataset", "hdf5", "--data-path", data, "--layers", 3, "--hidden", 16, "--global-batch", 16,
                     "--steps", 12, "--eval-every", 6, "--shuffle", "--lr", "1e-2", "--log-every", 0]
        reference, _, weights = self.train("one", arguments)
        evaluated = [step for step in reference if "eval_accuracy" in step]
        self.assertGreater(evaluated[-1]["eval_accuracy"], 1.5 / CLASSES)  # learns beyond chance
        self.assertLess(reference[-1]["loss"], reference[0]["loss"])
        # Read a batch at a time instead of from memory (the next batch read ahead on another
        # thread, checkpoints written meanwhile): the same numbers, bit for bit.
        from_file, _, _ = self.train("file", arguments + ["--data-memory-mb", 0, "--save-every", 5])
        self.assertEqual([s["loss"] for s in from_file], [s["loss"] for s in reference])
        for ranks, layout in [(2, ["--dp", 2]), (2, ["--tp", 2]), (2, ["--pp", 2, "--micro-batches", 2]),
                              (2, ["--dp", 2, "--zero", 3])]:
            with self.subTest(layout=layout):
                steps, _, tensors = self.train("_".join(map(str, layout)), arguments + layout, ranks)
                self.assert_losses_close(steps, reference)
                self.assert_tensors_close(tensors, weights)

    def test_the_fed_pixels_are_scaled(self):
        """uint8 pixels with the scale 1/255 train exactly as a float file of pixel / 255 does."""
        (train_images, train_labels), images, labels = self.make_idx("train", TRAIN, 3, zipped=False)
        data = self.path("scaled.h5")
        self.assertEqual(self.convert("--images", train_images, "--labels", train_labels, "--output", data).returncode, 0)
        floats = self.path("floats.h5")
        with h5py.File(floats, "w") as file:
            file["x"] = (images.reshape(TRAIN, -1).astype(np.float32) * np.float32(1 / 255))
            file["y"] = labels.astype(np.int64)
        arguments = ["--dataset", "hdf5", "--layers", 2, "--hidden", 8, "--global-batch", 16, "--steps", 4,
                     "--log-every", 0]
        scaled, _, _ = self.train("scaled", arguments + ["--data-path", data])
        divided, _, _ = self.train("divided", arguments + ["--data-path", floats])
        self.assert_losses_close(scaled, divided)

    def test_bad_idx_files_are_named(self):
        (images, labels), _, _ = self.make_idx("bad", 8, 4, zipped=False)
        not_idx = self.path("not-idx")
        with open(not_idx, "wb") as handle:
            handle.write(b"\x89PNG....")
        short = self.path("short")
        with open(images, "rb") as source, open(short, "wb") as handle:
            handle.write(source.read()[:-5])
        (_, other_labels), _, _ = self.make_idx("other", 7, 5, zipped=False)
        for arguments, names in [(["--images", not_idx, "--labels", labels], [not_idx, "not an IDX file"]),
                                 (["--images", short, "--labels", labels], [short, "bytes"]),
                                 (["--images", images, "--labels", other_labels], [other_labels, "7 labels", "8 images"]),
                                 (["--from", self.path("nowhere")], ["nowhere", "train-images-idx3-ubyte"])]:
            with self.subTest(arguments=arguments):
                result = self.convert(*arguments, "--output", self.path("out.h5"))
                self.assertEqual(result.returncode, 2)
                line = result.stderr.strip()
                self.assertEqual(len(line.splitlines()), 1, line)
                for name in names:
                    self.assertIn(name, line)
                self.assertFalse(os.path.exists(self.path("out.h5")))


if __name__ == "__main__":
    unittest.main()
