// A spdlog sink that keeps every formatted line in memory, for tests that
// check what the server logs.
#pragma once

#include <mutex>
#include <string>
#include <vector>

#include "spdlog/sinks/base_sink.h"

namespace cortiq::testing {

class CaptureSink final : public spdlog::sinks::base_sink<std::mutex> {
 public:
  std::vector<std::string> Lines() {
    std::lock_guard lock(mutex_);
    return lines_;
  }
  // Every line, concatenated.
  std::string All() {
    std::string s;
    for (const std::string& l : Lines()) s += l;
    return s;
  }

 protected:
  void sink_it_(const spdlog::details::log_msg& msg) override {
    spdlog::memory_buf_t buf;
    formatter_->format(msg, buf);
    lines_.emplace_back(buf.data(), buf.size());
  }
  void flush_() override {}

 private:
  std::vector<std::string> lines_;
};

}  // namespace cortiq::testing
