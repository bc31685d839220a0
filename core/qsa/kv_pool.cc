// LayerKvPool (see the header).
#include "core/qsa/kv_pool.h"

#include <limits>

#include "absl/strings/str_cat.h"
#include "core/util/status_macros.h"

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
  // Head h's rows start h · stride elements after head 0's: capacity ·
  // row_elems for a plain buffer, the page-aligned stride of a paged one
  // (kv_rows.h: 1 MiB row buffers and up, so every long session of a real
  // model). The stride is read off the cache's own views, then checked for
  // every head before anything relies on it.
  auto head_stride = [&](auto view, size_t row_elems, size_t* stride) -> absl::Status {
    const auto* base = view(0).data();
    *stride = cap * row_elems;
    if (H > 1) {
      const auto* next = view(1).data();
      if (next < base || static_cast<size_t>(next - base) < cap * row_elems) {
        return absl::InternalError("LayerKvPool: KV head 1's rows overlap head 0's");
      }
      *stride = static_cast<size_t>(next - base);
    }
    for (size_t h = 2; h < H; ++h) {
      if (view(h).data() != base + h * *stride) {
        return absl::InternalError(
            absl::StrCat("LayerKvPool: KV head ", h, " is not ", h, " head strides from head 0"));
      }
    }
    return absl::OkStatus();
  };
  // Keys and values share one stride (backend.h: KvPool::strides).
  auto shared_stride = [&](auto keys, auto values, size_t row_elems,
                           size_t* stride) -> absl::Status {
    size_t vs = 0;
    CORTIQ_RETURN_IF_ERROR(head_stride(keys, row_elems, stride));
    CORTIQ_RETURN_IF_ERROR(head_stride(values, row_elems, &vs));
    if (vs != *stride) {
      return absl::InternalError(absl::StrCat("LayerKvPool: key and value head strides differ (",
                                              *stride, " and ", vs, " elements)"));
    }
    return absl::OkStatus();
  };
  size_t stride = 0;
  if (cache.mode() == kv::KvMode::kF32) {
    p.dtype = KvDType::kF32;
    CORTIQ_RETURN_IF_ERROR(shared_stride([&](size_t h) { return cache.HeadKeys(h); },
                                         [&](size_t h) { return cache.HeadValues(h); }, D,
                                         &stride));
    p.k = DevicePtr::FromHost(cache.HeadKeys(0).data());
    p.v = DevicePtr::FromHost(cache.HeadValues(0).data());
  } else {
    p.dtype = KvDType::kInt8;
    size_t scale_stride = 0;
    CORTIQ_RETURN_IF_ERROR(shared_stride([&](size_t h) { return cache.HeadKeysI8(h); },
                                         [&](size_t h) { return cache.HeadValuesI8(h); }, D,
                                         &stride));
    CORTIQ_RETURN_IF_ERROR(shared_stride([&](size_t h) { return cache.HeadKeyScales(h); },
                                         [&](size_t h) { return cache.HeadValueScales(h); }, 1,
                                         &scale_stride));
    p.scale_strides = PoolStrides{block_size, 1, scale_stride};
    p.k = DevicePtr::FromHost(cache.HeadKeysI8(0).data());
    p.v = DevicePtr::FromHost(cache.HeadValuesI8(0).data());
    p.k_scale = DevicePtr::FromHost(cache.HeadKeyScales(0).data());
    p.v_scale = DevicePtr::FromHost(cache.HeadValueScales(0).data());
  }
  p.strides = PoolStrides{block_size * D, D, stride};
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
