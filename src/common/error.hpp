// Internal error reporting: code below the C ABI throws coda::detail::Error; the ABI catches it, stores the message
// in the thread-local last-error slot and returns the status (no exception ever crosses extern "C").
#pragma once

#include <coda/types.h>

#include <sstream>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <utility>

namespace coda::detail {

class Error : public std::runtime_error {
 public:
  Error(coda_status status, std::string const& message) : std::runtime_error(message), status_(status) {}
  coda_status status() const noexcept { return status_; }

 private:
  coda_status status_;
};

template <typename... Parts>
std::string concat(Parts&&... parts) {
  std::ostringstream os;
  (os << ... << std::forward<Parts>(parts));
  return os.str();
}

template <typename... Parts>
[[noreturn]] void fail(coda_status status, Parts&&... parts) {
  throw Error(status, concat(std::forward<Parts>(parts)...));
}

/// Accepts only bool: CODA_REQUIRE's guard against `if (ptr)`-style conditions (a deleted overload rather than a
/// decltype static_assert, which nvcc mangles inside class templates).
constexpr bool require_bool(bool b) { return b; }
template <typename T>
bool require_bool(T) = delete;

}  // namespace coda::detail

/// CODA_REQUIRE(cond, status, message parts...): throws coda::detail::Error(status, message) when cond is false.
/// The condition must be a bool (an int or pointer is rejected at compile time: write the comparison).
#define CODA_REQUIRE(cond, status, ...)                                                                          \
  do {                                                                                                           \
    if (!::coda::detail::require_bool(cond)) ::coda::detail::fail((status), __VA_ARGS__);                        \
  } while (0)

/// Throws CODA_ERROR_CUDA with the CUDA error name and the call text when a CUDA runtime call fails.
#define CODA_CUDA_CHECK(call)                                                                                    \
  do {                                                                                                           \
    cudaError_t coda_cuda_err_ = (call);                                                                         \
    if (coda_cuda_err_ != cudaSuccess) {                                                                         \
      ::coda::detail::fail(CODA_ERROR_CUDA, #call, " failed: ", cudaGetErrorName(coda_cuda_err_), " (",         \
                           cudaGetErrorString(coda_cuda_err_), ") at ", __FILE__, ":", __LINE__);                \
    }                                                                                                            \
  } while (0)
