// CpuBackend (see the header). Kernel numerics are specified by the argument
// structs in backend.h; the comments here say only how the CPU meets them.
#include "core/qsa/cpu_backend.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "core/util/aligned_buffer.h"
#include "spdlog/spdlog.h"

namespace cortiq::qsa {
namespace {

constexpr size_t kAlign = 64;

size_t RoundUp(size_t bytes) { return (bytes + kAlign - 1) / kAlign * kAlign; }

// Per-thread float scratch, grown geometrically and reused.
float* ThreadFloats(size_t n, int slot) {
  thread_local util::AlignedBuffer<float> bufs[2];
  util::AlignedBuffer<float>& b = bufs[slot];
  if (b.size() < n) b.Resize(std::max(n, 2 * b.size()));
  return b.data();
}

// Address arithmetic of the pool (backend.h: KvPool).
inline size_t PoolOffset(const PoolStrides& s, uint32_t phys, size_t in_block, size_t head) {
  return static_cast<size_t>(phys) * s.block + in_block * s.row + head * s.head;
}

}  // namespace

template <typename Fn>
void CpuBackend::ParallelFor(size_t n, Fn&& fn) {
  if (n == 0) return;
  if (pool_ == nullptr || n == 1) {
    fn(size_t{0}, n);
  } else {
    pool_->ParallelFor(n, fn);
  }
}

CpuBackend::~CpuBackend() {
  if (!live_.empty()) {
    spdlog::warn("qsa::CpuBackend destroyed with {} live allocations ({} bytes): freeing them",
                 live_.size(), live_bytes_);
  }
  for (auto& [addr, bytes] : live_) std::free(DevicePtr{addr}.AsHost<void>());
}

// ---------------------------------------------------------------- memory

absl::StatusOr<DevicePtr> CpuBackend::Allocate(size_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("qsa cpu backend: Allocate(0)");
  void* p = std::aligned_alloc(kAlign, RoundUp(bytes));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("qsa cpu backend: out of memory allocating ", bytes, " bytes"));
  }
  std::memset(p, 0, RoundUp(bytes));
  const DevicePtr d = DevicePtr::FromHost(p);
  std::lock_guard<std::mutex> lock(mu_);
  live_.emplace(d.addr, bytes);
  live_bytes_ += bytes;
  ++total_allocations_;
  return d;
}

