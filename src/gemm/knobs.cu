// Knob text parsing (host only).
#include "gemm/knobs.hpp"

#include "runtime/autotune.hpp"

#include <cstdlib>

namespace coda::gemm {

bool programmatic_launch() { return runtime::env_flag("CODA_PDL"); }

bool parse_knobs(std::string const& text, Knobs& knobs, std::string* why) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t const comma = std::min(text.find(',', pos), text.size());
    std::string const item = text.substr(pos, comma - pos);
    pos = comma + 1;
    if (item.empty()) continue;
    size_t const eq = item.find('=');
    std::string const k = item.substr(0, eq), v = eq == std::string::npos ? "" : item.substr(eq + 1);
    bool ok = true;
    if (k == "raster") {
      if (v == "h") knobs.raster = Raster::kHeuristic;
      else if (v == "m") knobs.raster = Raster::kAlongM;
      else if (v == "n") knobs.raster = Raster::kAlongN;
      else ok = false;
    } else if (k == "swizzle" || k == "splits") {
      char* end = nullptr;
      long const n = std::strtol(v.c_str(), &end, 10);
      ok = !v.empty() && *end == '\0' && n >= 1 && n <= 64;
      if (ok) (k == "swizzle" ? knobs.swizzle : knobs.splits) = static_cast<int>(n);
    } else if (k == "mode") {
      if (v == "h") knobs.decomposition = Decomposition::kHeuristic;
      else if (v == "dp") knobs.decomposition = Decomposition::kDataParallel;
      else if (v == "sk") knobs.decomposition = Decomposition::kStreamK;
      else if (v == "splitk") knobs.decomposition = Decomposition::kSplitK;
      else ok = false;
    } else {
      ok = false;
    }
    if (!ok) {
      if (why != nullptr) {
        *why = "bad knob '" + item + "' (knobs: raster=h|m|n, swizzle=1|2|4|8, mode=h|dp|sk|splitk, splits=<n>)";
      }
      return false;
    }
  }
  return true;
}

std::string knobs_string(Knobs const& k) {
  std::string out;
  auto add = [&](std::string const& s) { out += (out.empty() ? "" : ",") + s; };
  if (k.raster == Raster::kAlongM) add("raster=m");
  if (k.raster == Raster::kAlongN) add("raster=n");
  if (k.swizzle != 1) add("swizzle=" + std::to_string(k.swizzle));
  if (k.decomposition == Decomposition::kDataParallel) add("mode=dp");
  if (k.decomposition == Decomposition::kStreamK) add("mode=sk");
  if (k.decomposition == Decomposition::kSplitK) add("mode=splitk");
  if (k.splits != 1) add("splits=" + std::to_string(k.splits));
  return out;
}

}  // namespace coda::gemm
