#!/usr/bin/env bash
# The main job: sets up (installs and builds what is missing), then trains the default model on the
# built-in teacher data with 4 MPI ranks on the CPU. Extra arguments go to mlptrain.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/build/setup.sh
exec mpiexec.mpich -n "${RANKS:-4}" build/mlptrain "$@"
