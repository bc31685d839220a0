// Byte-level BPE merging. See bpe_model.h.

#include "core/tokenizer/bpe_model.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <mutex>

#include "core/tokenizer/byte_level.h"

namespace cortiq::tokenizer {

void MergeTable::Build(const std::vector<std::pair<uint64_t, Merge>>& merges) {
  size_t capacity = std::bit_ceil(std::max<size_t>(16, merges.size() + merges.size() / 2));
  slots_.assign(capacity, Slot{});
  mask_ = capacity - 1;
  size_ = 0;
  for (const auto& [key, merge] : merges) {
    size_t i = Hash(key) & mask_;
    while (slots_[i].key != kEmpty && slots_[i].key != key) i = (i + 1) & mask_;
    if (slots_[i].key == kEmpty) ++size_;
    slots_[i].key = key;
    slots_[i].merge = merge;
  }
}

// Direct-mapped cache of word -> ids for words up to kMaxWord bytes whose
// encoding has at most kMaxIds ids (nearly every word of natural text). A slot
// is overwritten by the next word hashing to it; stripes of slots share a
// mutex, so lookups from many threads rarely contend.
class BpeModel::WordCache {
 public:
  static constexpr size_t kMaxWord = 22;
  static constexpr size_t kMaxIds = 8;

  WordCache() : entries_(new Entry[kSlots]) {}

  static uint64_t Hash(std::string_view word) {
    // Multiply-mix of 8-byte chunks; words are short, so this is a few cycles.
    uint64_t h = 0x9E3779B97F4A7C15ull ^ word.size();
    size_t i = 0;
    for (; i + 8 <= word.size(); i += 8) {
      uint64_t chunk;
      std::memcpy(&chunk, word.data() + i, 8);
      h = (h ^ chunk) * 0xBF58476D1CE4E5B9ull;
      h ^= h >> 31;
    }
    if (i < word.size()) {
      uint64_t chunk = 0;
      std::memcpy(&chunk, word.data() + i, word.size() - i);
      h = (h ^ chunk) * 0x94D049BB133111EBull;
      h ^= h >> 29;
    }
    return h | 1;  // 0 marks an empty slot
  }

  // Appends the cached ids of word to *ids; false on a miss.
  bool Lookup(std::string_view word, uint64_t hash, std::vector<int32_t>* ids) const {
    const size_t slot = hash & (kSlots - 1);
    std::lock_guard<std::mutex> lock(stripes_[slot & (kStripes - 1)].mutex);
    const Entry& e = entries_[slot];
    if (e.hash != hash || e.word_length != word.size() ||
        std::memcmp(e.word, word.data(), word.size()) != 0) {
      return false;
    }
    ids->insert(ids->end(), e.ids, e.ids + e.num_ids);
    return true;
  }

  void Insert(std::string_view word, uint64_t hash, const int32_t* ids, size_t num_ids) {
    if (word.size() > kMaxWord || num_ids > kMaxIds) return;
    const size_t slot = hash & (kSlots - 1);
    std::lock_guard<std::mutex> lock(stripes_[slot & (kStripes - 1)].mutex);
    Entry& e = entries_[slot];
    e.hash = hash;
    e.word_length = static_cast<uint8_t>(word.size());
    e.num_ids = static_cast<uint8_t>(num_ids);
    std::memcpy(e.word, word.data(), word.size());
    std::memcpy(e.ids, ids, num_ids * sizeof(int32_t));
  }

 private:
  static constexpr size_t kSlots = size_t{1} << 15;  // 64-byte entries: 2 MiB
  static constexpr size_t kStripes = 64;

  struct Entry {
    uint64_t hash = 0;
    uint8_t word_length = 0;
    uint8_t num_ids = 0;
    char word[kMaxWord];
    int32_t ids[kMaxIds];
  };
  struct alignas(64) Stripe {
    std::mutex mutex;
  };

