// Several --data files as one DataSource: each file is opened on its own (its own format, its
// own held-out split, its own shuffled stream) and every training row is drawn from file i
// with probability weight_i / sum(weights), by a SplitMix64 hash of (seed, row number), so the
// choice sequence depends on nothing but the seed. The stream state is the row number plus
// every file's own state, so a resume continues exactly. The evaluation batches are every
// file's held-out batches, in --data order; the identity lists every file's identity and the
// weights.
#pragma once
#include <vector>

#include "data/data_source.h"

namespace sf {

// sources[i] trained with weights[i] (> 0); `seed` drives the choice of file per row.
DataSource mix_data_sources(std::vector<DataSource> sources, const std::vector<double>& weights,
                            uint64_t seed);

}  // namespace sf
