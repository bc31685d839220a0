// LayerKvPool (see the header).
#include "core/qsa/kv_pool.h"

#include <limits>

#include "absl/strings/str_cat.h"

namespace cortiq::qsa {

absl::Status LayerKvPool::Bind(const kv::LayerKvCache& cache, size_t block_size) {
  if (block_size == 0) return absl::InvalidArgumentError("LayerKvPool: block_size must be > 0");
  const size_t cap = cache.capacity();
  const size_t H = cache.num_kv_heads();
  const size_t D = cache.head_dim();
  if (cap == 0) {
    return absl::FailedPreconditionError("LayerKvPool: the KV cache has no storage yet");
  }
  if (cache.HasDeadHeads()) {
    return absl::FailedPreconditionError(
        "LayerKvPool: the KV cache has dead heads; positions do not map to rows");
  }
  const size_t num_blocks = (cap + block_size - 1) / block_size;
  if (num_blocks > std::numeric_limits<uint32_t>::max()) {
    return absl::InvalidArgumentError("LayerKvPool: too many blocks for a u32 block table");
  }

  KvPool p;
  p.num_kv_heads = H;
  p.head_dim = D;
  p.block_size = block_size;
  p.strides = PoolStrides{block_size * D, D, cap * D};
  // Checks that head h's rows start h · capacity · head_dim elements after
  // head 0's (the documented head-major layout) before relying on it.
  auto check_heads = [&](auto view, size_t head_elems) -> absl::Status {
    const auto* base = view(0).data();
    for (size_t h = 1; h < H; ++h) {
      if (view(h).data() != base + h * head_elems) {
        return absl::InternalError(absl::StrCat("LayerKvPool: KV head ", h,
                                                " is not at head · capacity rows from head 0"));
      }
    }
    return absl::OkStatus();
  };
  if (cache.mode() == kv::KvMode::kF32) {
    p.dtype = KvDType::kF32;
    absl::Status s = check_heads([&](size_t h) { return cache.HeadKeys(h); }, cap * D);
    if (s.ok()) s = check_heads([&](size_t h) { return cache.HeadValues(h); }, cap * D);
    if (!s.ok()) return s;
    p.k = DevicePtr::FromHost(cache.HeadKeys(0).data());
    p.v = DevicePtr::FromHost(cache.HeadValues(0).data());
  } else {
    p.dtype = KvDType::kInt8;
    p.scale_strides = PoolStrides{block_size, 1, cap};
    absl::Status s = check_heads([&](size_t h) { return cache.HeadKeysI8(h); }, cap * D);
    if (s.ok()) s = check_heads([&](size_t h) { return cache.HeadValuesI8(h); }, cap * D);
    if (s.ok()) s = check_heads([&](size_t h) { return cache.HeadKeyScales(h); }, cap);
    if (s.ok()) s = check_heads([&](size_t h) { return cache.HeadValueScales(h); }, cap);
    if (!s.ok()) return s;
    p.k = DevicePtr::FromHost(cache.HeadKeysI8(0).data());
    p.v = DevicePtr::FromHost(cache.HeadValuesI8(0).data());
    p.k_scale = DevicePtr::FromHost(cache.HeadKeyScales(0).data());
    p.v_scale = DevicePtr::FromHost(cache.HeadValueScales(0).data());
  }
  if (table_.size() < num_blocks) {
    const size_t old = table_.size();
    table_.resize(num_blocks);
    for (size_t b = old; b < num_blocks; ++b) table_[b] = static_cast<uint32_t>(b);
  }
  num_blocks_ = num_blocks;
  pool_ = p;
  return absl::OkStatus();
}

}  // namespace cortiq::qsa
