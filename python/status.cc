#include "python/status.h"

#include <stdexcept>
#include <string>

namespace troupe::python {
namespace py = pybind11;
namespace {

// The classes, made once by BindErrors and kept for the interpreter's life.
struct Errors {
  PyObject* base = nullptr;
  PyObject* invalid_argument = nullptr;
  PyObject* not_found = nullptr;
  PyObject* unavailable = nullptr;
  PyObject* deadline_exceeded = nullptr;
  PyObject* permission_denied = nullptr;
};
Errors errors;

// A new exception class troupe.NAME deriving from `bases`, added to `module`.
PyObject* MakeClass(py::module_& module, const char* name, py::tuple bases, const char* doc) {
  const std::string qualified = std::string("troupe.") + name;
  PyObject* cls = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (cls == nullptr) throw py::error_already_set();
  module.attr(name) = py::handle(cls);  // the module holds a reference; `errors` borrows another
  return cls;
}

PyObject* ClassFor(absl::StatusCode code) {
  switch (code) {
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kOutOfRange:
      return errors.invalid_argument;
    case absl::StatusCode::kNotFound:
      return errors.not_found;
    case absl::StatusCode::kUnavailable:
      return errors.unavailable;
    case absl::StatusCode::kDeadlineExceeded:
      return errors.deadline_exceeded;
    case absl::StatusCode::kUnauthenticated:
    case absl::StatusCode::kPermissionDenied:
      return errors.permission_denied;
    default:
      return errors.base;
  }
}

// "NOT_FOUND" for kNotFound (absl's names, upper case as gRPC writes them).
std::string CodeName(absl::StatusCode code) {
  std::string name = absl::StatusCodeToString(code);
  for (char& c : name) {
    c = c == ' ' ? '_' : static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return name;
}

}  // namespace

void BindErrors(py::module_& module) {
  const py::handle exception(PyExc_RuntimeError);
  errors.base = MakeClass(module, "Error", py::make_tuple(exception),
                          "A troupe call failed; the message is the C++ absl::Status message, `code` its code.");
  const py::handle base(errors.base);
  errors.invalid_argument = MakeClass(module, "InvalidArgumentError", py::make_tuple(base, py::handle(PyExc_ValueError)),
                                      "A bad argument (INVALID_ARGUMENT, OUT_OF_RANGE).");
  errors.not_found =
      MakeClass(module, "NotFoundError", py::make_tuple(base, py::handle(PyExc_LookupError)), "NOT_FOUND.");
  errors.unavailable = MakeClass(module, "UnavailableError", py::make_tuple(base, py::handle(PyExc_ConnectionError)),
                                 "UNAVAILABLE: the server cannot be reached (retry).");
  errors.deadline_exceeded = MakeClass(module, "DeadlineExceededError",
                                       py::make_tuple(base, py::handle(PyExc_TimeoutError)), "DEADLINE_EXCEEDED.");
  errors.permission_denied =
      MakeClass(module, "PermissionDeniedError", py::make_tuple(base, py::handle(PyExc_PermissionError)),
                "UNAUTHENTICATED or PERMISSION_DENIED (a missing or wrong token, a certificate refused).");
}

void ThrowIfError(const absl::Status& status) {
  if (status.ok()) return;
  PyObject* cls = ClassFor(status.code());
  // Bytes that are not UTF-8 (a path, a peer's message) are replaced, not
  // turned into a UnicodeDecodeError that would hide the error.
  py::object message = py::reinterpret_steal<py::object>(
      PyUnicode_DecodeUTF8(status.message().data(), Py_ssize_t(status.message().size()), "replace"));
  if (!message) throw py::error_already_set();
  py::object error = py::reinterpret_steal<py::object>(PyObject_CallOneArg(cls, message.ptr()));
  if (!error) throw py::error_already_set();
  error.attr("code") = CodeName(status.code());
  PyErr_SetObject(cls, error.ptr());
  throw py::error_already_set();
}

void ThrowInvalidArgument(const std::string& message) {
  ThrowIfError(absl::InvalidArgumentError(message));
  throw std::logic_error("ThrowIfError returned for an error");  // not reached
}

}  // namespace troupe::python
