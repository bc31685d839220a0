#include "core/attention/layer_list.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/util/strings.h"

namespace cortiq::attention {

absl::Status CheckLayersInRange(const std::vector<size_t>& layers, size_t num_layers,
                                std::string_view field) {
  for (size_t l : layers) {
    if (l >= num_layers) {
      return absl::InvalidArgumentError(absl::StrCat(util::Sv(field), ": layer ", l,
                                                     " is out of range; the model has ", num_layers,
                                                     " layers"));
    }
  }
  return absl::OkStatus();
}

std::string LayerListString(const std::vector<size_t>& layers) {
  return absl::StrCat("[", absl::StrJoin(layers, ","), "]");
}

}  // namespace cortiq::attention
