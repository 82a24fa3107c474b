// The loop's seam, pinned down with strategies of the test's own: the order in which the runner
// and the executor call every hook over a step (with and without recomputation), and a strategy
// that substitutes a layer's input and row count, which the runner must honour in forward,
// backward and recomputation; and under --fp8, which amax the products take and agree on (each
// once: the weight's once a step). Each rank runs its own one-process model.
#include <gtest/gtest.h>
#include <mpi.h>

#include <map>

#include "tests/strategies/replica.hpp"

using namespace mlptrain;
using namespace mlptrain::test;

namespace {

// Records every hook call as "name layer micro-batch" ("forward*" when recomputing).
class HookRecorder final : public Strategy, public LayerHooks {
 public:
  explicit HookRecorder(const StrategyContext&) {}
  std::vector<std::string> calls;

  void before_step(const StepEvent&) override { calls.push_back("step"); }
  void before_layer_forward(ForwardStart& event) override { add(event.recomputing ? "forward*" : "forward", event); }
  void after_layer_matmul(const ForwardProduct& event) override { add("matmul", event); }
  void after_layer_forward(const ForwardDone& event) override { add("forwarded", event); }
  void before_layer_backward(BackwardStart& event) override { add("backward", event); }
  void after_layer_backward(const BackwardDone& event) override { add("backwarded", event); }
  void synchronize_gradients(const StepEvent&) override { calls.push_back("synchronize"); }

 private:
  void add(const std::string& name, const LayerCall& event) {
    calls.push_back(name + " " + std::to_string(event.layer) + " " + std::to_string(event.micro_batch));
  }
};

bool always(const Config&, const GridShape&) { return true; }

const StrategyRegistration recorder = register_strategy<HookRecorder>({.name = "hook_recorder", .wanted = always});

// Computes layer 1 on every row twice (its input duplicated: 2R rows) and layer 2 on the mean of
// the two copies (back to R rows): the same function and gradients as the plain model, with the
// row counts changed through the seam in both directions.
class RowDoubling final : public Strategy, public LayerHooks {
 public:
  explicit RowDoubling(const StrategyContext& context) : allocator_(context.allocator) {}

  void before_layer_forward(ForwardStart& event) override {
    if (const float* input = substitute(event, event.input, event.rows, false))
      event.substitute_input(input, layer_rows(event.layer, event.rows));
  }
  void after_layer_forward(const ForwardDone& event) override { buffers_.erase(key(event)); }
  void before_layer_backward(BackwardStart& event) override {
    if (const float* input = substitute(event, *event.input, event.rows, true))
      event.substitute_input(input, buffers_.at(key(event)).grad.floats());
  }
  void after_layer_backward(const BackwardDone& event) override {
    if (event.layer != 1 && event.layer != 2) return;
    Buffers& buffers = buffers_.at(key(event));
    const float* scratch = buffers.grad.floats();
    const std::int64_t in = event.spec.in_features, rows = event.rows;
    for (std::int64_t row = 0; row < rows; ++row)
      for (std::int64_t column = 0; column < in; ++column) {
        float& out = static_cast<float*>(event.input_gradient->destination)[row * in + column];
        if (event.layer == 1) {  // the input was copied twice: its gradient sums both copies
          out = scratch[row * in + column] + scratch[(row + rows) * in + column];
        } else {  // layer 2 averaged two copies: each receives half the gradient
          out = 0.5f * scratch[(row % (rows / 2)) * in + column];
        }
      }
    buffers_.erase(key(event));
  }

 private:
  struct Buffers {
    Buffer input, grad;
  };
  static int key(const LayerCall& event) { return event.layer * 1000 + event.micro_batch; }

  static std::int64_t layer_rows(int layer, std::int64_t rows) { return layer == 1 ? 2 * rows : rows / 2; }

  // The doubled (layer 1) or averaged (layer 2) input of the `rows` received in `received`;
  // null for the other layers.
  const float* substitute(const LayerCall& event, const void* received_rows, std::int64_t rows, bool backward) {
    if (event.layer != 1 && event.layer != 2) return nullptr;
    const std::int64_t in = event.spec.in_features;
    const std::int64_t layer_rows = RowDoubling::layer_rows(event.layer, rows);
    Buffers& buffers = buffers_[key(event)];
    buffers.input = allocator_.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(layer_rows * in));
    float* input = buffers.input.floats();
    const auto* received = static_cast<const float*>(received_rows);  // the test runs in fp32
    for (std::int64_t row = 0; row < layer_rows; ++row)
      for (std::int64_t column = 0; column < in; ++column)
        input[row * in + column] = event.layer == 1 ? received[(row % rows) * in + column]
                                                    : 0.5f * (received[row * in + column] +
                                                              received[(row + layer_rows) * in + column]);
    if (backward)
      buffers.grad = allocator_.allocate_floats(MemoryState::workspace, static_cast<std::size_t>(layer_rows * in));
    return input;
  }

  Allocator& allocator_;
  std::map<int, Buffers> buffers_;
};

const StrategyRegistration doubling = register_strategy<RowDoubling>({.name = "row_doubling", .wanted = always});

Config three_layers(bool recompute) {
  Config config = small_model(2);
  config.model.layers = 3;
  config.training.recompute = recompute;
  return config;
}

