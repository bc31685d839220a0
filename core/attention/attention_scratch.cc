#include "core/attention/attention_scratch.h"

#include "core/attention/qsa_runtime.h"

namespace cortiq::attention {

AttentionScratch::~AttentionScratch() {
  qsa_scratch_.reset();  // frees through the runtime, still held
}

AttentionScratch::AttentionScratch(AttentionScratch&& o) noexcept
    : slots_(std::move(o.slots_)),
      qsa_runtime_(std::move(o.qsa_runtime_)),
      qsa_scratch_(std::move(o.qsa_scratch_)),
      qsa_pool_(std::move(o.qsa_pool_)),
      selections_(std::move(o.selections_)) {}

AttentionScratch& AttentionScratch::operator=(AttentionScratch&& o) noexcept {
  if (this != &o) {
    qsa_scratch_.reset();  // frees through our runtime before it is replaced
    slots_ = std::move(o.slots_);
    qsa_runtime_ = std::move(o.qsa_runtime_);
    qsa_scratch_ = std::move(o.qsa_scratch_);
    qsa_pool_ = std::move(o.qsa_pool_);
    selections_ = std::move(o.selections_);
  }
  return *this;
}

void AttentionScratch::EnsureSlots(size_t n) {
  while (slots_.size() < n) slots_.push_back(std::make_unique<ScratchSlot>());
}

qsa::QsaScratch& AttentionScratch::Qsa(const std::shared_ptr<QsaRuntime>& runtime) {
  if (qsa_runtime_ != runtime || qsa_scratch_ == nullptr) {
    qsa_scratch_.reset();  // frees through the old runtime, still held
    qsa_runtime_ = runtime;
    qsa_scratch_ = std::make_unique<qsa::QsaScratch>(&runtime->backend);
  }
  return *qsa_scratch_;
}

}  // namespace cortiq::attention
