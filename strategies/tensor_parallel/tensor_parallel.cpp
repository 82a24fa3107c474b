// Tensor parallelism the Megatron-LM way (Shoeybi et al., "Megatron-LM: training multi-billion
// parameter language models using model parallelism", 2019). Consecutive dense layers pair up
// (within each run of dense layers between MoE layers):
//   column-parallel layer (the first of a pair): W split on its output dimension, so each rank computes a
//     slice of the outputs and applies GELU to it, with no communication in forward;
//   row-parallel layer (the next one): W split on its input dimension, so each rank's product is a
//     partial sum of the outputs; the partial sums are all-reduced (Megatron's g) before the bias,
//     which every rank holds whole, is added once. With a 16-bit param type the sum is formed
//     as DESIGN.md §2.7 has it: each rank's partial rounded (what travels), the partials
//     gathered and summed in fp32 in rank order, the bias added to that sum, rounded once (an
//     all-reduce would round the sum before the bias joins it).
// In backward the conjugates: the row-parallel layer's input gradient is already this rank's
// slice (g's backward is the identity), while the column-parallel layer's input gradient is a
// partial sum over the output slices and is all-reduced (f's backward; f's forward is the
// identity). A layer left without a partner (the last of an odd count) is replicated: every rank
// computes the same, and its gradients come out identical without communication. An MoE layer
// (whose input every rank holds whole) splits its experts: each tensor rank holds an equal slice
// of every expert-parallel rank's experts and computes its slice's assignments only, so its
// output is a partial sum, all-reduced once after the layer as a row-parallel layer's is, and its
// input gradient a partial sum, all-reduced as a column-parallel layer's is (the router, held
// whole, contributes its part on one rank; expert parallelism sums the router's probability
// gradients). The sums carry the activations' type (the param type).
//
// Sequence parallelism (--sequence-parallel; Korthikanti et al., "Reducing activation
// recomputation in large transformer models", 2022), on rows since an MLP has no sequence:
// between a layer whose output is summed over the group (row-parallel, MoE) and the next layer
// that starts from the whole input (column-parallel, MoE), every rank would hold the same rows.
// There the sum becomes a reduce-scatter into this rank's block of rows (bias and GELU apply to
// it and it is kept for backward), and the next layer all-gathers the blocks into a transient
// input, again in backward for its weight gradient (as Megatron-LM does, rather than keep it);
// its input gradient is reduce-scattered instead of all-reduced, and the split layer's pre-
// activation gradient is all-gathered before its products' backward. A boundary the pipeline
// cuts, the model's end and evaluation (whose last micro-batch may not split evenly) stay whole.
#include <fmt/format.h>

#include "cost/fp8_products.hpp"
#include "strategies/registration.hpp"
#include "strategies/tensor_parallel/tensor_options.hpp"

