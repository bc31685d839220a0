// The fuzz corpora (tests/fuzz/corpus/*) read back as regression suites:
// every regular file of a directory, name and bytes, sorted by name.
#pragma once

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

namespace cortiq::testing {

struct CorpusFile {
  std::string name;   // file name, without the directory
  std::string bytes;  // the whole file
};

inline std::vector<CorpusFile> ReadCorpusDir(const std::string& dir) {
  std::vector<CorpusFile> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (!e.is_regular_file()) continue;
    std::ifstream f(e.path(), std::ios::binary);
    files.push_back(
        {e.path().filename().string(), std::string(std::istreambuf_iterator<char>(f), {})});
  }
  std::sort(files.begin(), files.end(),
            [](const CorpusFile& a, const CorpusFile& b) { return a.name < b.name; });
  return files;
}

}  // namespace cortiq::testing
