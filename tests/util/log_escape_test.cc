#include "core/util/log_escape.h"

#include <string>

#include "gtest/gtest.h"

namespace cortiq::util {
namespace {

TEST(EscapeForLogTest, NothingAClientSendsCanEndTheLineOrTheQuotes) {
  EXPECT_EQ(EscapeForLog("abc123 session=x"), "abc123 session=x");
  EXPECT_EQ(EscapeForLog("id\nreq=9 rpc=Forged code=OK"), "id\\nreq=9 rpc=Forged code=OK");
  EXPECT_EQ(EscapeForLog("a\r\tb"), "a\\r\\tb");
  EXPECT_EQ(EscapeForLog("say \"hi\" \\"), "say \\\"hi\\\" \\\\");
  EXPECT_EQ(EscapeForLog(std::string("\0\x1b\x7f", 3)), "\\x00\\x1b\\x7f");
  EXPECT_EQ(EscapeForLog("café ×"), "café ×");  // UTF-8 stays readable
  const std::string escaped = EscapeForLog("x\n\r\x0b\x0c\x1cy");
  EXPECT_EQ(escaped.find_first_of("\n\r\x0b\x0c\x1c"), std::string::npos) << escaped;
}

}  // namespace
}  // namespace cortiq::util