namespace mlptrain {

namespace {

bool sequence_parallel(const Config& config) { return config.strategies.get<TensorParallelOptions>().sequence_parallel; }

enum class PairPart { replicated, column, row, experts };  // a layer's part in the pairs

PairPart part_of(int layer, const std::vector<LayerSpec>& model) {
  const auto is_moe = [&](int index) { return model[static_cast<std::size_t>(index)].moe(); };
  if (is_moe(layer)) return PairPart::experts;
  int first_dense = layer;  // of this run of dense layers
  while (first_dense > 0 && !is_moe(first_dense - 1)) --first_dense;
  if ((layer - first_dense) % 2 == 1) return PairPart::row;
  return layer + 1 < static_cast<int>(model.size()) && !is_moe(layer + 1) ? PairPart::column : PairPart::replicated;
}

bool sums_output(PairPart part) { return part == PairPart::row || part == PairPart::experts; }
// Whether the summed partials travel whole to every rank that sums them (a row-parallel layer's
// with a 16-bit param type: its bias joins the fp32 sum) rather than through a reduction.
bool gathers_partials(PairPart part, DataType param_type) {
  return part == PairPart::row && param_type != DataType::float32;
}
bool starts_whole(PairPart part) { return part == PairPart::column || part == PairPart::experts; }

// --fp8: whether a scale's elements lie on several tensor ranks, so that its amax is maximized
// over the group (§2.7). A column-parallel layer splits W by rows and d pre by columns, a
// row-parallel layer W and its input by columns; every other operand is whole on each rank.
// A split cuts through every scale but one per line along the split (a row's scale where the
// rows are split, a column's where the columns are).
bool scale_spans_ranks(PairPart part, const Fp8OperandScales& scales) {
  enum class Split { none, rows, columns };
  Split split = Split::none;
  if (part == PairPart::column && scales.operand == Fp8Operand::weight) split = Split::rows;
  if (part == PairPart::column && scales.operand == Fp8Operand::output_grad) split = Split::columns;
  if (part == PairPart::row && scales.operand != Fp8Operand::output_grad) split = Split::columns;
  if (split == Split::none) return false;
  return scales.scaling == Fp8Scaling::tensor ||
         scales.scaling == (split == Split::columns ? Fp8Scaling::rows : Fp8Scaling::columns);
}

// Whether sequence parallelism splits the layer's output rows: a sum whose next layer runs here,
// in the same model chunk, and starts from the whole input (which it then gathers).
bool splits_output(int layer, const std::vector<LayerSpec>& model, const RankLayers& local, bool sequence_parallel) {
  return sequence_parallel && sums_output(part_of(layer, model)) && local.same_chunk(layer, layer + 1) &&
         starts_whole(part_of(layer + 1, model));
}
bool gathers_input(int layer, const std::vector<LayerSpec>& model, const RankLayers& local, bool sequence_parallel) {
  return local.same_chunk(layer - 1, layer) && splits_output(layer - 1, model, local, sequence_parallel);
}

// This rank's slice [begin, end) of an extent split over the group.
std::pair<std::int64_t, std::int64_t> slice(std::int64_t extent, int rank, int size) {
  return {extent * rank / size, extent * (rank + 1) / size};
}

class TensorParallel final : public Strategy, public LayerHooks, public SplitsTensors {
 public:
  explicit TensorParallel(const StrategyContext& context)
      : model_(context.layers), local_(context.local), sequence_parallel_(sequence_parallel(context.config)),
        kernels_(context.kernels), allocator_(context.allocator), group_(context.groups.group(GroupKind::tensor)) {}

  // A split output has a block of the rows; a gathered input (in forward, for the layer's
  // products) has every block.
  // A row-parallel layer's bias joins the sum of the partial products, here.
  void before_layer_forward(ForwardStart& event) override {
    if (gathers(event)) event.substitute_input(gather_input(event, event.input, event.rows), event.rows * group_.size());
    if (splits(event)) event.split_output_rows(event.layer_rows() / group_.size());
    if (part_of(event.layer, model_) == PairPart::row) event.add_bias_after_sum();
  }

  // g: the partial products of a row-parallel (or MoE) layer are summed before the bias, into
  // this rank's block of rows when split.
  void after_layer_matmul(const ForwardProduct& event) override {
    const PairPart part = part_of(event.layer, model_);
    if (!sums_output(part)) return;
    const std::int64_t out = event.spec.out_features, rows = event.output_rows;
    if (gathers_partials(part, event.activation_type)) {
      sum_partials_with_bias(event);
      return;
    }
    if (splits(event)) {
      group_.reduce_scatter(event.product, event.pre, elements(rows, out), event.activation_type);
    } else {
      group_.all_reduce(event.pre, elements(rows, out), event.activation_type);
    }
    if (event.bias_after_sum) kernels_.bias_add(event.pre, *event.bias_after_sum, rows, out, event.activation_type);
  }

  void after_layer_forward(const ForwardDone&) override { gathered_input_ = Buffer{}; }

  void agree_operand_amax(const OperandAmax& event) override {
    if (scale_spans_ranks(part_of(event.layer, model_), event.scales))
      group_.all_reduce(event.amax, static_cast<std::size_t>(event.scales.count), ReduceOp::max);
  }

  // The layer's backward computes on every block of rows: its weight gradient reads the gathered
  // input, and its input gradient is written for every block. A split backward's B computes the
  // input gradient alone, which does not read the input: no gather there.
  void before_layer_backward(BackwardStart& event) override {
    if (!gathers(event)) return;
    if (event.grad_input) gathered_grad_ = allocate(event.rows * group_.size(), event.spec.in_features, event);
    const void* input = event.input ? gather_input(event, *event.input, event.rows) : nullptr;
    event.substitute_input(input, gathered_grad_.empty() ? nullptr : gathered_grad_.as<void>());
  }