std::vector<std::string> expected_calls(bool recompute) {
  std::vector<std::string> calls = {"step"};
  const auto add = [&](const std::string& name, int layer, int micro_batch) {
    calls.push_back(name + " " + std::to_string(layer) + " " + std::to_string(micro_batch));
  };
  for (int micro_batch = 0; micro_batch < 2; ++micro_batch) {
    for (int layer = 0; layer < 3; ++layer)
      for (const char* name : {"forward", "matmul", "forwarded"}) add(name, layer, micro_batch);
    for (int layer = 2; layer >= 0; --layer) {
      // Recomputation (segments of one layer here) runs the GELU layers forward again first.
      if (recompute && layer < 2)
        for (const char* name : {"forward*", "matmul", "forwarded"}) add(name, layer, micro_batch);
      add("backward", layer, micro_batch);
      add("backwarded", layer, micro_batch);
    }
  }
  calls.push_back("synchronize");
  return calls;
}

}  // namespace

TEST(Hooks, RunnerAndExecutorCallThemInOrder) {
  for (bool recompute : {false, true}) {
    Replica replica(MPI_COMM_SELF, three_layers(recompute), Strategies{&recorder});
    replica.step();
    const auto& calls = dynamic_cast<HookRecorder&>(replica.model->strategies->object("hook_recorder")).calls;
    EXPECT_EQ(calls, expected_calls(recompute)) << (recompute ? "with" : "without") << " recomputation";
  }
}

TEST(Hooks, SubstitutedRowsAreHonouredInForwardBackwardAndRecomputation) {
  for (bool recompute : {false, true}) {
    SCOPED_TRACE(recompute ? "with recomputation" : "without");
    Config config = three_layers(recompute);
    config.model.layers = 4;
    Replica doubled(MPI_COMM_SELF, config, Strategies{&doubling}), plain(MPI_COMM_SELF, config);
    const double doubled_loss = doubled.step(), plain_loss = plain.step();
    EXPECT_NEAR(doubled_loss, plain_loss, 1e-5 * plain_loss);
    doubled.each_updated([&](const std::string& path, std::int64_t index, float, float grad) {
      ASSERT_NEAR(grad, plain.grad(path, index), 1e-5) << path << "[" << index << "]";
    });
    // Layer 1's outputs were allocated for twice the rows.
    EXPECT_GT(doubled.memory.peak(MemoryState::activations), plain.memory.peak(MemoryState::activations));
  }
}

namespace {

// Counts the fp8 amax agreements of a step by operand and scaling, and at which micro-batches
// the weight's happen.
class AmaxRecorder final : public Strategy, public LayerHooks {
 public:
  explicit AmaxRecorder(const StrategyContext&) {}
  std::map<std::pair<Fp8Operand, Fp8Scaling>, int> agreements;
  std::vector<int> weight_micro_batches;

  void agree_operand_amax(const OperandAmax& event) override {
    ++agreements[{event.scales.operand, event.scales.scaling}];
    if (event.scales.operand == Fp8Operand::weight) weight_micro_batches.push_back(event.micro_batch);
  }
};

const StrategyRegistration amax_recorder = register_strategy<AmaxRecorder>({.name = "amax_recorder", .wanted = always});

}  // namespace

// Three dense layers, two micro-batches, counted from the contract (DESIGN.md §2.7): tensorwise,
// the weight is coded once a step (one agreement a layer, at micro-batch 0), x agreed by each
// forward (the weight gradient reuses it) and d(pre) by its first product (the input gradient;
// the first layer's weight gradient): 3 + 6 + 6. Rowwise scales x and d(pre) by rows in one
// product and by columns in the other, the weight by rows and by columns (both once a step).
// Recomputation's forwards agree x again, never the weight.
TEST(Hooks, Fp8ProductsAgreeEachAmaxOnce) {
  struct Case {
    Fp8Recipe recipe;
    bool recompute;
    std::map<std::pair<Fp8Operand, Fp8Scaling>, int> expected;
  };
  using O = Fp8Operand;
  using S = Fp8Scaling;
  const Case cases[] = {
      {Fp8Recipe::tensorwise, false, {{{O::weight, S::tensor}, 3}, {{O::input, S::tensor}, 6}, {{O::output_grad, S::tensor}, 6}}},
      {Fp8Recipe::rowwise, false,
       {{{O::weight, S::rows}, 3}, {{O::weight, S::columns}, 3}, {{O::input, S::rows}, 6}, {{O::input, S::columns}, 6},
        {{O::output_grad, S::rows}, 4}, {{O::output_grad, S::columns}, 6}}},
      // Segments of one layer: the backward recomputes layers 1 and 2 (the first keeps its input).
      {Fp8Recipe::tensorwise, true, {{{O::weight, S::tensor}, 3}, {{O::input, S::tensor}, 10}, {{O::output_grad, S::tensor}, 6}}},
  };
  for (const Case& test : cases) {
    Config config = three_layers(test.recompute);
    config.precision.param_dtype = DataType::bfloat16;
    config.precision.fp8 = test.recipe;
    Replica replica(MPI_COMM_SELF, config, Strategies{&amax_recorder});
    auto& recorder = dynamic_cast<AmaxRecorder&>(replica.model->strategies->object("amax_recorder"));
    replica.step();
    EXPECT_EQ(recorder.agreements, test.expected) << choice_name(test.recipe) << (test.recompute ? " recompute" : "");
    EXPECT_EQ(recorder.weight_micro_batches, std::vector<int>(recorder.weight_micro_batches.size(), 0));
  }
}
