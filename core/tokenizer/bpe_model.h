// Byte-level BPE over token ids: a pre-token's bytes start as the ids of their
// ByteLevel single-character tokens, then the adjacent pair with the lowest
// merge rank (leftmost on ties) is merged until no pair has a rank -- the
// order of HF tokenizers' BPE and of the JS reference's priority queue.
//
// Contract: built once by the tokenizer loader, then immutable; EncodeWord is
// const and thread-safe (scratch space is thread_local; the word cache is a
// fixed-size direct-mapped table behind striped mutexes, so it never grows).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace cortiq::tokenizer {

// Open-addressing map (left id, right id) -> (rank, merged id).
class MergeTable {
 public:
  struct Merge {
    int32_t rank;
    int32_t merged_id;
  };

  // Later duplicates of a pair overwrite earlier ones (the last rank wins, as
  // in HF tokenizers and the JS reference).
  void Build(const std::vector<std::pair<uint64_t, Merge>>& merges);

  static uint64_t Key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  // nullptr when the pair has no merge.
  const Merge* Find(int32_t left, int32_t right) const {
    if (mask_ == 0) return nullptr;
    const uint64_t key = Key(left, right);
    for (size_t i = Hash(key) & mask_;; i = (i + 1) & mask_) {
      const Slot& slot = slots_[i];
      if (slot.key == key) return &slot.merge;
      if (slot.key == kEmpty) return nullptr;
    }
  }

  size_t size() const { return size_; }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge{};
  };
  static size_t Hash(uint64_t key) {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20);
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
};

class BpeModel {
 public:
  // byte_ids[b]: id of the ByteLevel token of byte b. whole_word_ids: for
  // ignore_merges models, ByteLevel string -> id of every vocab token (a
  // pre-token found there is emitted as is); empty otherwise.
  BpeModel(std::array<int32_t, 256> byte_ids, MergeTable merges,
           std::unordered_map<std::string, int32_t> whole_word_ids);
  ~BpeModel();
  BpeModel(const BpeModel&) = delete;
  BpeModel& operator=(const BpeModel&) = delete;

  // Appends the ids of one pre-token (raw bytes, non-empty) to *ids.
  void EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const;

  const MergeTable& merges() const { return merges_; }

 private:
  class WordCache;

  void MergeWord(std::string_view bytes, std::vector<int32_t>* ids) const;

  std::array<int32_t, 256> byte_ids_;
  MergeTable merges_;
  std::unordered_map<std::string, int32_t> whole_word_ids_;
  std::unique_ptr<WordCache> cache_;
};

}  // namespace cortiq::tokenizer
