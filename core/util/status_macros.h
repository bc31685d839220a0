// Status macros: Abseil 20220623 (Debian 12) ships no RETURN_IF_ERROR /
// ASSIGN_OR_RETURN, so the project keeps these two.
//
// Example:
//   CORTIQ_RETURN_IF_ERROR(file.Read(buf));
//   CORTIQ_ASSIGN_OR_RETURN(auto header, ParseHeader(buf));
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define CORTIQ_CONCAT_INNER_(a, b) a##b
#define CORTIQ_CONCAT_(a, b) CORTIQ_CONCAT_INNER_(a, b)

#define CORTIQ_RETURN_IF_ERROR(expr)                 \
  do {                                               \
    ::absl::Status cortiq_status_ = (expr);          \
    if (!cortiq_status_.ok()) return cortiq_status_; \
  } while (0)

#define CORTIQ_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                  \
  if (!tmp.ok()) return std::move(tmp).status();      \
  lhs = std::move(tmp).value()

#define CORTIQ_ASSIGN_OR_RETURN(lhs, expr) \
  CORTIQ_ASSIGN_OR_RETURN_IMPL_(CORTIQ_CONCAT_(cortiq_statusor_, __LINE__), lhs, expr)
