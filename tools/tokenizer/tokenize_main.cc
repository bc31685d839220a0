// cortiq-tokenize: prints the token ids of text, or the text of ids.
//
//   cortiq-tokenize TOKENIZER_JSON encode [TEXT]   (stdin when TEXT is absent)
//   cortiq-tokenize TOKENIZER_JSON decode ID...
//   cortiq-tokenize TOKENIZER_JSON pieces [TEXT]   (id<TAB>token string per line)

#include <cstdlib>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"

namespace {

int Usage() {
  std::cerr << "usage: cortiq-tokenize TOKENIZER_JSON encode|pieces [TEXT]\n"
               "       cortiq-tokenize TOKENIZER_JSON decode ID...\n";
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) return Usage();
  auto tokenizer = cortiq::tokenizer::Tokenizer::FromFile(argv[1]);
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  const std::string command = argv[2];
  if (command == "decode") {
    std::vector<int32_t> ids;
    for (int i = 3; i < argc; ++i) ids.push_back(static_cast<int32_t>(std::atol(argv[i])));
    std::cout << tokenizer->Decode(ids) << "\n";
    return 0;
  }
  if (command != "encode" && command != "pieces") return Usage();
  std::string text;
  if (argc > 3) {
    text = argv[3];
  } else {
    text.assign(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
  }
  const std::vector<int32_t> ids = tokenizer->Encode(text);
  if (command == "encode") {
    for (size_t i = 0; i < ids.size(); ++i) std::cout << (i ? " " : "") << ids[i];
    std::cout << "\n";
  } else {
    for (int32_t id : ids) std::cout << id << "\t" << tokenizer->TokenString(id) << "\n";
  }
  return 0;
}