  std::unique_ptr<Entry[]> entries_;
  mutable Stripe stripes_[kStripes];
};

BpeModel::BpeModel(std::array<int32_t, 256> byte_ids, MergeTable merges,
                   std::unordered_map<std::string, int32_t> whole_word_ids)
    : byte_ids_(byte_ids),
      merges_(std::move(merges)),
      whole_word_ids_(std::move(whole_word_ids)),
      cache_(std::make_unique<WordCache>()) {}

BpeModel::~BpeModel() = default;

void BpeModel::EncodeWord(std::string_view bytes, std::vector<int32_t>* ids) const {
  if (bytes.size() == 1) {
    ids->push_back(byte_ids_[static_cast<uint8_t>(bytes[0])]);
    return;
  }
  if (!whole_word_ids_.empty()) {
    auto it = whole_word_ids_.find(ByteLevelEncode(bytes));
    if (it != whole_word_ids_.end()) {
      ids->push_back(it->second);
      return;
    }
  }
  if (bytes.size() > WordCache::kMaxWord) {
    MergeWord(bytes, ids);
    return;
  }
  const uint64_t hash = WordCache::Hash(bytes);
  if (cache_->Lookup(bytes, hash, ids)) return;
  const size_t before = ids->size();
  MergeWord(bytes, ids);
  cache_->Insert(bytes, hash, ids->data() + before, ids->size() - before);
}

namespace {

struct Symbol {
  int32_t id;    // -1 once merged into its left neighbour
  int32_t prev;  // index of the previous live symbol, -1 at the start
  int32_t next;  // index of the next live symbol, -1 at the end
};

// A candidate merge of the live symbol at pos with its right neighbour.
struct Candidate {
  int32_t rank;
  int32_t pos;
  int32_t left_id;
  int32_t right_id;
  int32_t merged_id;
};

// Min-heap order on (rank, pos): lowest rank first, leftmost on ties.
struct LaterCandidate {
  bool operator()(const Candidate& a, const Candidate& b) const {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  }
};

}  // namespace

void BpeModel::MergeWord(std::string_view bytes, std::vector<int32_t>* ids) const {
  thread_local std::vector<Symbol> symbols;
  thread_local std::vector<Candidate> heap;
  const int32_t n = static_cast<int32_t>(bytes.size());
  symbols.resize(n);
  heap.clear();
  for (int32_t i = 0; i < n; ++i) {
    symbols[i] = {byte_ids_[static_cast<uint8_t>(bytes[i])], i - 1, i + 1 < n ? i + 1 : -1};
  }
  auto push_candidate = [&](int32_t pos) {
    const int32_t next = symbols[pos].next;
    if (next < 0) return;
    const int32_t left = symbols[pos].id;
    const int32_t right = symbols[next].id;
    if (const MergeTable::Merge* m = merges_.Find(left, right)) {
      heap.push_back({m->rank, pos, left, right, m->merged_id});
      std::push_heap(heap.begin(), heap.end(), LaterCandidate());
    }
  };
  for (int32_t i = 0; i + 1 < n; ++i) push_candidate(i);

  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), LaterCandidate());
    const Candidate c = heap.back();
    heap.pop_back();
    Symbol& left = symbols[c.pos];
    // Stale when either side has changed since the candidate was pushed.
    if (left.id != c.left_id || left.next < 0) continue;
    Symbol& right = symbols[left.next];
    if (right.id != c.right_id) continue;
    left.id = c.merged_id;
    right.id = -1;
    left.next = right.next;
    if (left.next >= 0) symbols[left.next].prev = c.pos;
    if (left.prev >= 0) push_candidate(left.prev);
    push_candidate(c.pos);
  }
  for (int32_t i = 0; i >= 0; i = symbols[i].next) ids->push_back(symbols[i].id);
  // A pathological word (say a megabyte without a break) must not pin its
  // scratch memory to the thread forever.
  constexpr size_t kKeepScratch = size_t{1} << 16;
  if (symbols.capacity() > kKeepScratch) std::vector<Symbol>().swap(symbols);
  if (heap.capacity() > kKeepScratch) std::vector<Candidate>().swap(heap);
}

}  // namespace cortiq::tokenizer
