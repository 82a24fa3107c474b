// MPI's view of the project's types (see mpi_types.hpp).
#include "comm/mpi_types.hpp"

#include <climits>
#include <stdexcept>
#include <string>

#include "core/elements.hpp"
#include "core/error.hpp"

namespace mlptrain {

namespace {

// Sums of 16-bit floats, which MPI has no type for: each pair widened to fp32, added, rounded.
template <typename Element>
void sum_halves(void* in, void* inout, int* length, MPI_Datatype*) {
  const auto* __restrict source = static_cast<const typename Element::Storage*>(in);
  auto* __restrict target = static_cast<typename Element::Storage*>(inout);
  for (int i = 0; i < *length; ++i) target[i] = Element::store(Element::load(target[i]) + Element::load(source[i]));
}

void fill(const std::vector<std::size_t>& counts, std::vector<int>& out_counts, std::vector<int>& out_offsets) {
  std::size_t offset = 0;
  for (std::size_t count : counts) {
    out_counts.push_back(mpi_count(count));
    out_offsets.push_back(mpi_count(offset));
    offset += count;
  }
}

}  // namespace

MpiHalfSums::MpiHalfSums() {
  MPI_Op_create(sum_halves<Bf16>, 1, &bfloat16);
  MPI_Op_create(sum_halves<Fp16>, 1, &float16);
}

MpiHalfSums::~MpiHalfSums() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Op_free(&bfloat16);
  MPI_Op_free(&float16);
}

MPI_Datatype mpi_type(DataType type) {
  switch (type) {
    case DataType::float32: return MPI_FLOAT;
    case DataType::float64: return MPI_DOUBLE;
    case DataType::int32: return MPI_INT32_T;
    case DataType::int64: return MPI_INT64_T;
    case DataType::uint8: return MPI_UINT8_T;
    // 16-bit floats move as their bits; MPI has no arithmetic on them.
    case DataType::bfloat16:
    case DataType::float16: return MPI_UINT16_T;
  }
  return MPI_DATATYPE_NULL;
}

MPI_Op mpi_op(ReduceOp reduce, DataType type, const MpiHalfSums& half_sums) {
  if (is_half(type)) {
    if (reduce != ReduceOp::sum)
      throw std::logic_error("the MPI communicator only sums " + std::string(data_type_name(type)) + " elements");
    return type == DataType::bfloat16 ? half_sums.bfloat16 : half_sums.float16;
  }
  switch (reduce) {
    case ReduceOp::sum: return MPI_SUM;
    case ReduceOp::max: return MPI_MAX;
    case ReduceOp::min: return MPI_MIN;
  }
  return MPI_OP_NULL;
}

int mpi_count(std::size_t count) {
  if (count > static_cast<std::size_t>(INT_MAX))
    throw RuntimeFailure("message of " + std::to_string(count) +
                         " elements exceeds MPI's int count limit");
  return static_cast<int>(count);
}

VariableLayout::VariableLayout(const Operation& operation) {
  fill(operation.send_counts, send_counts, send_offsets);
  fill(operation.receive_counts, receive_counts, receive_offsets);
}

}  // namespace mlptrain