  // g's backward when split: the blocks of d loss / d pre, gathered for the products' backward.
  void before_layer_matmul_backward(const BackwardProduct& event) override {
    if (!splits(event)) return;
    group_.all_gather(event.grad_pre, event.grad_product, elements(event.output_rows, event.spec.out_features),
                      event.activation_type);
  }

  // f's backward: the column-parallel layer's input gradient is summed over the output slices
  // (an MoE layer's over its experts' slices), into this rank's block of rows when the input was
  // gathered.
  void after_layer_backward(const BackwardDone& event) override {
    const std::int64_t in = event.spec.in_features;
    if (gathers(event)) {
      if (event.input_gradient)
        group_.reduce_scatter(event.input_gradient->computed, event.input_gradient->destination,
                              elements(event.rows, in), event.activation_type);
      gathered_input_ = Buffer{};
      gathered_grad_ = Buffer{};
      return;
    }
    const PairPart part = part_of(event.layer, model_);
    if (!starts_whole(part) || !event.input_gradient) return;
    group_.all_reduce(event.input_gradient->computed, elements(event.layer_rows, in), event.activation_type);
  }

 private:
  static std::size_t elements(std::int64_t rows, std::int64_t columns) {
    return static_cast<std::size_t>(rows * columns);
  }
  // Evaluation stays whole: its micro-batches need not split evenly and keep nothing.
  bool splits(const LayerCall& event) const {
    return event.training && splits_output(event.layer, model_, local_, sequence_parallel_);
  }
  bool gathers(const LayerCall& event) const {
    return event.training && gathers_input(event.layer, model_, local_, sequence_parallel_);
  }
  Buffer allocate(std::int64_t rows, std::int64_t columns, const LayerCall& event) {
    return allocator_.allocate_elements(MemoryState::workspace, elements(rows, columns), event.activation_type);
  }
  // The half-precision g: every rank's rounded partial products of this rank's output rows (all
  // of them, or its block when split), summed in fp32 in rank order, plus the bias, rounded once
  // into pre. Same as one process up to the order of fp32 sums.
  void sum_partials_with_bias(const ForwardProduct& event) {
    const DataType type = event.activation_type;
    const std::int64_t out = event.spec.out_features, rows = event.output_rows;
    const std::size_t count = elements(rows, out);
    const auto ranks = static_cast<std::size_t>(group_.size());
    Buffer partials = allocator_.allocate_elements(MemoryState::workspace, count * ranks, type);
    if (splits(event)) {  // block r of every rank's product to rank r
      group_.run({.op = CommOp::all_to_all, .send = event.product, .receive = partials.as<void>(), .count = count,
                  .type = type});
    } else {
      group_.all_gather(event.product, partials.as<void>(), count, type);
    }
    Buffer sums = allocator_.allocate_floats(MemoryState::workspace, count);
    Buffer widened = allocator_.allocate_floats(MemoryState::workspace, std::max(count, static_cast<std::size_t>(out)));
    kernels_.convert(partials.as<void>(), type, sums.floats(), DataType::float32, count);
    for (std::size_t rank = 1; rank < ranks; ++rank) {
      kernels_.convert(advance(partials.as<void>(), rank * count, type), type, widened.floats(), DataType::float32,
                       count);
      kernels_.add(sums.floats(), widened.floats(), count);
    }
    kernels_.convert(*event.bias_after_sum, type, widened.floats(), DataType::float32, static_cast<std::size_t>(out));
    kernels_.bias_add(sums.floats(), widened.floats(), rows, out);
    kernels_.convert(sums.floats(), DataType::float32, event.pre, type, count);
  }

  // Every rank's block of the layer's input rows (this rank's `rows` of `input`), for the layer
  // to compute on.
  const void* gather_input(const LayerCall& event, const void* input, std::int64_t rows) {
    const std::int64_t in = event.spec.in_features;
    gathered_input_ = allocate(rows * group_.size(), in, event);
    group_.all_gather(input, gathered_input_.as<void>(), elements(rows, in), event.activation_type);
    return gathered_input_.as<void>();
  }

