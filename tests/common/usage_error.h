// Test helper for command-line parsing (core/util/flags.h and the programs'
// tables): the result is an INVALID_ARGUMENT error whose message contains a
// needle (the flag, the limit, the value), reported as gtest failures.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace cortiq::testing {

inline void ExpectUsageError(const absl::Status& status, const std::string& needle) {
  ASSERT_FALSE(status.ok()) << "expected an error naming " << needle;
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()), ::testing::HasSubstr(needle));
}

template <typename T>
void ExpectUsageError(const absl::StatusOr<T>& result, const std::string& needle) {
  ExpectUsageError(result.status(), needle);
}

}  // namespace cortiq::testing
