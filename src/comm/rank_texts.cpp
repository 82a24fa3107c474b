// Every rank's text at rank 0 (see rank_texts.hpp).
#include "comm/rank_texts.hpp"

#include <algorithm>
#include <cstdint>

namespace mlptrain {

void texts_to_rank_zero(MPI_Comm world, const std::string& mine, const std::function<void(const std::string&)>& take) {
  int rank = 0, size = 1;
  MPI_Comm_rank(world, &rank);
  MPI_Comm_size(world, &size);
  // In pieces MPI's int counts can carry.
  constexpr int text_tag = 7301;
  constexpr std::size_t piece = std::size_t{1} << 30;
  if (rank != 0) {
    const auto length = static_cast<std::int64_t>(mine.size());
    MPI_Send(&length, 1, MPI_INT64_T, 0, text_tag, world);
    for (std::size_t sent = 0; sent < mine.size(); sent += piece)
      MPI_Send(mine.data() + sent, static_cast<int>(std::min(piece, mine.size() - sent)), MPI_CHAR, 0, text_tag,
               world);
    return;
  }
  take(mine);
  std::string theirs;
  for (int other = 1; other < size; ++other) {
    std::int64_t length = 0;
    MPI_Recv(&length, 1, MPI_INT64_T, other, text_tag, world, MPI_STATUS_IGNORE);
    theirs.resize(static_cast<std::size_t>(length));
    for (std::size_t received = 0; received < theirs.size(); received += piece)
      MPI_Recv(theirs.data() + received, static_cast<int>(std::min(piece, theirs.size() - received)), MPI_CHAR,
               other, text_tag, world, MPI_STATUS_IGNORE);
    take(theirs);
  }
}

}  // namespace mlptrain
