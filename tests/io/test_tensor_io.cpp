// Flat ranges of a tensor as HDF5 hyperslabs: exact cover, row-major order, few boxes.
#include <gtest/gtest.h>

#include <numeric>

#include "io/tensor_io.hpp"

using namespace mlptrain;

namespace {

// Flat indices a list of boxes covers, in the order the boxes list them (row-major inside each).
std::vector<std::int64_t> covered(const std::vector<std::int64_t>& shape,
                                  const std::vector<Hyperslab>& slabs) {
  std::vector<std::int64_t> indices;
  for (const Hyperslab& slab : slabs) {
    std::vector<hsize_t> index(shape.size(), 0);
    while (true) {
      std::int64_t flat = 0;
      for (std::size_t dim = 0; dim < shape.size(); ++dim)
        flat = flat * shape[dim] + static_cast<std::int64_t>(slab.start[dim] + index[dim]);
      indices.push_back(flat);
      std::size_t dim = shape.size();
      while (dim-- > 0) {
        if (++index[dim] < slab.count[dim]) break;
        index[dim] = 0;
      }
      if (dim == static_cast<std::size_t>(-1)) break;
    }
  }
  return indices;
}

}  // namespace

TEST(Hyperslabs, EveryFlatRangeOfSmallArraysIsCoveredExactlyInOrder) {
  for (const std::vector<std::int64_t>& shape :
       {std::vector<std::int64_t>{7}, {3, 5}, {2, 3, 4}, {4, 1, 3}}) {
    std::int64_t total = 1;
    for (std::int64_t extent : shape) total *= extent;
    for (std::int64_t offset = 0; offset < total; ++offset)
      for (std::int64_t count = 1; offset + count <= total; ++count) {
        const auto slabs = hyperslabs_of_range(shape, offset, count);
        std::vector<std::int64_t> expected(static_cast<std::size_t>(count));
        std::iota(expected.begin(), expected.end(), offset);
        ASSERT_EQ(covered(shape, slabs), expected) << "offset " << offset << " count " << count;
        ASSERT_LE(slabs.size(), 2 * shape.size() - 1);
      }
  }
}

TEST(Hyperslabs, WholeRowsAreOneBox) {
  const auto slabs = hyperslabs_of_range({4, 6}, 6, 18);
  ASSERT_EQ(slabs.size(), 1u);
  EXPECT_EQ(slabs[0].start, (std::vector<hsize_t>{1, 0}));
  EXPECT_EQ(slabs[0].count, (std::vector<hsize_t>{3, 6}));
  EXPECT_TRUE(hyperslabs_of_range({4, 6}, 3, 0).empty());
}
