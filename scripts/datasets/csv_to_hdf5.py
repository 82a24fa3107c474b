#!/usr/bin/python3
"""Convert a CSV file (one sample per row: feature columns, then an integer class label) into the
HDF5 layout `mlptrain --dataset hdf5` reads: /x float32 [N, D], /y int64 [N], and with
--test-fraction a held-out /x_test, /y_test. Rows are shuffled with --seed before the split.
Gzipped input (.gz) is read directly; a first line that is not numeric is taken as a header."""
import argparse
import gzip
import sys

import h5py
import numpy as np


def read_rows(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as handle:
        lines = [line.strip() for line in handle if line.strip()]
    if not lines:
        sys.exit(f"csv_to_hdf5: {path} is empty")
    try:
        [float(value) for value in lines[0].split(",")]
    except ValueError:
        lines = lines[1:]  # a header
    try:
        return np.array([[float(value) for value in line.split(",")] for line in lines])
    except ValueError as error:
        sys.exit(f"csv_to_hdf5: {path}: {error}")


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("csv", help="input CSV (.csv or .csv.gz)")
    parser.add_argument("output", help="output HDF5 file")
    parser.add_argument("--test-fraction", type=float, default=0.0,
                        help="fraction of rows held out as /x_test, /y_test")
    parser.add_argument("--standardize", action="store_true",
                        help="scale each feature to zero mean and unit variance (train statistics)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the row shuffle")
    args = parser.parse_args()

    rows = read_rows(args.csv)
    if rows.ndim != 2 or rows.shape[1] < 2:
        sys.exit(f"csv_to_hdf5: {args.csv} needs at least one feature column and a label column")
    features = rows[:, :-1].astype(np.float32)
    labels = rows[:, -1]
    if np.any(labels != np.round(labels)) or np.any(labels < 0):
        sys.exit(f"csv_to_hdf5: the last column of {args.csv} must hold non-negative integer labels")
    labels = labels.astype(np.int64)
    order = np.random.default_rng(args.seed).permutation(len(rows))
    features, labels = features[order], labels[order]
    test_count = int(round(args.test_fraction * len(rows)))
    train_count = len(rows) - test_count
    if train_count < 1:
        sys.exit("csv_to_hdf5: --test-fraction leaves no training rows")
    if args.standardize:
        mean = features[:train_count].mean(axis=0)
        scale = features[:train_count].std(axis=0)
        scale[scale == 0] = 1.0
        features = ((features - mean) / scale).astype(np.float32)
    with h5py.File(args.output, "w") as output:
        output["x"] = features[:train_count]
        output["y"] = labels[:train_count]
        if test_count:
            output["x_test"] = features[train_count:]
            output["y_test"] = labels[train_count:]
        output.attrs["source"] = args.csv
    print(f"wrote {args.output}: {train_count} train and {test_count} test samples, "
          f"{features.shape[1]} features, {labels.max() + 1} classes")


if __name__ == "__main__":
    main()
