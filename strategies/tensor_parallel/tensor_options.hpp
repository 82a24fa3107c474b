// Tensor parallelism's own options, declared by its registration (tensor_parallel.cpp) and kept in
// the run's configuration as this block.
#pragma once

namespace mlptrain {

struct TensorParallelOptions {
  bool sequence_parallel = false;  // --sequence-parallel: split the rows the group replicates
};

}  // namespace mlptrain
