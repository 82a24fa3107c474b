// mlpplan --calibrate: the machine the bench output was made on, as the cluster to plan for.
#pragma once

#include <string>
#include <vector>

#include "core/config.hpp"
#include "plan/cluster.hpp"

namespace mlptrain {

// This machine, one node, from layerbench output (GEMM rates per dtype; with --sequence, the
// rate of a step's GEMMs over operands of their own; optimizer, elementwise and row-gather
// rates, the last at the elementwise rate where the bench gives none) and commbench --json
// output (latency and bus bandwidth per collective); every file may hold either, one JSON object
// per line. The rows read are those of the planned device: on the CPU (and loopback) the bench's
// CPU rows, rates scaled from its GEMM threads to the machine's cores, which the ranks share,
// collectives of MPI on host memory, device memory the machine's physical memory; on a GPU
// (`device.kind` cuda) its rows (TF32's where `device.tf32`), each rank a GPU of the node's, the
// built-in samples at the device generator's rate, collectives of the planned path (host-staged
// MPI or NCCL), device memory the GPU's.
// A plan of one rank (`world` 1) needs no commbench rows. A CPU's calibration may include a
// calibration run's metrics (mlptrain --metrics): its summary's update time plans the
// optimizer as the loop runs it, in place of layerbench's AdamW.
Cluster calibrated_cluster(const std::vector<std::string>& files, const DeviceConfig& device, int world);

}  // namespace mlptrain
