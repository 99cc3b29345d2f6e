// absl::Status to Python exceptions. Every fallible call of the bindings
// goes through ThrowIfError, so a Status never aborts the interpreter: it
// becomes an exception whose message is the Status message, of a class
// that derives from troupe.Error and from the built-in Python exception a
// Python user would catch for that code:
//   INVALID_ARGUMENT, OUT_OF_RANGE  troupe.InvalidArgumentError (ValueError)
//   NOT_FOUND                       troupe.NotFoundError (LookupError)
//   UNAVAILABLE                     troupe.UnavailableError (ConnectionError)
//   DEADLINE_EXCEEDED               troupe.DeadlineExceededError (TimeoutError)
//   UNAUTHENTICATED, PERMISSION_DENIED  troupe.PermissionDeniedError (PermissionError)
//   everything else                 troupe.Error (RuntimeError), with .code
// Each exception also carries `code`, the Status code's name ("NOT_FOUND").
#ifndef TROUPE_PYTHON_STATUS_H_
#define TROUPE_PYTHON_STATUS_H_

#include <pybind11/pybind11.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace troupe::python {

// Creates the exception classes and adds them to `module`.
void BindErrors(pybind11::module_& module);

// Raises the exception for `status` (a pybind11::error_already_set) unless
// it is OK. Needs the GIL.
void ThrowIfError(const absl::Status& status);

template <typename T>
T ValueOrThrow(absl::StatusOr<T> value) {
  ThrowIfError(value.status());
  return *std::move(value);
}

// Raises troupe.InvalidArgumentError (a ValueError) with `message`.
[[noreturn]] void ThrowInvalidArgument(const std::string& message);

}  // namespace troupe::python

#endif  // TROUPE_PYTHON_STATUS_H_
