// A run's element types (DESIGN.md §2.7), named after PyTorch FSDP's mixed-precision policy: the
// compute copy of the parameters and the activations (`param`), and the gradient buffer with its
// data-parallel reductions (`reduce`). AdamW's master weights and moments are fp32 always: with a
// 16-bit param type the optimizer keeps an fp32 master copy of every parameter it updates, and the
// compute copy is the master rounded after every update.
#pragma once

#include <cstddef>

#include "core/data_type.hpp"

namespace mlptrain {

// fp8 GEMMs (§2.7): a Linear layer's three GEMMs take fp8 operands, each scaled from its own
// absolute maximum, over the whole operand (tensorwise) or one per row of the side that is not
// summed over (rowwise).
enum class Fp8Recipe { none, tensorwise, rowwise };
// The 8-bit float formats (core/fp8.hpp): e4m3 for weights and activations, and for gradients
// unless e5m2's range is asked for.
enum class Fp8Format { e4m3, e5m2 };

struct Precision {
  DataType param = DataType::float32;
  DataType reduce = DataType::float32;
  Fp8Recipe fp8 = Fp8Recipe::none;
  Fp8Format fp8_grad_format = Fp8Format::e4m3;
  // fp8 GEMMs on Hopper's tensor cores may keep their partial sums in the tensor cores' own
  // accumulator of about 14 bits instead of moving them into fp32 every 128 terms (faster, less
  // exact: measured on an H200, 2^-7.6 of the terms' magnitudes at k = 4,096 against 2^-9.8).
  bool fp8_fast_accumulation = false;

  bool keeps_master() const { return param != DataType::float32; }
  // fp16 gradients underflow and overflow without a loss scale; bf16's range is fp32's.
  bool scales_loss() const { return param == DataType::float16 || reduce == DataType::float16; }
  std::size_t param_bytes() const { return size_of(param); }
  std::size_t reduce_bytes() const { return size_of(reduce); }
  // Bytes of optimizer state per parameter updated: the moments, and the master copy if kept.
  std::size_t optimizer_bytes() const { return keeps_master() ? 12 : 8; }
  bool fp8_gemms() const { return fp8 != Fp8Recipe::none; }
};

}  // namespace mlptrain
