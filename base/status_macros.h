// RETURN_IF_ERROR / ASSIGN_OR_RETURN: propagate absl::Status without exceptions.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define TANDEM_CONCAT_INNER(a, b) a##b
#define TANDEM_CONCAT(a, b) TANDEM_CONCAT_INNER(a, b)

// Evaluates `expr` (an absl::Status) and returns it from the enclosing function if not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status _tandem_status = (expr);          \
    if (!_tandem_status.ok()) return _tandem_status; \
  } while (0)

// ASSIGN_OR_RETURN(lhs, expr): evaluates `expr` (an absl::StatusOr<T>); on error returns its
// status, else move-assigns the value to `lhs` (which may be a declaration: `auto x`).
#define ASSIGN_OR_RETURN(lhs, expr) \
  TANDEM_ASSIGN_OR_RETURN_IMPL(TANDEM_CONCAT(_tandem_statusor_, __LINE__), lhs, expr)
#define TANDEM_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return tmp.status();                \
  lhs = std::move(tmp).value()
