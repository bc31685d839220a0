// The layer lists every optional attention mode carries (which layers it
// runs on): sorted, unique indices, checked against the model once.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"

namespace cortiq::attention {

// InvalidArgument "FIELD: layer L is out of range; the model has N layers"
// for the first index >= num_layers.
absl::Status CheckLayersInRange(const std::vector<size_t>& layers, size_t num_layers,
                                std::string_view field);

// O(log n) on a sorted list.
inline bool ContainsLayer(const std::vector<size_t>& sorted_layers, size_t layer) {
  return std::binary_search(sorted_layers.begin(), sorted_layers.end(), layer);
}

// "[2,3]".
std::string LayerListString(const std::vector<size_t>& layers);

}  // namespace cortiq::attention
