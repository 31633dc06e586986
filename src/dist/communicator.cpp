// Shard arithmetic shared by every Communicator (contract in communicator.h).
#include "dist/communicator.h"

#include <algorithm>

#include "core/error.h"

namespace sf::dist {

ShardRange shard_range(size_t n, int world, int rank, size_t align) {
  SF_CHECK(world >= 1 && rank >= 0 && rank < world && align >= 1, "shard_range: rank ", rank,
           " of world ", world, ", align ", align);
  const size_t w = static_cast<size_t>(world);
  const size_t per = (n + w - 1) / w;
  const size_t shard = (per + align - 1) / align * align;
  const size_t begin = std::min(n, shard * static_cast<size_t>(rank));
  return ShardRange{begin, std::min(n, begin + shard)};
}

}  // namespace sf::dist
