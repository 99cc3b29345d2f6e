// Status propagation helpers for absl::Status / absl::StatusOr, as in Reverb.
#ifndef TROUPE_COMMON_STATUS_MACROS_H_
#define TROUPE_COMMON_STATUS_MACROS_H_

#include <cstdio>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TROUPE_CONCAT_INNER_(a, b) a##b
#define TROUPE_CONCAT_(a, b) TROUPE_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                              \
  do {                                                     \
    ::absl::Status troupe_status_ = (expr);                \
    if (!troupe_status_.ok()) return troupe_status_;       \
  } while (false)

// `ASSIGN_OR_RETURN(auto x, F())`: on error returns the status, else binds the value.
#define ASSIGN_OR_RETURN(lhs, expr) \
  TROUPE_ASSIGN_OR_RETURN_IMPL_(TROUPE_CONCAT_(troupe_statusor_, __LINE__), lhs, expr)
#define TROUPE_ASSIGN_OR_RETURN_IMPL_(var, lhs, expr) \
  auto var = (expr);                                  \
  if (!var.ok()) return std::move(var).status();      \
  lhs = std::move(var).value()

// Programmer errors (broken invariants): fail fast with file and line.
#define TROUPE_CHECK(cond)                                                        \
  do {                                                                            \
    if (!(cond)) {                                                                \
      std::fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
      std::abort();                                                               \
    }                                                                             \
  } while (false)

#endif  // TROUPE_COMMON_STATUS_MACROS_H_
