#!/usr/bin/python3
"""Converts images and labels in the IDX format (the MNIST family's: MNIST, Fashion-MNIST,
KMNIST; gzipped or not) into the `hdf5` dataset layout mlptrain reads:

  /x       the training images in their stored type (uint8 for the MNIST family), [N, pixels],
           with the attributes scale and offset: mlptrain feeds x * scale + offset
  /y       the training labels, int32 [N]
  /x_test, /y_test   the same for the test split, where given

Each image is flattened row by row. Images stay one byte a pixel on disk and in memory; the
default scale maps 0..255 to 0..1.

usage: scripts/datasets/idx_to_hdf5.py --from /usr/share/datasets/fashion-mnist --output fashion-mnist.h5
       scripts/datasets/idx_to_hdf5.py --images train-images-idx3-ubyte.gz --labels train-labels-idx1-ubyte.gz \\
           [--test-images ... --test-labels ...] --output out.h5 [--scale S] [--offset O]

A file that is not IDX, is cut short, or whose image and label counts differ ends the script
with one line naming it (exit 2)."""
import argparse
import gzip
import os
import sys

import numpy as np

# The IDX element types, by the third byte of the magic number, as big-endian NumPy types.
IDX_TYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
# The standard file names of the MNIST family in a folder, with or without .gz.
STANDARD = {"images": "train-images-idx3-ubyte", "labels": "train-labels-idx1-ubyte",
            "test_images": "t10k-images-idx3-ubyte", "test_labels": "t10k-labels-idx1-ubyte"}


class BadInput(Exception):
    pass


def read_idx(path):
    """The array an IDX file holds (gzip is recognized by its magic bytes, not the name)."""
    try:
        with open(path, "rb") as raw:
            gzipped = raw.read(2) == b"\x1f\x8b"
        with (gzip.open(path, "rb") if gzipped else open(path, "rb")) as stream:
            data = stream.read()
    except (OSError, EOFError) as error:
        raise BadInput(f"{path}: cannot read ({error})")
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in IDX_TYPES:
        raise BadInput(f"{path}: not an IDX file (its magic number is {data[:4].hex() or 'missing'})")
    dims = data[3]
    header = 4 + 4 * dims
    if dims == 0 or len(data) < header:
        raise BadInput(f"{path}: an IDX header of {dims} dimension(s) is cut short")
    shape = tuple(int.from_bytes(data[4 + 4 * k:8 + 4 * k], "big") for k in range(dims))
    element = np.dtype(IDX_TYPES[data[2]])
    expected = int(np.prod(shape)) * element.itemsize
    if len(data) - header != expected:
        raise BadInput(f"{path}: shape {shape} needs {expected} bytes of data but the file holds "
                       f"{len(data) - header}")
    return np.frombuffer(data, dtype=element, offset=header).reshape(shape).astype(element.newbyteorder("="))


def split(images_path, labels_path):
    """Flattened images and int32 labels of one split, checked against each other."""
    images, labels = read_idx(images_path), read_idx(labels_path)
    if images.ndim < 2:
        raise BadInput(f"{images_path}: images need at least 2 dimensions, the file has {images.ndim}")
    if labels.ndim != 1 or labels.dtype.kind not in "iu":
        raise BadInput(f"{labels_path}: labels must be a 1-D integer array, the file holds {labels.dtype} {labels.shape}")
    if len(images) != len(labels):
        raise BadInput(f"{labels_path}: {len(labels)} labels for the {len(images)} images of {images_path}")
    return images.reshape(len(images), -1), labels.astype(np.int32)


def in_folder(folder, name):
    for candidate in (name + ".gz", name):
        path = os.path.join(folder, candidate)
        if os.path.exists(path):
            return path
    raise BadInput(f"{folder}: has neither {name}.gz nor {name}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--from", dest="folder", help="a folder with the standard MNIST-family file names")
    parser.add_argument("--images", help="training images (IDX)")
    parser.add_argument("--labels", help="training labels (IDX)")
    parser.add_argument("--test-images", help="test images (IDX)")
    parser.add_argument("--test-labels", help="test labels (IDX)")
    parser.add_argument("--output", required=True, help="the HDF5 file to write")
    parser.add_argument("--scale", type=float, default=None,
                        help="the scale attribute (default 1/255 for 8-bit images, else 1)")
    parser.add_argument("--offset", type=float, default=0.0, help="the offset attribute (default 0)")
    args = parser.parse_args()
    try:
        paths = {key: getattr(args, key) for key in STANDARD}
        if args.folder:
            paths = {key: paths[key] or in_folder(args.folder, name) for key, name in STANDARD.items()}
        if not paths["images"] or not paths["labels"]:
            raise BadInput("--images and --labels (or --from FOLDER) are needed")
        if bool(paths["test_images"]) != bool(paths["test_labels"]):
            raise BadInput("--test-images and --test-labels go together")
        splits = {"": split(paths["images"], paths["labels"])}
        if paths["test_images"]:
            splits["_test"] = split(paths["test_images"], paths["test_labels"])
            if splits["_test"][0].shape[1] != splits[""][0].shape[1]:
                raise BadInput(f"{paths['test_images']}: {splits['_test'][0].shape[1]} pixels an image, "
                               f"the training images have {splits[''][0].shape[1]}")
    except BadInput as error:
        print(f"idx_to_hdf5: {error}", file=sys.stderr)
        sys.exit(2)

    import h5py  # only once the input is known to be good
    scale = args.scale if args.scale is not None else (1 / 255 if splits[""][0].dtype == np.uint8 else 1.0)
    temporary = args.output + ".partial"
    with h5py.File(temporary, "w") as output:
        for suffix, (images, labels) in splits.items():
            x = output.create_dataset("x" + suffix, data=images)
            x.attrs["scale"] = np.float64(scale)
            x.attrs["offset"] = np.float64(args.offset)
            output.create_dataset("y" + suffix, data=labels)
    os.replace(temporary, args.output)  # never a half-written file under the name asked for
    summary = ", ".join(f"{'test' if suffix else 'train'} {len(labels)} x {images.shape[1]} {images.dtype}"
                        for suffix, (images, labels) in splits.items())
    classes = int(max(labels.max() for _, labels in splits.values())) + 1
    print(f"idx_to_hdf5: wrote {args.output}: {summary}, {classes} classes, scale {scale:.6g}, offset {args.offset:g}")


if __name__ == "__main__":
    main()
