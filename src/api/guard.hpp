// The one place where C++ exceptions turn into a coda_status + thread-local message (no exception crosses the ABI).
#pragma once

#include <coda/coda.h>

#include <exception>
#include <new>
#include <string>

#include "common/error.hpp"

namespace coda::api {

void set_last_error(std::string message);
void clear_last_error();

/// Runs `body` (validation, then launch); returns CODA_SUCCESS or the status of the error it threw.
template <typename Body>
coda_status guarded(char const* op, Body&& body) noexcept {
  try {
    body();
    clear_last_error();
    return CODA_SUCCESS;
  } catch (detail::Error const& e) {
    set_last_error(std::string(op) + ": " + e.what());
    return e.status();
  } catch (std::bad_alloc const&) {
    set_last_error(std::string(op) + ": host out of memory");
    return CODA_ERROR_INTERNAL;
  } catch (std::exception const& e) {
    set_last_error(std::string(op) + ": internal error: " + e.what());
    return CODA_ERROR_INTERNAL;
  } catch (...) {
    set_last_error(std::string(op) + ": internal error: unknown exception");
    return CODA_ERROR_INTERNAL;
  }
}

}  // namespace coda::api
