// Test helpers for /metrics: a minimal HTTP/1.0 GET over loopback and a
// parser of the Prometheus text exposition format (what prometheus-cpp
// writes). Failures are reported as gtest failures, never crashes.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"

namespace cortiq::testing {

// ---- a minimal HTTP/1.0 client and text-format parser ----

// GET http://127.0.0.1:port/path; the body, or "" with a test failure.
inline std::string HttpGet(int port, const std::string& path = "/metrics") {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) {
    ADD_FAILURE() << "socket: " << errno;
    return "";
  }
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ADD_FAILURE() << "connect 127.0.0.1:" << port << ": errno " << errno;
    close(fd);
    return "";
  }
  const std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = send(fd, req.data() + sent, req.size() - sent, 0);
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  std::string resp;
  char buf[4096];
  for (ssize_t n; (n = recv(fd, buf, sizeof(buf), 0)) > 0;) {
    resp.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  const size_t split = resp.find("\r\n\r\n");
  if (split == std::string::npos || resp.rfind("HTTP/1.", 0) != 0 ||
      resp.find(" 200 ") == std::string::npos || resp.find(" 200 ") > resp.find("\r\n")) {
    ADD_FAILURE() << "bad response: " << resp.substr(0, 200);
    return "";
  }
  return resp.substr(split + 4);
}

struct Sample {
  std::string name;
  std::map<std::string, std::string> labels;
  double value = 0;
};

struct Exposition {
  std::vector<Sample> samples;
  std::map<std::string, std::string> help;  // family → HELP text
  std::map<std::string, std::string> type;  // family → TYPE

  // Samples of `name` whose labels include every pair of `labels`.
  std::vector<const Sample*> All(const std::string& name,
                                 const std::map<std::string, std::string>& labels = {}) const {
    std::vector<const Sample*> out;
    for (const Sample& s : samples) {
      if (s.name != name) continue;
      bool match = true;
      for (const auto& [k, v] : labels) {
        auto it = s.labels.find(k);
        match = match && it != s.labels.end() && it->second == v;
      }
      if (match) out.push_back(&s);
    }
    return out;
  }
  // The one sample of `name` with exactly `labels`; nullopt when absent.
  std::optional<double> Get(const std::string& name,
                            const std::map<std::string, std::string>& labels = {}) const {
    std::optional<double> found;
    for (const Sample& s : samples) {
      if (s.name == name && s.labels == labels) {
        EXPECT_FALSE(found.has_value()) << "duplicate series " << name;
        found = s.value;
      }
    }
    return found;
  }
  double Value(const std::string& name,
               const std::map<std::string, std::string>& labels = {}) const {
    std::optional<double> v = Get(name, labels);
    EXPECT_TRUE(v.has_value()) << "no series " << name;
    return v.value_or(-1);
  }
};

// Splits `s` at `sep`, dropping empty pieces.
inline std::vector<std::string> Split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string piece;
  std::istringstream in(s);
  while (std::getline(in, piece, sep)) {
    if (!piece.empty()) out.push_back(piece);
  }
  return out;
}

// Parses the text exposition format (only what prometheus-cpp writes: label
// values without commas or escapes, one sample per line).
inline Exposition Parse(const std::string& text) {
  Exposition e;
  for (const std::string& line : Split(text, '\n')) {
    if (line.rfind("# HELP ", 0) == 0 || line.rfind("# TYPE ", 0) == 0) {
      const std::string rest = line.substr(7);
      const size_t sp = rest.find(' ');
      auto& dst = line[2] == 'H' ? e.help : e.type;
      dst[rest.substr(0, sp)] = sp == std::string::npos ? "" : rest.substr(sp + 1);
      continue;
    }
    if (line[0] == '#') continue;
    Sample s;
    size_t i = line.find_first_of("{ ");
    s.name = line.substr(0, i);
    if (i < line.size() && line[i] == '{') {
      const size_t close = line.find('}', i);
      EXPECT_NE(close, std::string::npos) << line;
      for (const std::string& kv : Split(line.substr(i + 1, close - i - 1), ',')) {
        const size_t eq = kv.find('=');
        const std::string v = kv.substr(eq + 1);
        EXPECT_TRUE(v.size() >= 2 && v.front() == '"' && v.back() == '"') << line;
        s.labels[kv.substr(0, eq)] = v.substr(1, v.size() - 2);
      }
      i = close + 1;
    }
    std::string value = line.substr(i + 1);
    value = value.substr(0, value.find(' '));  // drop a timestamp
    if (value == "+Inf") {
      s.value = HUGE_VAL;
    } else {
      char* end = nullptr;
      s.value = std::strtod(value.c_str(), &end);
      EXPECT_TRUE(!value.empty() && *end == '\0') << line;
    }
    e.samples.push_back(std::move(s));
  }
  return e;
}

// GET /metrics from 127.0.0.1:port, parsed.
inline Exposition Scrape(int port) { return Parse(HttpGet(port)); }

}  // namespace cortiq::testing
