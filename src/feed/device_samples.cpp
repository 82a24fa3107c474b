// Generating the built-in datasets on the device (see device_samples.hpp).
#include "feed/device_samples.hpp"

#include "core/error.hpp"

namespace mlptrain {

namespace {

// A device copy of `count` floats of a host table (empty for none).
Buffer upload_table(Allocator& memory, const float* table, std::size_t count) {
  if (table == nullptr || count == 0) return {};
  Buffer buffer = memory.allocate_floats(MemoryState::workspace, count);
  memory.copy_to_device(buffer.as<void>(), table, count * sizeof(float));
  return buffer;
}

}  // namespace

DeviceSamples::DeviceSamples(const SyntheticSamples& samples, Kernels& kernels, Allocator& memory, SampleParts parts)
    : kernels_(kernels), memory_(memory), parts_(parts), samples_(samples) {
  const auto in = static_cast<std::size_t>(samples.input_dim), out = static_cast<std::size_t>(samples.output_dim);
  const bool teacher = samples.kind == SyntheticKind::teacher;
  first_table_ = upload_table(memory, samples.first_table, teacher ? in * teacher_hidden_units : out * in);
  second_table_ = upload_table(memory, samples.second_table, teacher ? out * teacher_hidden_units : 0);
  samples_.first_table = first_table_.empty() ? nullptr : first_table_.floats();
  samples_.second_table = second_table_.empty() ? nullptr : second_table_.floats();
  copier_ = memory.make_async_copier(slots);
  if (!copier_) throw std::logic_error("samples are generated on a device with background copies");
}

DeviceSamples::~DeviceSamples() {
  for (int slot = 0; slot < slots; ++slot) copier_->wait_to_device(slot);
}

void DeviceSamples::reserve(Buffer& buffer, Allocator& memory, std::size_t bytes) {
  if (buffer.bytes() < bytes) buffer = memory.allocate(MemoryState::workspace, bytes);
}

void DeviceSamples::read(Split split, const std::vector<std::int64_t>& indices, const std::array<Buffer*, 3>& destination) {
  const auto wanted = [&](bool read, std::size_t part) -> void* {
    return read && destination[part] != nullptr && !destination[part]->empty() ? destination[part]->as<void>() : nullptr;
  };
  auto* inputs = static_cast<float*>(wanted(parts_.inputs, 0));
  auto* targets = static_cast<float*>(wanted(parts_.targets, 1));
  auto* labels = static_cast<std::int32_t*>(wanted(parts_.labels, 2));
  if (indices.empty() || (inputs == nullptr && targets == nullptr && labels == nullptr)) return;
  // The slot's previous indices have gone up before they are overwritten.
  const int slot = next_slot_;
  next_slot_ = (next_slot_ + 1) % slots;
  copier_->wait_to_device(slot);
  const std::size_t bytes = indices.size() * sizeof(std::uint64_t);
  Buffer& host = host_indices_[static_cast<std::size_t>(slot)];
  Buffer& device = device_indices_[static_cast<std::size_t>(slot)];
  reserve(host, copier_->host_memory(), bytes);
  reserve(device, memory_, bytes);
  auto* stream_indices = host.as<std::uint64_t>();
  for (std::size_t i = 0; i < indices.size(); ++i) stream_indices[i] = synthetic_stream_index(split, indices[i]);
  copier_->start_to_device(slot, device.as<void>(), host.as<void>(), bytes);
  copier_->order_device_after_to_device(slot);
  kernels_.generate_samples(samples_, device.as<std::uint64_t>(), static_cast<std::int64_t>(indices.size()), inputs,
                            targets, labels);
}

}  // namespace mlptrain
