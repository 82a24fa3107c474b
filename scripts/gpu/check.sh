#!/usr/bin/env bash
# Every GPU check of mlptrain in one go, on a GPU machine that has CUDA, NCCL, Python with numpy
# (and PyTorch for the speed comparison) but none of MPICH, parallel HDF5, Boost or oneDNN: those
# come unpacked from gpu-bundle/root.tar.xz (made by scripts/gpu/bundle.sh on a Debian 12
# machine), into gpu-bundle/root and never into /. It builds into build-gpu/ with the CUDA
# backend, then runs each check with its own log and writes everything to one folder:
#   machine.txt     the GPU, driver, CUDA, compiler, Python and the bundle's own launcher
#   <check>.log     each check's output; summary.txt one line per check: ok or FAILED (exit code)
#   results/        bench.py's step.json, kernels.json, staging.json and commbench.json, the
#                   planner's calibration rows, plans and plan_vs_measured.json, and the
#                   profile's kernel tables of a bf16 and an fp8 tensorwise step,
#                   kernels_ncu.json and kernels_ncu_fp8.json (scripts/gpu/ncu_kernels.py)
# Checks: build, cuda_kernels (test_cuda_kernels), device (tests/integration/test_device.py:
# every layout on CUDA against the CPU, host-staged MPI at 2 and 4 ranks sharing the GPU, NCCL at
# one rank, offloaded update, checkpoints across devices), offload, commbench (mpi-staged and
# NCCL, exact results), precision_reference and fp8_reference (bf16 and fp8 layouts on the GPU
# against the NumPy references), bench (scripts/gpu/bench.py), planner (mlpplan calibrated on the
# GPU, against bench's step and against layouts at two ranks sharing the GPU,
# scripts/gpu/plan_vs_layouts.py), staging (scripts/bench/staging.py at 2 and 4 ranks sharing the
# GPU, a traced --dp 2 step, layouts at 4 ranks planned and measured). A failing check does not
# stop the others.
#
# usage: scripts/gpu/check.sh [--output DIR] [PHASE...]
#   DIR defaults to $OUT (the device tool's folder) or results/gpu/check; PHASEs are any of build
#   tests bench planner staging profile (default: all six), so a session can split the work over
#   several runs.
set -uo pipefail
cd "$(dirname "$0")/../.."
top=$PWD
output=${OUT:-results/gpu/check}
phases=()
while [ $# -gt 0 ]; do
  case "$1" in
    --output) output=${2:?--output needs a folder}; shift 2 ;;
    build|tests|bench|planner|staging|profile) phases+=("$1"); shift ;;
    *) echo "check: unknown argument '$1' (usage: scripts/gpu/check.sh [--output DIR] [build] [tests] [bench] [planner] [staging] [profile])" >&2; exit 2 ;;
  esac
