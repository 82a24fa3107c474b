// The built-in datasets generated on the device where the run trains (Kernels::generate_samples):
// the CPU's samples bit for bit, with nothing made on the host but each batch's stream indices,
// which go up through a page-locked slot on the copy engine. A GPU never waits for the host to
// make its batch, and the host never waits for the GPU to take one.
#pragma once

#include <array>
#include <memory>

#include "core/builtin_samples.hpp"
#include "kernels/kernels.hpp"
#include "feed/sample_source.hpp"

namespace mlptrain {

class DeviceSamples final : public SampleSource {
 public:
  // `samples` is the dataset's generator with its tables in host memory; the tables go to the
  // device once, charged as workspace.
  DeviceSamples(const SyntheticSamples& samples, Kernels& kernels, Allocator& memory, SampleParts parts);
  ~DeviceSamples() override;  // waits for the uploads in flight
  DeviceSamples(const DeviceSamples&) = delete;
  DeviceSamples& operator=(const DeviceSamples&) = delete;

  void read(Split split, const std::vector<std::int64_t>& indices,
            const std::array<Buffer*, 3>& destination) override;
  const std::optional<std::string>& problem() const override { return no_problem_; }  // generating cannot fail

 private:
  // The stream indices alternate between two slots, so one batch's go up while the next's are written.
  static constexpr int slots = 2;
  // `buffer` holding at least `bytes` (allocated anew when it does not).
  static void reserve(Buffer& buffer, Allocator& memory, std::size_t bytes);

  Kernels& kernels_;
  Allocator& memory_;
  SampleParts parts_;
  Buffer first_table_, second_table_;  // the generator's tables on the device
  SyntheticSamples samples_;           // the generator, over those tables
  std::unique_ptr<AsyncCopier> copier_;
  std::array<Buffer, slots> host_indices_, device_indices_;
  int next_slot_ = 0;
  std::optional<std::string> no_problem_;
};

}  // namespace mlptrain
