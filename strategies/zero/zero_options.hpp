// ZeRO's own options, declared by its registration (zero.cpp) and kept in the run's configuration
// as this block.
#pragma once

namespace mlptrain {

struct ZeroOptions {
  int stage = 0;       // --zero: 0 (off) to 3
  int shard_size = 0;  // --zero-shard-size: shards over groups of this many data-parallel ranks (0: all)
};

}  // namespace mlptrain
