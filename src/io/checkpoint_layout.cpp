// The checkpoint file's layout (see checkpoint_layout.hpp).
#include "io/checkpoint_layout.hpp"

#include <isa-l/crc.h>
#include <zlib.h>

#include <algorithm>

#include "core/error.hpp"

namespace mlptrain {

namespace {

// A checksummed run of a dataset: [offset, offset + length) bytes in row-major order.
struct ChecksumRun {
  std::uint64_t dataset = 0, offset = 0, length = 0, crc = 0;
};

}  // namespace

std::string dataset_name(const ParameterTensor& tensor, int part) {
  return part_prefixes[part] + tensor.path;
}

std::string shape_text(const std::vector<std::int64_t>& shape) {
  std::string text = "[";
  for (std::size_t dim = 0; dim < shape.size(); ++dim)
    text += (dim ? ", " : "") + std::to_string(shape[dim]);
  return text + "]";
}

std::vector<WrittenSlice> written_slices(const StatePlacement& placement,
                                         const std::vector<ParameterTensor>& global_tensors) {
  std::vector<WrittenSlice> slices;
  for (std::size_t index = 0; index < global_tensors.size(); ++index) {
    const int global_index = global_tensors[index].global_index;
    const std::vector<const StateRange*> runs = ranges_of(placement.updated, global_index);
    if (runs.empty()) continue;
    std::int64_t total = 0;
    for (const StateRange* run : runs) total += run->count;
    // The copies of a rank's runs of one tensor hold the same runs; slice j of their
    // concatenation is copy j's, rotated by tensor so that the small tensors (whose slices
    // round to nothing but the last) spread over the copies too.
    const RangeCopies copies = runs.front()->copies;
    const int slice = (copies.index + global_index) % copies.count;
    const std::int64_t begin = aligned_split(total, slice, copies.count);
    const std::int64_t end = aligned_split(total, slice + 1, copies.count);
    std::int64_t at = 0;
    for (const StateRange* run : runs) {
      const std::int64_t first = std::max(begin, at), last = std::min(end, at + run->count);
      if (first < last)
        slices.push_back({.tensor = index, .offset = run->offset + (first - at), .count = last - first,
                          .run = run, .run_skip = first - at});
      at += run->count;
    }
  }
  return slices;
}

const float* slice_data(const WrittenSlice& slice, int part) {
  return static_cast<const float*>(field_of(*slice.run, run_parts[part])) + slice.run_skip;
}

std::vector<std::uint32_t> slice_checksums(const std::vector<WrittenSlice>& slices,
                                           const std::vector<const float*>& sources, Allocator& allocator) {
  std::vector<std::uint32_t> checksums;
  std::vector<float> host;  // a slice in device memory, copied
  for (int part = 0; part < part_count; ++part)
    for (const WrittenSlice& slice : slices) {
      const auto bytes = static_cast<std::size_t>(slice.count) * sizeof(float);
      const float* at = sources.empty() ? slice_data(slice, part) : sources[checksums.size()];
      if (sources.empty() && allocator.device() != Device::cpu) {
        host.resize(static_cast<std::size_t>(slice.count));
        allocator.copy_any_to_host(host.data(), at, bytes);
        at = host.data();
      }
      checksums.push_back(crc32_gzip_refl(0, reinterpret_cast<const unsigned char*>(at), bytes));
    }
  return checksums;
}

std::int64_t non_finite_elements(const std::vector<WrittenSlice>& slices, const std::vector<const float*>& sources) {
  // A float is not finite when its exponent bits are all set: integer work, which vectorizes.
  std::int64_t count = 0;
  std::size_t source = 0;
  for (int part = 0; part < part_count; ++part)
    for (const WrittenSlice& slice : slices) {
      const auto* bits = reinterpret_cast<const std::uint32_t*>(sources[source++]);
      std::int64_t in_slice = 0;
      for (std::int64_t index = 0; index < slice.count; ++index)
        in_slice += (bits[index] & 0x7f800000u) == 0x7f800000u;
      count += in_slice;
    }
  return count;
}

Hdf5Handle mpio_access(MPI_Comm comm) {
  Hdf5Handle access = property_handle(H5Pcreate(H5P_FILE_ACCESS));
  H5Pset_fapl_mpio(access.get(), comm, MPI_INFO_NULL);
  return access;
}

// Independent transfers: a rank's runs are few long contiguous ranges of each dataset,
// which MPI-IO writes as they are, while a collective transfer synchronizes every rank once per
// dataset (measured at 4 ranks on 2 cores: a checkpointing run took 2.1 s with collective
// transfers, 0.9 s with independent ones).
Hdf5Handle independent_transfer() {
  Hdf5Handle transfer = property_handle(H5Pcreate(H5P_DATASET_XFER));
  H5Pset_dxpl_mpio(transfer.get(), H5FD_MPIO_INDEPENDENT);
  return transfer;
}

// Every element must be written exactly once; anything else is a broken invariant, not a user error.
std::vector<std::uint32_t> dataset_checksums(const std::vector<WrittenSlice>& slices,
                                             const std::vector<std::uint32_t>& slice_crcs,
                                             const std::vector<ParameterTensor>& global_tensors,
                                             Communicator& world) {
  std::vector<std::uint64_t> local;
  for (int part = 0; part < part_count; ++part)
    for (std::size_t index = 0; index < slices.size(); ++index) {
      const WrittenSlice& slice = slices[index];
      local.insert(local.end(), {slice.tensor * part_count + part, static_cast<std::uint64_t>(slice.offset) * 4,
                                 static_cast<std::uint64_t>(slice.count) * 4,
                                 slice_crcs[static_cast<std::size_t>(part) * slices.size() + index]});
    }
  // Gather every rank's slices (padded to the longest list).
  std::uint64_t longest = local.size();
  world.all_reduce(&longest, 1, ReduceOp::max);
  local.resize(longest, ~std::uint64_t{0});
  std::vector<std::uint64_t> all(longest * static_cast<std::size_t>(world.size()));
  world.all_gather(local.data(), all.data(), longest);
  std::vector<ChecksumRun> runs;
  for (std::size_t i = 0; i + 3 < all.size(); i += 4)
    if (all[i] != ~std::uint64_t{0}) runs.push_back({all[i], all[i + 1], all[i + 2], all[i + 3]});
  std::sort(runs.begin(), runs.end(), [](const ChecksumRun& a, const ChecksumRun& b) {
    return a.dataset != b.dataset ? a.dataset < b.dataset : a.offset < b.offset;
  });

  std::vector<std::uint32_t> checksums(global_tensors.size() * part_count, 0);
  std::vector<std::uint64_t> covered(checksums.size(), 0);
  for (const ChecksumRun& run : runs) {
    if (run.offset != covered[run.dataset])
      throw RuntimeFailure("checkpoint: pieces of a tensor overlap or leave a gap");
    checksums[run.dataset] = static_cast<std::uint32_t>(
        crc32_combine(checksums[run.dataset], run.crc, static_cast<z_off_t>(run.length)));
    covered[run.dataset] += run.length;
  }
  for (std::size_t dataset = 0; dataset < checksums.size(); ++dataset) {
    std::int64_t elements = 1;
    for (std::int64_t extent : global_tensors[dataset / part_count].global_shape) elements *= extent;
    if (covered[dataset] != static_cast<std::uint64_t>(elements) * 4)
      throw RuntimeFailure("checkpoint: a tensor is not written whole by the ranks");
  }
  return checksums;
}

void check_slices_cover(const std::vector<WrittenSlice>& slices, const std::vector<ParameterTensor>& global_tensors,
                        Communicator& world) {
  dataset_checksums(slices, std::vector<std::uint32_t>(slices.size() * part_count, 0), global_tensors, world);
}

}  // namespace mlptrain