done
[ ${#phases[@]} -gt 0 ] || phases=(build tests bench planner staging profile)
mkdir -p "$output"
output=$(cd "$output" && pwd)
summary="$output/summary.txt"
: >"$summary"  # this run's verdicts only

# The bundle's libraries, programs and build files ahead of the system's.
root="$top/gpu-bundle/root"
if [ ! -d "$root" ]; then
  [ -f gpu-bundle/root.tar.xz ] || { echo "check: gpu-bundle/root.tar.xz is missing: run scripts/gpu/bundle.sh on a Debian 12 machine first" >&2; exit 2; }
  tar -C gpu-bundle -xJf gpu-bundle/root.tar.xz
fi
libraries="$root/usr/lib/x86_64-linux-gnu"
export PATH="$root/usr/bin:/usr/local/cuda/bin:$PATH"
export LD_LIBRARY_PATH="$libraries:$libraries/hdf5/mpich:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export PKG_CONFIG_SYSROOT_DIR="$root"
export PKG_CONFIG_LIBDIR="$libraries/pkgconfig:$root/usr/share/pkgconfig"
export CPATH="$root/usr/include:$root/usr/include/x86_64-linux-gnu${CPATH:+:$CPATH}"
# GCC reads LIBRARY_PATH entries with the multiarch directory appended (usr/lib -> usr/lib/x86_64-linux-gnu).
export LIBRARY_PATH="$root/usr/lib:$libraries${LIBRARY_PATH:+:$LIBRARY_PATH}"
export BOOST_ROOT="$root/usr" BOOST_INCLUDEDIR="$root/usr/include" BOOST_LIBRARYDIR="$libraries"
export UCX_MODULE_DIR="$libraries/ucx"
export CMAKE_PREFIX_PATH="$root/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"

# A Python that has numpy runs the tests and benchmarks.
python=""
for candidate in python3 /usr/bin/python3 python; do
  if command -v "$candidate" >/dev/null && "$candidate" -c "import numpy" 2>/dev/null; then
    python=$(command -v "$candidate")
    break
  fi
done

# NCCL sits beside nvcc on some machines; on others only PyTorch's wheel (nvidia/nccl) brings it,
# with its header but without the unversioned libnccl.so the build's find_library asks for.
nccl_note="beside nvcc"
if ! ls /usr/local/cuda/lib*/libnccl.so >/dev/null 2>&1 && [ -n "$python" ]; then
  wheel=$("$python" -c "import nvidia.nccl as n; print(list(n.__path__)[0])" 2>/dev/null)
  if [ -n "$wheel" ] && [ -f "$wheel/include/nccl.h" ] && [ -e "$wheel/lib/libnccl.so.2" ]; then
    mkdir -p "$root/nccl"
    ln -sf "$wheel/lib/libnccl.so.2" "$root/nccl/libnccl.so"
    export LIBRARY_PATH="$root/nccl:$wheel/lib:$LIBRARY_PATH" CPATH="$wheel/include:$CPATH"
    export LD_LIBRARY_PATH="$wheel/lib:$LD_LIBRARY_PATH"
    nccl_note="from PyTorch's wheel in $wheel"
  else
    nccl_note="not found: --comm nccl is refused"
  fi
fi

# Runs one check: its output into NAME.log, its verdict into summary.txt.
check() {
  local name=$1
  shift
  local start=$SECONDS
  "$@" >"$output/$name.log" 2>&1
  local code=$?
  local verdict="ok"
  [ $code -eq 77 ] && verdict="skipped (exit 77: no GPU)"
  [ $code -eq 0 ] || [ $code -eq 77 ] || verdict="FAILED (exit $code)"
  printf '%-14s %s, %d s\n' "$name" "$verdict" $((SECONDS - start)) | tee -a "$summary"
  return $code
}

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>&1 | sed 's/^/gpu: /'
  nvcc --version 2>&1 | tail -n 1 | sed 's/^/nvcc: /'
  echo "c++: $(c++ --version 2>&1 | head -n 1)"
  echo "glibc: $(ldd --version 2>&1 | head -n 1)"
  echo "os: $(. /etc/os-release 2>/dev/null && echo "$PRETTY_NAME")"
  echo "cores: $(nproc)"
  echo "nccl: $nccl_note"
  echo "python: ${python:-none with numpy} $("${python:-true}" --version 2>&1)"
  "${python:-true}" -c "import torch; print('torch:', torch.__version__, torch.version.cuda)" 2>&1 | tail -n 1
  "${python:-true}" -c "import h5py; print('h5py:', h5py.__version__)" 2>/dev/null || echo "h5py: none (checkpoints read with h5ls/h5dump)"
  echo "meson: $(meson --version 2>&1)"
  h5ls --version 2>&1 | head -n 1 | sed 's/^/h5ls: /'
  mpiexec.mpich -n 1 echo "mpiexec.mpich: the bundle's launcher starts a process" 2>&1 | tail -n 1
} >"$output/machine.txt"
cat "$output/machine.txt"

for phase in "${phases[@]}"; do
  case "$phase" in
    build)
      [ -f build-gpu/build.ninja ] ||
        check setup meson setup build-gpu --buildtype=release -Dcuda=enabled -Dtests=true
      check build ninja -C build-gpu
      ;;
    tests)
      export MLPTRAIN="$top/build-gpu/mlptrain" MLPTRAIN_SOURCE="$top" PYTHONDONTWRITEBYTECODE=1
      check cuda_kernels build-gpu/tests/test_cuda_kernels
      # The GPU's layouts against the NumPy references of the precision contract (bf16, fp8),
      # then every layout on the GPU against the CPU.
      if [ -n "$python" ]; then
        check precision_reference "$python" tests/integration/test_precision_reference.py -v \
          PrecisionReference.test_bf16_layouts_on_the_gpu_follow_the_contract
        check fp8_reference "$python" tests/integration/test_fp8_reference.py -v \
          Fp8Reference.test_layouts_on_the_gpu_follow_the_contract
      fi
      for test in device offload commbench; do
        if [ -n "$python" ]; then
          check "$test" "$python" tests/integration/test_$test.py -v
        else
          echo "$test: FAILED (no Python with numpy to run tests/integration/test_$test.py)" | tee -a "$summary"
        fi
      done
      ;;
    bench)
      export MLPTRAIN="$top/build-gpu/mlptrain"
      if [ -n "$python" ]; then
        # GPU_BENCH_ARGS picks parts for a short loan, e.g. "--parts step" or "--parts staging --world-sizes 1,2".
        # shellcheck disable=SC2086
        check bench "$python" scripts/gpu/bench.py --output-dir "$output/results" ${GPU_BENCH_ARGS:-}
      else
        echo "bench: FAILED (no Python with numpy to run scripts/gpu/bench.py)" | tee -a "$summary"
      fi
      ;;
    planner)
      # mlpplan calibrated on this GPU (layerbench's rows at the benchmark's layer, TF32's too,
      # with the GEMMs of a 16-layer step's sequence back to back, whose rate the plan takes;
      # one rank needs no commbench rows), then its plan of bench.py's step in each precision:
      # results/planner_<precision>.json, and against bench.py's measured step.json
      # results/plan_vs_measured.json (scripts/gpu/plan_vs_step.py).
      mkdir -p "$output/results"
      rows="$output/results/planner_calibration.jsonl"
      check planner_calibration sh -c "build-gpu/layerbench 8192 8192 8192 5 --device cuda --dtype fp32,bf16 \
          --sequence 16 --optimizer-parameters 268435456 > '$rows' && build-gpu/layerbench 8192 8192 8192 5 \
          --device cuda --dtype fp32 --tf32 --sequence 16 --optimizer-parameters 268435456 >> '$rows'"
      for precision in fp32 tf32 bf16; do
        flags=""
        [ "$precision" = tf32 ] && flags="--tf32"
        [ "$precision" = bf16 ] && flags="--param-dtype bf16"
        # shellcheck disable=SC2086
        check "planner_$precision" sh -c "build-gpu/mlpplan --world 1 --device cuda --comm nccl --calibrate '$rows' \
            --dataset mixture --layers 16 --hidden 8192 --input-dim 8192 --output-dim 10 --global-batch 8192 \
            $flags --json > '$output/results/planner_$precision.json'"
      done
      # Beside the step bench.py measured in this folder (its bench phase), where it did.
      if [ -f "$output/results/step.json" ]; then
        check plan_vs_step "${python:-python3}" scripts/gpu/plan_vs_step.py "$output/results"
      fi
      # Layouts of one process and of two ranks sharing the GPU over host-staged MPI, each
      # planned from a calibration of its own shapes and held against its measured step.
      MLPTRAIN="$top/build-gpu/mlptrain" check plan_vs_layouts "${python:-python3}" scripts/gpu/plan_vs_layouts.py \
        --output-dir "$output/results"
      ;;
    staging)
      # Host staging on the GPU: every collective, blocking and started, host-staged at 2 and 4
      # ranks sharing the GPU against the same collective on host memory and against its bound
      # (scripts/bench/staging.py: results/staging_cuda_<ranks>_ranks.json); a traced step of
      # --dp 2 whose collectives track shows the reductions beside the backward; and layouts of
      # 4 ranks planned against their steps (results/plan_vs_layouts_4_ranks.json).
      export MLPTRAIN="$top/build-gpu/mlptrain"
      mkdir -p "$output/results"
      for ranks in 2 4; do
        check "staging_$ranks" "${python:-python3}" scripts/bench/staging.py --device cuda --ranks "$ranks" \
          --output-dir "$output/results"
      done
      check staging_trace mpiexec.mpich -n 2 build-gpu/mlptrain --dp 2 --dataset mixture --layers 8 --hidden 4096 \
        --input-dim 4096 --output-dim 10 --global-batch 8192 --steps 4 --device cuda --log-every 0 \
        --trace "$output/results/trace_dp2.json" --metrics "$output/results/trace_dp2_metrics.jsonl"
      check plan_vs_layouts_4 "${python:-python3}" scripts/gpu/plan_vs_layouts.py --ranks 4 \
        --output-dir "$output/results"
      ;;
    profile)
      if ! command -v ncu >/dev/null; then
        echo "profile        skipped (no ncu)" | tee -a "$summary"
        continue
      fi
      mkdir -p "$output/results"
      # A device copy's rate beside it (layerbench's kernel table), then a window of launches
      # from the second step on: a step of 16 layers launches about 110 kernels, so 250 hold two
      # updates, and the table covers the launches between them, one whole step.
      check copy_rate sh -c "build-gpu/layerbench 8192 8192 8192 3 --device cuda --dtype bf16 > '$output/layerbench_bf16.json'"
      # The bf16 step, and the fp8 tensorwise step beside it (about 30 launches a layer: more
      # skipped and counted to hold two updates), trained as bench.py trains the model.
      copy_gbps=$("${python:-python3}" -c "import json, sys; rows = json.load(open(sys.argv[1]))['kernel_table']
print(next(r['gbytes_per_s'] / r['of_copy_rate'] for r in rows if r['kernel'] == 'gelu_forward'))" "$output/layerbench_bf16.json")
      for profiled in "bf16::${PROFILE_SKIP:-200}:${PROFILE_COUNT:-250}" \
                      "fp8:--fp8 tensorwise:${PROFILE_FP8_SKIP:-800}:${PROFILE_FP8_COUNT:-1000}"; do
        IFS=: read -r name flags skip count <<<"$profiled"
        suffix=${name/bf16/}
        check "profile${suffix:+_$suffix}" sh -c "ncu --clock-control none --csv --print-units base \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum \
            --launch-skip $skip --launch-count $count build-gpu/mlptrain --dataset mixture \
            --layers 16 --hidden 8192 --input-dim 8192 --output-dim 10 --global-batch 8192 --steps 5 \
            --param-dtype bf16 $flags --lr 0.000122 --warmup-steps 10 --grad-clip 1 --device cuda --log-every 0 \
            > '$output/profile${suffix:+_$suffix}.csv'"
        check "kernel_table${suffix:+_$suffix}" "${python:-python3}" scripts/gpu/ncu_kernels.py \
          "$output/profile${suffix:+_$suffix}.csv" --copy-gbps "$copy_gbps" \
          --output "$output/results/kernels_ncu${suffix:+_$suffix}.json"
      done
      ;;
  esac
done
echo "check: logs and results in $output"
! grep -q FAILED "$summary"