absl::Status CpuBackend::Free(DevicePtr p) {
  if (p.null()) return absl::OkStatus();
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = live_.find(p.addr);
    if (it == live_.end()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "qsa cpu backend: Free of 0x", absl::Hex(p.addr), " which is not a live allocation"));
    }
    live_bytes_ -= it->second;
    live_.erase(it);
  }
  std::free(p.AsHost<void>());
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToDevice(DevicePtr dst, const void* src, size_t bytes, Stream) {
  if (bytes != 0) std::memcpy(dst.AsHost<void>(), src, bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyToHost(void* dst, DevicePtr src, size_t bytes, Stream) {
  if (bytes != 0) std::memcpy(dst, src.AsHost<const void>(), bytes);
  return absl::OkStatus();
}

absl::Status CpuBackend::CopyOnDevice(DevicePtr dst, DevicePtr src, size_t bytes, Stream) {
  if (bytes != 0) std::memmove(dst.AsHost<void>(), src.AsHost<const void>(), bytes);
  return absl::OkStatus();
}

BackendStats CpuBackend::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return BackendStats{live_.size(), live_bytes_, total_allocations_};
}

// ---------------------------------------------------------------- kernels

absl::Status CpuBackend::Project(const ProjectArgs& a, Stream) {
  const size_t hd = a.head_dim;
  const size_t n_out = a.heads * hd;
  const math::WeightView w{a.w.AsHost<const void>(), a.w_dtype, n_out, a.cols};
  float* out = a.out.AsHost<float>();
  math::MatMul(a.x.AsHost<const float>(), a.rows, w, out, pool_);

  const float* bias = a.bias ? a.bias.AsHost<const float>() : nullptr;
  const float* norm = a.norm ? a.norm.AsHost<const float>() : nullptr;
  const float* inv_freq = a.inv_freq ? a.inv_freq.AsHost<const float>() : nullptr;
  const size_t half = a.rot / 2;
  ParallelFor(a.rows, [&](size_t begin, size_t end) {
    float* cs = ThreadFloats(2 * half + 1, 0);  // cos | sin
    for (size_t r = begin; r < end; ++r) {
      float* y = out + r * n_out;
      if (bias != nullptr) {
        for (size_t i = 0; i < n_out; ++i) y[i] += bias[i];
      }
      if (half > 0) {
        const double pos = static_cast<double>(a.pos0 + r);
        for (size_t i = 0; i < half; ++i) {
          const double angle = pos * static_cast<double>(inv_freq[i]);
          cs[i] = static_cast<float>(std::cos(angle));
          cs[half + i] = static_cast<float>(std::sin(angle));
        }
      }
      for (size_t h = 0; h < a.heads; ++h) {
        float* yh = y + h * hd;
        if (norm != nullptr) math::RmsNorm(yh, norm, a.eps, hd, yh);
        if (half > 0) math::RopeRotateHalf(yh, a.rot, cs, cs + half);
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::StoreBf16(DevicePtr src_f32, DevicePtr dst_bf16, size_t n, Stream) {
  math::ConvertFromF32(src_f32.AsHost<const float>(), math::DType::kBF16, n,
                       dst_bf16.AsHost<void>());
  return absl::OkStatus();
}

absl::Status CpuBackend::PoolBlocks(const PoolArgs& a, Stream) {
  const size_t hd = a.hd;
  const auto* raw = a.raw.AsHost<const uint16_t>();
  auto* pooled = a.pooled.AsHost<uint16_t>();
  const float ratio_f = static_cast<float>(a.ratio);
  ParallelFor(a.end_block - a.first_block, [&](size_t begin, size_t end) {
    float* acc = ThreadFloats(2 * hd, 0);
    float* row = acc + hd;
    for (size_t i = begin; i < end; ++i) {
      const size_t b = a.first_block + i;
      std::fill(acc, acc + hd, 0.0f);
      for (size_t t = 0; t < a.ratio; ++t) {
        math::ConvertToF32(raw + (b * a.ratio + t) * hd, math::DType::kBF16, hd, row);
        for (size_t d = 0; d < hd; ++d) acc[d] += row[d];
      }
      for (size_t d = 0; d < hd; ++d) acc[d] /= ratio_f;
      math::ConvertFromF32(acc, math::DType::kBF16, hd, pooled + b * hd);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::ScoreBlocks(const ScoreArgs& a, Stream) {
  const size_t hd = a.hd;
  // The pooled keys in f32, once for every row (read-only to the workers).
  float* keys = ThreadFloats(std::max<size_t>(1, a.num_blocks * hd), 1);
  math::ConvertToF32(a.pooled.AsHost<const void>(), math::DType::kBF16, a.num_blocks * hd, keys);
  const float* q = a.q.AsHost<const float>();
  float* scores = a.scores.AsHost<float>();
  ParallelFor(a.rows, [&](size_t begin, size_t end) {
    for (size_t r = begin; r < end; ++r) {
      const size_t cur = (a.pos0 + r) / a.ratio;
      const size_t lim = std::min(a.num_blocks, cur);
      const float* qr = q + r * a.n_heads * hd;
      float* sr = scores + r * a.num_blocks;
      for (size_t b = 1; b < lim; ++b) {
        float s = 0.0f;
        for (size_t j = 0; j < a.n_heads; ++j) {
          const float d = math::Dot(qr + j * hd, keys + b * hd, hd);
          s += d > 0.0f ? d : 0.0f;  // relu; NaN → 0
        }
        sr[b] = s;
      }
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::SelectTopK(const SelectArgs& a, Stream) {
  const float* scores = a.scores.AsHost<const float>();
  auto* selected = a.selected.AsHost<uint32_t>();
  auto* counts = a.counts.AsHost<uint32_t>();
  ParallelFor(a.rows, [&](size_t begin, size_t end) {
    thread_local std::vector<uint32_t> cand;
    for (size_t r = begin; r < end; ++r) {
      const size_t cur = (a.pos0 + r) / a.ratio;
      uint32_t* sel = selected + r * a.budget;
      if (cur < a.budget) {  // every block fits: all-visible
        for (size_t b = 0; b <= cur; ++b) sel[b] = static_cast<uint32_t>(b);
        counts[r] = static_cast<uint32_t>(cur + 1);
        continue;
      }
      const float* sr = scores + r * a.ld;
      const size_t k = a.budget - 2;  // besides the sink and the current block
      // Geometric growth: a decode step allocates only when the context
      // doubles, never once per new block.
      if (cand.capacity() < cur - 1) cand.reserve(std::max(cur - 1, 2 * cand.capacity()));
      cand.resize(cur - 1);
      for (size_t b = 1; b < cur; ++b) cand[b - 1] = static_cast<uint32_t>(b);
      std::partial_sort(cand.begin(), cand.begin() + k, cand.end(), [sr](uint32_t x, uint32_t y) {
        return sr[x] > sr[y] || (sr[x] == sr[y] && x < y);
      });
      std::sort(cand.begin(), cand.begin() + k);
      sel[0] = 0;
      std::copy(cand.begin(), cand.begin() + k, sel + 1);
      sel[k + 1] = static_cast<uint32_t>(cur);
      counts[r] = static_cast<uint32_t>(a.budget);
    }
  });
  return absl::OkStatus();
}

absl::Status CpuBackend::AttendSelected(const AttendArgs& a, Stream) {
  const KvPool& pool = a.pool;
  const size_t D = pool.head_dim;
  const size_t nkv = pool.num_kv_heads;
  const size_t G = a.nq / nkv;  // query heads per KV head
  const size_t bs = pool.block_size;
  const float scale = a.scale != 0.0f ? a.scale : 1.0f / std::sqrt(static_cast<float>(D));
  const auto* table = a.table.ids.AsHost<const uint32_t>();
  const auto* selected = a.selected.AsHost<const uint32_t>();
  const auto* counts = a.counts.AsHost<const uint32_t>();
  const bool i8 = pool.dtype == KvDType::kInt8;

  ParallelFor(a.rows * nkv, [&](size_t begin, size_t end) {
    for (size_t task = begin; task < end; ++task) {
      const size_t r = task / nkv, g = task % nkv;
      const size_t visible = a.pos0 + r + 1;
      const uint32_t* sel = selected + r * a.budget;
      const size_t nsel = counts[r];
      // Compacted length: every selected block's positions, clipped to the row.
      size_t n = 0;
      for (size_t i = 0; i < nsel; ++i) {
        const size_t lo = static_cast<size_t>(sel[i]) * a.ratio;
        n += std::min(lo + a.ratio, visible) - lo;
      }
      float* p = ThreadFloats(G * n, 0);  // head j's logits / probs at [j·n, (j+1)·n)
      const float* q = a.q.AsHost<const float>() + (r * a.nq + g * G) * D;
      float* o = a.out.AsHost<float>() + (r * a.nq + g * G) * D;

      // Visits the selected positions in ascending order: fn(i, t, offset of
      // row t of head g in elements, offset of its scale).
      auto for_each_pos = [&](auto&& fn) {
        size_t i = 0;
        for (size_t s = 0; s < nsel; ++s) {
          const size_t lo = static_cast<size_t>(sel[s]) * a.ratio;
          const size_t hi = std::min(lo + a.ratio, visible);
          for (size_t t = lo; t < hi; ++t, ++i) {
            const uint32_t phys = table[t / bs];
            fn(i, PoolOffset(pool.strides, phys, t % bs, g),
               i8 ? PoolOffset(pool.scale_strides, phys, t % bs, g) : 0);
          }
        }
      };

      // Pass 1 over K (AttendGroup's order: rows outside, heads inside).
      if (!i8) {
        const float* k = pool.k.AsHost<const float>();
        for_each_pos([&](size_t i, size_t off, size_t) {
          for (size_t j = 0; j < G; ++j) p[j * n + i] = math::Dot(q + j * D, k + off, D) * scale;
        });
      } else {
        const int8_t* k = pool.k.AsHost<const int8_t>();
        const float* sk = pool.k_scale.AsHost<const float>();
        for_each_pos([&](size_t i, size_t off, size_t soff) {
          for (size_t j = 0; j < G; ++j) {
            p[j * n + i] = (sk[soff] * math::DotI8(q + j * D, k + off, D)) * scale;
          }
        });
      }
      std::fill(o, o + G * D, 0.0f);
      for (size_t j = 0; j < G; ++j) math::Softmax(p + j * n, n);
      // Pass 2 over V.
      if (!i8) {
        const float* v = pool.v.AsHost<const float>();
        for_each_pos([&](size_t i, size_t off, size_t) {
          for (size_t j = 0; j < G; ++j) math::Axpy(p[j * n + i], v + off, o + j * D, D);
        });
      } else {
        const int8_t* v = pool.v.AsHost<const int8_t>();
        const float* sv = pool.v_scale.AsHost<const float>();
        for_each_pos([&](size_t i, size_t off, size_t soff) {
          for (size_t j = 0; j < G; ++j) {
            math::AxpyI8(p[j * n + i] * sv[soff], v + off, o + j * D, D);
          }
        });
      }
    }
  });
  return absl::OkStatus();
}

}  // namespace cortiq::qsa
