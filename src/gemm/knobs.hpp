// Text form of the scheduler knobs ("raster=m,swizzle=4,mode=sk,splits=2"), shared by the plain GEMM's candidate
// names (CODA_GEMM_CONFIG, the autotune cache) and the fused ops' CODA_OP_CONFIG pin. CUTLASS-free.
#pragma once

#include "gemm/kernel_api.hpp"

#include <string>

namespace coda::gemm {

/// Parses a comma-separated knob list into `knobs` (fields not named keep their value). False with *why set (the
/// bad item and the accepted syntax) on an unknown key or value.
bool parse_knobs(std::string const& text, Knobs& knobs, std::string* why);

/// The knobs that differ from the defaults, in parse_knobs syntax ("" for the defaults).
std::string knobs_string(Knobs const& knobs);

}  // namespace coda::gemm
