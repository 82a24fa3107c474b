// Each strategy below the end-to-end runs, at whatever world size mpiexec gives: the model built as
// a run builds it, one step through the schedule executor, every element a rank updates held
// against one process fed the whole global batch. Data parallelism's buckets sum every replica's
// gradients; ZeRO's units shard, reduce-scatter and gather them back after the update; the
// pipeline's transfers carry activations and gradients between stages; the expert exchange moves
// rows to the experts' ranks and back; tensor parallelism's f and g sum partial products.
#include <gtest/gtest.h>
#include <mpi.h>

#include <cmath>

#include "strategies/zero/zero_options.hpp"
#include "tests/strategies/replica.hpp"

using namespace mlptrain;
using namespace mlptrain::test;

namespace {

int world_size() {
  int size = 1;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// The one-process model of `layout`: the same model and batch, no parallelism.
Replica whole_of(const Config& layout) {
  Config whole = layout;
  whole.grid.tp = whole.grid.pp = whole.grid.ep = 1;
  whole.strategies = {};
  return Replica(MPI_COMM_SELF, whole);
}

constexpr double tolerance = 1e-5;

// Every gradient this rank updates (after a step) equals the one-process gradient.
void expect_gradients_match(const Replica& split, const Replica& whole) {
  std::int64_t compared = 0;
  split.each_updated([&](const std::string& path, std::int64_t index, float, float grad) {
    ASSERT_NEAR(grad, whole.grad(path, index), tolerance) << path << "[" << index << "]";
    ++compared;
  });
  EXPECT_GT(compared, 0);
}

// Every value this rank holds equals the one-process value.
void expect_values_match(const Replica& split, const Replica& whole) {
  split.each_held([&](const std::string& path, std::int64_t index, float value) {
    ASSERT_NEAR(value, whole.value(path, index), tolerance) << path << "[" << index << "]";
  });
}

// Loss sums over a global batch: equal within the figures' relative tolerance.
void expect_same_loss(double split, double whole) { EXPECT_NEAR(split, whole, tolerance * std::abs(whole)); }

// The step's loss summed over the world (each rank's part where it computes and counts it).
double world_loss(const Replica& replica, double local) {
  const bool counts = replica.model->computes_loss() && replica.groups->place().tp == 0;
  double total = counts ? local : 0.0;
  MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return total;
}

std::int64_t ledger_bytes(const Replica& replica, const char* group, CommOp op) {
  const auto& by_group = replica.ledger.by_group();
  const auto found = by_group.find(group);
  return found == by_group.end() ? 0 : found->second.bytes_of(op);
}

}  // namespace

TEST(Layouts, DataParallelBucketsSumEveryReplica) {
  const Config layout = small_model(2);
  Replica split(MPI_COMM_WORLD, layout), whole = whole_of(layout);
  expect_same_loss(world_loss(split, split.step()), whole.step());
  expect_gradients_match(split, whole);
  // Every gradient is summed once, in buckets of whole layers.
  if (world_size() > 1) {
    EXPECT_EQ(ledger_bytes(split, "dp", CommOp::all_reduce),
              static_cast<std::int64_t>(split.model->parameters->size() * sizeof(float)));
  }
}

// --bucket-mb, set through its declaration as the parser sets it: smaller buckets, more
// all-reduces, the same bytes and the same sums.
TEST(Layouts, DataParallelBucketSizeSplitsTheSameSums) {
  if (world_size() == 1) GTEST_SKIP() << "data parallelism needs two ranks";
  const auto all_reduces = [](double bucket_mb) {
    Config layout = small_model(2);
    for (const StrategyRegistration& strategy : strategy_registry())
      for (const Option& option : strategy.options)
        if (option.name == "bucket-mb") *std::get<double*>(option.field(layout)) = bucket_mb;
    Replica split(MPI_COMM_WORLD, layout), whole = whole_of(layout);
    expect_same_loss(world_loss(split, split.step()), whole.step());
    expect_gradients_match(split, whole);
    const CommTotals& totals = split.ledger.by_group().at("dp");
    return std::pair{totals.calls[static_cast<int>(CommOp::all_reduce)], totals.bytes_of(CommOp::all_reduce)};
  };
  const auto [few, few_bytes] = all_reduces(4);
  const auto [many, many_bytes] = all_reduces(0.0001);  // about 100 bytes: a bucket a layer's tensor
  EXPECT_GT(many, few);
  EXPECT_EQ(many_bytes, few_bytes);
}

TEST(Layouts, ZeroStagesShardAndGatherBackAfterTheUpdate) {
  for (int stage = 1; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    Config layout = small_model(2);
    layout.strategies.get<ZeroOptions>().stage = stage;
    Replica split(MPI_COMM_WORLD, layout), whole = whole_of(layout);
    expect_same_loss(world_loss(split, split.step()), whole.step());
    expect_gradients_match(split, whole);
    split.update();
    whole.update();
    // After the gather (the next forward waits for each unit) every rank holds what it updated
    // and what the others did.
    split.step(1);
    expect_values_match(split, whole);
  }
}

TEST(Layouts, PipelineTransfersCarryActivationsAndGradients) {
  Config layout = small_model(4);
  layout.grid.pp = world_size();
  Replica split(MPI_COMM_WORLD, layout), whole = whole_of(layout);
  expect_same_loss(world_loss(split, split.step()), whole.step());
  expect_gradients_match(split, whole);
  // Four micro-batches cross each boundary twice: activations forward, gradients back.
  const bool first = split.groups->place().pp == 0, last = split.groups->place().pp == layout.grid.pp - 1;
  const std::int64_t boundary_bytes = split.local_rows() * layout.model.hidden * 4;
  EXPECT_EQ(ledger_bytes(split, "pp", CommOp::send), (first ? 0 : 4) * boundary_bytes + (last ? 0 : 4) * boundary_bytes);
  EXPECT_EQ(ledger_bytes(split, "pp", CommOp::recv), ledger_bytes(split, "pp", CommOp::send));
}

TEST(Layouts, ExpertExchangeMovesRowsToTheirExperts) {
  Config layout = small_model(2);
  layout.model.moe_every = 1;
  layout.model.experts = 4 * world_size();
  layout.model.top_k = 2;
  layout.grid.ep = world_size();
  Replica split(MPI_COMM_WORLD, layout), whole = whole_of(layout);
  expect_same_loss(world_loss(split, split.step()), whole.step());
  expect_gradients_match(split, whole);
  if (world_size() > 1) {
    EXPECT_GT(ledger_bytes(split, "ep", CommOp::all_to_all), 0);
  }
}

TEST(Layouts, TensorParallelPairsSumPartialProducts) {
  for (int layers : {4, 5}) {  // pairs only, and a replicated last layer
    Config layout = small_model(2);
    layout.model.layers = layers;
    layout.grid.tp = world_size();
    Replica split(MPI_COMM_WORLD, layout), whole = whole_of(layout);
    expect_same_loss(world_loss(split, split.step()), whole.step());
    expect_gradients_match(split, whole);
    expect_values_match(split, whole);
    if (world_size() > 1) {
      EXPECT_LT(split.model->parameters->size(), whole.model->parameters->size());  // the pairs are split
      EXPECT_GT(ledger_bytes(split, "tp", CommOp::all_reduce), 0);
    }
  }
}

// --fp8 with data parallelism: an operand's amax on each rank becomes the maximum over the
// data-parallel group (the global micro-batch's), element by element, in one all-reduce.
TEST(Layouts, Fp8AmaxIsTheDataGroupsMaximum) {
  if (world_size() == 1) GTEST_SKIP() << "an agreement needs two ranks";
  Config layout = small_model();
  layout.precision.param_dtype = DataType::bfloat16;
  layout.precision.fp8 = Fp8Recipe::rowwise;
  Replica split(MPI_COMM_WORLD, layout);
  auto& hooks = dynamic_cast<LayerHooks&>(split.model->strategies->object("fp8_amax_agreement"));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  // Element e is 1 + 10 e on rank e mod world and half the rank's index elsewhere.
  std::vector<float> amax(7);
  for (std::size_t e = 0; e < amax.size(); ++e)
    amax[e] = static_cast<int>(e) % world_size() == rank ? 1.0f + 10.0f * static_cast<float>(e) : 0.5f * rank;
  const LayerSpec spec{.index = 2, .in_features = 12, .out_features = 7};
  const LayerCall call{.layer = 2, .micro_batch = 0, .micro_batches = 1, .training = true,
                       .activation_type = DataType::bfloat16, .spec = spec};
  // The weight gradient's d pre, one scale per column (a row's own scale would not be agreed).
  hooks.agree_operand_amax(OperandAmax{call, {Fp8Operand::output_grad, Fp8Scaling::columns, 7}, amax.data()});
  for (std::size_t e = 0; e < amax.size(); ++e)
    EXPECT_EQ(amax[e], std::max(1.0f + 10.0f * static_cast<float>(e), 0.5f * (world_size() - 1))) << e;
  EXPECT_EQ(ledger_bytes(split, "dp", CommOp::all_reduce), static_cast<std::int64_t>(7 * sizeof(float)));
  std::vector<float> own_rows(3, static_cast<float>(rank));
  hooks.agree_operand_amax(OperandAmax{call, {Fp8Operand::output_grad, Fp8Scaling::rows, 3}, own_rows.data()});
  EXPECT_EQ(own_rows, std::vector<float>(3, static_cast<float>(rank)));
}

// --fp8 with tensor parallelism: a scale whose elements the split cuts through is maximized over
// the tensor group; one whose elements lie on one rank (a row of W that a column-parallel rank
// holds whole, d pre that every rank of a row-parallel layer holds whole) is not.
TEST(Layouts, Fp8AmaxIsAgreedWhereTheTensorSplitCutsAScale) {
  if (world_size() == 1) GTEST_SKIP() << "an agreement needs two ranks";
  Config layout = small_model();
  layout.precision.param_dtype = DataType::bfloat16;
  layout.precision.fp8 = Fp8Recipe::rowwise;
  layout.grid.tp = world_size();
  Replica split(MPI_COMM_WORLD, layout);
  auto& hooks = dynamic_cast<LayerHooks&>(split.model->strategies->object("tensor_parallel"));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  const auto agreed = [&](int layer, Fp8Operand operand, Fp8Scaling scaling) {
    const LayerSpec spec{.index = layer, .in_features = 12, .out_features = 12};
    const LayerCall call{.layer = layer, .micro_batch = 0, .micro_batches = 1, .training = true,
                         .activation_type = DataType::bfloat16, .spec = spec};
    float amax = static_cast<float>(rank + 1);
    hooks.agree_operand_amax(OperandAmax{call, {operand, scaling, 1}, &amax});
    int everywhere = amax == static_cast<float>(world_size()) ? 1 : 0;  // rank 0 held 1: the maximum reached it
    MPI_Allreduce(MPI_IN_PLACE, &everywhere, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return everywhere == 1;
  };
  // Layer 0 is column-parallel (W split by rows), layer 1 row-parallel (W and its input by columns).
  EXPECT_TRUE(agreed(0, Fp8Operand::weight, Fp8Scaling::tensor));
  EXPECT_TRUE(agreed(0, Fp8Operand::weight, Fp8Scaling::columns));
  EXPECT_FALSE(agreed(0, Fp8Operand::weight, Fp8Scaling::rows));
  EXPECT_TRUE(agreed(0, Fp8Operand::output_grad, Fp8Scaling::rows));
  EXPECT_FALSE(agreed(0, Fp8Operand::output_grad, Fp8Scaling::columns));
  EXPECT_FALSE(agreed(0, Fp8Operand::input, Fp8Scaling::tensor));
  EXPECT_TRUE(agreed(1, Fp8Operand::weight, Fp8Scaling::rows));
  EXPECT_TRUE(agreed(1, Fp8Operand::input, Fp8Scaling::tensor));
  EXPECT_FALSE(agreed(1, Fp8Operand::input, Fp8Scaling::columns));
  EXPECT_FALSE(agreed(1, Fp8Operand::output_grad, Fp8Scaling::tensor));
}
