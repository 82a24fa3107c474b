// Loops the CPU kernels share: sums over fixed lanes of double partial sums (which vectorize
// without reassociation flags and give the same sum wherever the data sits in memory), and
// conversion between element types.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstring>

#include "core/elements.hpp"

namespace mlptrain::cpu_loops {

constexpr std::size_t lanes = 16;

// Sum over i of term(i) in double, lane-parallel; after_block(begin, end) runs after each block of
// terms (while their data is still in cache). The blocks do not change the sum.
constexpr std::size_t block_elements = 2048;  // a multiple of `lanes`
template <typename Term, typename AfterBlock>
inline double lane_sum(std::size_t count, Term term, AfterBlock after_block) {
  double partial[lanes] = {};
  const std::size_t whole = count / lanes * lanes;
  for (std::size_t begin = 0; begin < whole; begin += block_elements) {
    const std::size_t end = std::min(begin + block_elements, whole);
    for (std::size_t base = begin; base < end; base += lanes)
      for (std::size_t lane = 0; lane < lanes; ++lane) partial[lane] += term(base + lane);
    after_block(begin, end);
  }
  double total = 0;
  for (std::size_t i = whole; i < count; ++i) total += term(i);
  after_block(whole, count);
  for (double value : partial) total += value;
  return total;
}
template <typename Term>
inline double lane_sum(std::size_t count, Term term) {
  return lane_sum(count, term, [](std::size_t, std::size_t) {});
}

// destination = source, converted element by element (a plain loop per pair of types).
inline void convert_elements(const void* source, DataType from, void* destination, DataType to, std::size_t count) {
  if (from == to) {
    if (count > 0) std::memmove(destination, source, count * size_of(from));
    return;
  }
  with_element(from, [&](auto in_element) {
    with_element(to, [&](auto out_element) {
      using In = decltype(in_element);
      using Out = decltype(out_element);
      const auto* __restrict in = elements<In>(source);
      auto* __restrict out = elements<Out>(destination);
      for (std::size_t i = 0; i < count; ++i) out[i] = Out::store(In::load(in[i]));
    });
  });
}

}  // namespace mlptrain::cpu_loops