  const std::vector<LayerSpec>& model_;
  const RankLayers local_;
  const bool sequence_parallel_;
  Kernels& kernels_;
  Allocator& allocator_;
  Communicator& group_;
  Buffer gathered_input_;  // the current layer's gathered input
  Buffer gathered_grad_;   // and the gradient of it, before its reduce-scatter
};

constexpr Option options[] = {
    strategy_option<TensorParallelOptions, &TensorParallelOptions::sequence_parallel>(
        "sequence-parallel",
        "with --tp: split the rows every tensor rank would hold whole between a row-parallel layer and the "
        "next column-parallel (or MoE) layer over the tensor group"),
};

// Slices need equal widths, and sequence parallelism equal row blocks.
void validate(const Config& config) {
  const ModelConfig& model = config.model;
  const GridConfig& grid = config.grid;
  require(model.hidden % grid.tp == 0, fmt::format("--hidden {} is not divisible by --tp {}", model.hidden, grid.tp));
  require(grid.tp == 1 || model.moe_every == 0 || model.experts % (grid.ep * grid.tp) == 0,
          fmt::format("--experts {} is not divisible by --ep x --tp = {} x {}: each tensor rank holds an equal "
                      "slice of its expert-parallel rank's experts", model.experts, grid.ep, grid.tp));
  if (!sequence_parallel(config)) return;
  const int rows = config.data.global_batch / config.data.micro_batches / grid.dp;
  require(grid.tp > 1, "--sequence-parallel splits rows over the tensor-parallel group: it needs --tp 2 or more");
  require(rows % grid.tp == 0,
          fmt::format("--sequence-parallel: the {} rows of a micro-batch on each data-parallel rank (--global-batch "
                      "/ --micro-batches / dp) are not divisible by --tp {}", rows, grid.tp));
}

bool wanted(const Config&, const GridShape& shape) { return shape.tp > 1; }

void plan(const Config& config, const GridShape& shape, const GridCoordinates& place,
          ParameterPlan& plan) {
  const std::vector<LayerSpec> model = model_layer_specs(config.model.layers, 1, config.model.hidden, 1, config.model.moe_every,
                                                         config.model.experts, config.model.top_k);
  plan.splits.push_back([model, rank = place.tp, size = shape.tp](ParameterTensor& tensor) {
    const PairPart part = part_of(tensor.layer, model);
    const bool weight = tensor.global_shape.size() == 2;
    if (part == PairPart::experts) {  // the experts' slice of this rank's block (the router stays whole)
      if (!tensor.expert) return;
      tensor.local_start[0] += tensor.local_shape[0] * rank / size;
      tensor.local_shape[0] /= size;
      tensor.replicated_over_tensor = false;
    } else if (part == PairPart::column) {  // the output dimension: rows of W, and the bias
      const auto [begin, end] = slice(tensor.global_shape[0], rank, size);
      tensor.local_start[0] = begin;
      tensor.local_shape[0] = end - begin;
      tensor.replicated_over_tensor = false;
    } else if (part == PairPart::row && weight) {  // the input dimension: columns of W
      const auto [begin, end] = slice(tensor.global_shape[1], rank, size);
      tensor.local_start[1] = begin;
      tensor.local_shape[1] = end - begin;
      tensor.replicated_over_tensor = false;
    }
  });
}


// The rows of each local layer's outputs in a training micro-batch: a block of them where the
// hooks split them.
void split_rows(const RankLayout& layout, std::vector<std::int64_t>& output_rows) {
  for (int layer : layout.layers.list())
    if (splits_output(layer, layout.model, layout.layers, sequence_parallel(layout.config)))
      output_rows[static_cast<std::size_t>(layout.layers.local_index(layer))] /= layout.shape.tp;
}

void predict(const RankLayout& layout, Prediction& prediction) {
  const Config& config = layout.config;
  Prediction::shard(prediction.params);
  Prediction::shard(prediction.grads);
  Prediction::shard(prediction.optimizer);
  // Per micro-batch, in elements of whole [rows, width] tensors (the ledger's size of each
  // operation): a summed output's forward sum of [rows, out] (all-reduce, or reduce-scatter and
  // the all-gather of its gradient in backward when split), and a whole-input layer's backward
  // sum of its input gradient [rows, in] unless it starts the model (all-reduce, or when it
  // gathers its input: the gathers in forward and backward and the reduce-scatter of the
  // gradient). Recomputation runs a GELU layer's forward again, with its forward operations.
  // A row-parallel layer with a 16-bit param type gathers its partials instead (all-gather of
  // every rank's [rows, out], or all-to-all of the row blocks when split). An MoE layer also
  // sums (in fp32) the router's probability gradients [rows, E].
  std::int64_t all_reduce = 0, reduce_scatter = 0, all_gather = 0, all_to_all = 0, float_elements = 0;
  const bool split_rows = sequence_parallel(config);
  for (int index : layout.layers.list()) {  // this rank's layers
    const LayerSpec& layer = layout.model[static_cast<std::size_t>(index)];
    const PairPart part = part_of(layer.index, layout.model);
    const std::int64_t forwards = config.training.recompute && layer.gelu ? 2 : 1;
    const std::int64_t output = layout.rows * layer.out_features, input = layout.rows * layer.in_features;
    const bool gathered = gathers_partials(part, config.precision.param_dtype);
    if (splits_output(index, layout.model, layout.layers, split_rows)) {
      (gathered ? all_to_all : reduce_scatter) += forwards * output;
      all_gather += output;
    } else if (gathered) {
      all_gather += forwards * output * layout.shape.tp;
    } else if (sums_output(part)) {
      all_reduce += forwards * output;
    }
    if (gathers_input(index, layout.model, layout.layers, split_rows)) {
      all_gather += (forwards + 1) * input;
      reduce_scatter += input;
    } else if (starts_whole(part) && layer.index > 0) {
      all_reduce += input;
    }
    if (part == PairPart::experts) float_elements += layout.rows * layer.experts;
  }
  const auto bytes = [&](std::int64_t elements) {
    return config.data.micro_batches * elements * static_cast<std::int64_t>(size_of(config.precision.param_dtype));
  };
  // --fp8: an all-reduce of the maxima of each operand whose scales the split cuts through; a
  // layer that gathers its input computes on every rank's rows.
  std::int64_t amax_bytes = 0;
  for_each_fp8_product(layout, [&](const Fp8ProductRun& run) {
    const std::int64_t rows =
        run.input_rows * (gathers_input(run.layer, layout.model, layout.layers, split_rows) ? layout.shape.tp : 1);
    for (const Fp8OperandScales& scales : run.operands_taken(config.precision.fp8, rows))
      if (scale_spans_ranks(part_of(run.layer, layout.model), scales))
        amax_bytes += scales.count * static_cast<std::int64_t>(sizeof(float));
  });
  prediction.add_comm(GroupKind::tensor, CommOp::all_reduce,
                      bytes(all_reduce) + config.data.micro_batches * 4 * float_elements + amax_bytes);
  if (reduce_scatter > 0) prediction.add_comm(GroupKind::tensor, CommOp::reduce_scatter, bytes(reduce_scatter));
  if (all_gather > 0) prediction.add_comm(GroupKind::tensor, CommOp::all_gather, bytes(all_gather));
  if (all_to_all > 0) prediction.add_comm(GroupKind::tensor, CommOp::all_to_all, bytes(all_to_all));
}

std::string describe(const RankLayout& layout) {
  int pairs = 0, replicated = 0, moe = 0;
  for (int layer = 0; layer < layout.config.model.layers; ++layer) {
    pairs += part_of(layer, layout.model) == PairPart::row ? 1 : 0;
    replicated += part_of(layer, layout.model) == PairPart::replicated ? 1 : 0;
    moe += part_of(layer, layout.model) == PairPart::experts ? 1 : 0;
  }
  int splits = 0;
  for (int layer : layout.layers.list())
    splits += splits_output(layer, layout.model, layout.layers, sequence_parallel(layout.config)) ? 1 : 0;
  return fmt::format("tensor parallel over {} ranks: {} column/row layer pair(s), {} replicated layer(s){}{}",
                     layout.shape.tp, pairs, replicated,
                     moe > 0 ? fmt::format(", {} MoE layer(s) with their experts split", moe) : "",
                     sequence_parallel(layout.config)
                         ? fmt::format("; sequence parallel: the rows after {} of this rank's layer(s) split "
                                       "{} ways", splits, layout.shape.tp)
                         : "");
}

// The gradient reductions start (without blocking) at the end of a layer's backward before this
// strategy's blocking sum of the input gradient, so that they overlap it.
// Its split of an MoE layer's experts narrows expert parallelism's block of them.
constexpr std::string_view runs_after[] = {"data_parallel", "expert_parallel", "zero"};

}  // namespace

extern const StrategyRegistration tensor_parallel_registration = register_strategy<TensorParallel>({
    .name = "tensor_parallel",
    .runs_after = runs_after,
    .options = options,
    .validate = validate,
    .wanted = wanted,
    .plan = plan,
    .split_rows = split_rows,
    .predict = predict,
    .describe = describe});

}  // namespace mlptrain
