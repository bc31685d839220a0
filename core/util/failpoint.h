// Failpoints: named places where a crash test kills the process at a chosen
// instant (the window between two durable steps, which no timing can hit
// reliably). CORTIQ_FAILPOINTS=name[,name...] in the environment arms them;
// an armed failpoint, when reached, logs its name and raises SIGKILL, as an
// OOM kill or kill -9 would. Unset (production), a failpoint is one relaxed
// load of a flag read once at start.
//
//   util::Failpoint("migrate-after-peer-import");
#pragma once

#include <string_view>

namespace cortiq::util {

void Failpoint(std::string_view name);

}  // namespace cortiq::util
