#!/usr/bin/env bash
# Installs what mlptrain needs on Debian 12 (only the missing packages, with apt-get), and the data
# the pages' examples read, and builds it into build/ (Meson, release). Safe to run again: it only
# does what is not done yet.
set -euo pipefail
cd "$(dirname "$0")/../.."

packages=(
  g++ pkg-config meson ninja-build
  mpich libmpich-dev libhdf5-mpich-dev hdf5-tools
  libboost-program-options-dev libdnnl-dev libgtest-dev
  nlohmann-json3-dev libfmt-dev zlib1g-dev libisal-dev librandom123-dev
  python3 python3-numpy python3-h5py python3-matplotlib
  dataset-fashion-mnist python3-sklearn  # docs/data.md's examples (held to run by the docs test)
  slurm-wlm munge  # a one-node Slurm cluster the requeue test starts (tests/integration/test_slurm.py)
)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
    missing+=("$package")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release >/dev/null
fi
ninja -C build >/dev/null
echo "setup: built build/mlptrain"
