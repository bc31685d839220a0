// GGUF reader and writer: round trips of every metadata type and tensor
// type, the dequantizers against llama.cpp's (fixtures from gguf-py,
// tests/model/testdata/gguf_quants), and one hand-built file per defect, each
// checked for its code and a message naming the path and the field.
#include "core/model/gguf.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "core/model/gguf_writer.h"

namespace cortiq::model {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// ---- a byte builder for hand-made headers

struct Bytes {
  std::string s;
  template <typename T>
  Bytes& Put(T v) {
    char b[sizeof(T)];
    std::memcpy(b, &v, sizeof(T));
    s.append(b, sizeof(T));
    return *this;
  }
  Bytes& Str(std::string_view v) {
    Put<uint64_t>(v.size());
    s.append(v);
    return *this;
  }
  Bytes& Header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    s.append("GGUF");
    return Put<uint32_t>(version).Put<uint64_t>(n_tensors).Put<uint64_t>(n_kv);
  }
  Bytes& KvU32(std::string_view key, uint32_t v) {
    return Str(key).Put<uint32_t>(4).Put<uint32_t>(v);
  }
  Bytes& Tensor(std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    Str(name).Put<uint32_t>(static_cast<uint32_t>(ne.size()));
    for (uint64_t d : ne) Put<uint64_t>(d);
    return Put<uint32_t>(type).Put<uint64_t>(offset);
  }
  Bytes& PadTo(size_t a) {
    while (s.size() % a != 0) s.push_back('\0');
    return *this;
  }
  Bytes& Zeros(size_t n) {
    s.append(n, '\0');
    return *this;
  }
};

absl::StatusOr<GgufFile> Parse(const std::string& bytes) {
  return GgufFile::FromBuffer(bytes, "mem.gguf");
}

// A refusal with DATA_LOSS whose message starts with the label and holds `what`.
void ExpectDataLoss(const std::string& bytes, const std::string& what) {
  auto f = Parse(bytes);
  ASSERT_FALSE(f.ok()) << "accepted; expected: " << what;
  EXPECT_TRUE(absl::IsDataLoss(f.status())) << f.status();
  EXPECT_THAT(std::string(f.status().message()), StartsWith("mem.gguf: "));
  EXPECT_THAT(std::string(f.status().message()), HasSubstr(what));
}

std::vector<float> Ramp(size_t n, float scale = 0.01f) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = scale * float(int(i % 37) - 18);
  return v;
}

// ---- round trips

TEST(GgufWriterTest, MetadataOfEveryTypeRoundTrips) {
  GgufWriter w;
  ASSERT_TRUE(w.AddU8("u8", 200).ok());
  ASSERT_TRUE(w.AddI8("i8", -100).ok());
  ASSERT_TRUE(w.AddU16("u16", 60000).ok());
  ASSERT_TRUE(w.AddI16("i16", -30000).ok());
  ASSERT_TRUE(w.AddU32("u32", 4000000000u).ok());
  ASSERT_TRUE(w.AddI32("i32", -2000000000).ok());
  ASSERT_TRUE(w.AddU64("u64", 1ull << 40).ok());
  ASSERT_TRUE(w.AddI64("i64", -(1ll << 40)).ok());
  ASSERT_TRUE(w.AddF32("f32", 1.5f).ok());
  ASSERT_TRUE(w.AddF64("f64", 1e-300).ok());
  ASSERT_TRUE(w.AddBool("bool", true).ok());
  ASSERT_TRUE(w.AddString("str", std::string("a\0b", 3)).ok());
  const std::vector<std::string> strs = {"x", "", "yz"};
  ASSERT_TRUE(w.AddStringArray("strs", strs).ok());
  const std::vector<int32_t> ints = {1, -2, 3};
  ASSERT_TRUE(w.AddI32Array("ints", ints).ok());
  const std::vector<float> floats = {0.5f, -0.25f};
  ASSERT_TRUE(w.AddF32Array("floats", floats).ok());
  const uint16_t u16s[] = {7, 65535};
  ASSERT_TRUE(
      w.AddArray("u16s", GgufValueType::kU16, 2, {reinterpret_cast<const char*>(u16s), 4}).ok());
  EXPECT_TRUE(absl::IsAlreadyExists(w.AddU8("u8", 1)));
  EXPECT_TRUE(absl::IsInvalidArgument(w.AddArray("bad", GgufValueType::kU16, 3, "abcd")));
  EXPECT_TRUE(absl::IsInvalidArgument(w.AddArray("bad", GgufValueType::kString, 0, "")));

  auto f = Parse(w.Serialize());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->keys().size(), 16u);
  EXPECT_EQ(f->keys()[0], "u8");
  EXPECT_EQ(*f->GetInt("u8"), 200);
  EXPECT_EQ(*f->GetInt("i8"), -100);
  EXPECT_EQ(*f->GetInt("u16"), 60000);
  EXPECT_EQ(*f->GetInt("i16"), -30000);
  EXPECT_EQ(*f->GetU32("u32"), 4000000000u);
  EXPECT_EQ(*f->GetI32("i32"), -2000000000);
  EXPECT_EQ(*f->GetU64("u64"), 1ull << 40);
  EXPECT_EQ(*f->GetInt("i64"), -(1ll << 40));
  EXPECT_EQ(*f->GetF32("f32"), 1.5f);
  EXPECT_EQ(*f->GetFloat("f32"), 1.5);
  EXPECT_EQ(*f->GetFloat("f64"), 1e-300);
  EXPECT_EQ(*f->GetBool("bool"), true);
  EXPECT_EQ(*f->GetString("str"), std::string("a\0b", 3));
  EXPECT_EQ(*f->GetStringArray("strs"), strs);
  EXPECT_EQ(*f->GetIntArray("ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_EQ(*f->GetFloatArray("floats"), floats);
  EXPECT_EQ(*f->GetIntArray("u16s"), (std::vector<int64_t>{7, 65535}));
  EXPECT_EQ(*f->ArrayLength("strs"), 3u);
  EXPECT_EQ(*f->ArrayElementType("u16s"), GgufValueType::kU16);
  EXPECT_EQ(f->TypeOf("f64"), GgufValueType::kF64);
  EXPECT_FALSE(f->TypeOf("nope").has_value());

  // Errors name the key and both types.
  auto s = f->GetU32("str");
  EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
  EXPECT_EQ(s.status().message(), "mem.gguf: metadata key 'str' has type string, expected u32");
  EXPECT_THAT(std::string(f->GetString("ints").status().message()),
              HasSubstr("'ints' has type array of i32, expected string"));
  EXPECT_TRUE(absl::IsInvalidArgument(f->GetStringArray("ints").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(f->GetFloatArray("ints").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(f->GetIntArray("floats").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(f->GetInt("f32").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(f->GetFloat("u8").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(f->GetBool("u8").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(f->ArrayLength("u8").status()));
  auto missing = f->GetString("general.architecture");
  EXPECT_TRUE(absl::IsNotFound(missing.status()));
  EXPECT_EQ(missing.status().message(), "mem.gguf: metadata key 'general.architecture' not found");
}

TEST(GgufWriterTest, U64AboveInt64IsOutOfRangeForGetInt) {
  GgufWriter w;
  ASSERT_TRUE(w.AddU64("big", ~0ull).ok());
  auto f = Parse(w.Serialize());
  ASSERT_TRUE(f.ok());
  EXPECT_EQ(*f->GetU64("big"), ~0ull);
  EXPECT_TRUE(absl::IsInvalidArgument(f->GetInt("big").status()));
}

TEST(GgufWriterTest, TensorsOfEveryInPlaceTypeRoundTripInPyTorchOrder) {
  for (uint32_t alignment : {32u, 64u, 1u}) {
    GgufWriter w(alignment);
    const std::vector<float> v = Ramp(3 * 64);
    ASSERT_TRUE(w.AddTensor("f32", math::DType::kF32, {3, 64}, v).ok());
    ASSERT_TRUE(w.AddTensor("f16", math::DType::kF16, {3, 64}, v).ok());
    ASSERT_TRUE(w.AddTensor("bf16", math::DType::kBF16, {3, 64}, v).ok());
    ASSERT_TRUE(w.AddTensor("q8", math::DType::kQ8_0, {3, 64}, v).ok());
    ASSERT_TRUE(w.AddTensor("vec", math::DType::kF32, {5}, std::span(v).first(5)).ok());
    ASSERT_TRUE(w.AddTensor("cube", math::DType::kF32, {2, 3, 32}, v).ok());
    EXPECT_TRUE(absl::IsInvalidArgument(
        w.AddTensor("q8bad", math::DType::kQ8_0, {2, 48}, std::span(v).first(96))));
    EXPECT_TRUE(
        absl::IsAlreadyExists(w.AddTensor("f32", math::DType::kF32, {1}, std::span(v).first(1))));
    auto f = Parse(w.Serialize());
    ASSERT_TRUE(f.ok()) << f.status();
    EXPECT_EQ(f->alignment(), alignment == 1 ? 1u : alignment);
    EXPECT_EQ(f->data_start() % f->alignment(), 0u);
    for (const char* name : {"f32", "f16", "bf16", "q8"}) {
      auto t = f->Get(name);
      ASSERT_TRUE(t.ok()) << t.status();
      EXPECT_EQ(t->shape, (std::vector<int64_t>{3, 64})) << name;
      EXPECT_EQ(f->Info(name)->ne, (std::vector<int64_t>{64, 3})) << name;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(t->data) % std::min(f->alignment(), 64u), 0u);
      std::vector<float> back(v.size()), want(v.size());
      std::vector<uint8_t> enc(3 * math::RowBytes(t->dtype, 64));
      math::ConvertFromF32(v.data(), t->dtype, v.size(), enc.data());
      math::ConvertToF32(enc.data(), t->dtype, v.size(), want.data());
      ASSERT_EQ(t->nbytes, enc.size()) << name;
      math::ConvertToF32(t->data, t->dtype, v.size(), back.data());
      EXPECT_EQ(back, want) << name;
    }
    EXPECT_EQ(f->Get("q8")->dtype, math::DType::kQ8_0);
    EXPECT_EQ(f->Get("cube")->shape, (std::vector<int64_t>{2, 3, 32}));
    EXPECT_EQ(f->Get("vec")->shape, (std::vector<int64_t>{5}));
    EXPECT_TRUE(absl::IsNotFound(f->Get("nope").status()));
  }
}

TEST(GgufWriterTest, RawTensorsOfOtherTypesOpenButAreNotReadInPlace) {
  GgufWriter w;
  ASSERT_TRUE(w.AddRawTensor("blk.0.attn_q.weight", ggml_type::kIQ2_XXS, {2, 256},
                             std::string(2 * 66, '\x01'))
                  .ok());
  ASSERT_TRUE(w.AddRawTensor("k", ggml_type::kQ4_K, {1, 256}, std::string(144, '\0')).ok());
  EXPECT_TRUE(absl::IsInvalidArgument(
      w.AddRawTensor("bad", ggml_type::kQ4_K, {1, 128}, std::string(72, '\0'))));
  EXPECT_TRUE(absl::IsInvalidArgument(w.AddRawTensor("bad", 4, {1, 32}, std::string(18, '\0'))));
  auto f = Parse(w.Serialize());
  ASSERT_TRUE(f.ok()) << f.status();
  auto q = f->Get("blk.0.attn_q.weight");
  EXPECT_TRUE(absl::IsUnimplemented(q.status()));
  EXPECT_EQ(q.status().message(),
            "mem.gguf: tensor 'blk.0.attn_q.weight' has type IQ2_XXS, which is not supported "
            "(supported: F32, F16, BF16, Q8_0, Q4_0, Q4_K, Q6_K)");
  EXPECT_TRUE(absl::IsUnimplemented(f->Get("k").status()));
  EXPECT_THAT(std::string(f->Get("k").status().message()), HasSubstr("not read in place"));
  EXPECT_EQ(f->RawData("k").size(), 144u);
  EXPECT_EQ(f->Info("k")->type, ggml_type::kQ4_K);
}

TEST(GgufFileTest, OpenMapsAFileAndReportsMissingFiles) {
  const std::string path =
      (std::filesystem::temp_directory_path() / ("gguf_test_" + std::to_string(getpid()) + ".gguf"))
          .string();
  GgufWriter w;
  ASSERT_TRUE(w.AddString("general.architecture", "qwen3").ok());
  ASSERT_TRUE(w.AddTensor("t", math::DType::kF32, {4}, Ramp(4)).ok());
  ASSERT_TRUE(w.Write(path).ok());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  GgufFile moved = std::move(*f);
  EXPECT_EQ(*moved.GetString("general.architecture"), "qwen3");
  const float* d = static_cast<const float*>(moved.Get("t")->data);
  EXPECT_EQ(d[3], Ramp(4)[3]);
  std::filesystem::remove(path);
  auto none = GgufFile::Open(path);
  EXPECT_TRUE(absl::IsNotFound(none.status()));
  EXPECT_THAT(std::string(none.status().message()), StartsWith(path));
}

// ---- dequantizers against gguf-py

std::string ReadFixture(const std::string& name) {
  std::ifstream in(std::string(CORTIQ_SOURCE_DIR) + "/tests/model/testdata/gguf_quants/" + name,
                   std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

TEST(GgufDequantizeTest, MatchesLlamaCppBitForBit) {
  struct Case {
    const char* name;
    uint32_t type;
  };
  for (const Case& c : {Case{"q4_0", ggml_type::kQ4_0}, Case{"q4_k", ggml_type::kQ4_K},
                        Case{"q6_k", ggml_type::kQ6_K}}) {
    const std::string blocks = ReadFixture(std::string(c.name) + ".blocks");
    const std::string want = ReadFixture(std::string(c.name) + ".f32");
    ASSERT_FALSE(blocks.empty()) << c.name;
    const GgmlTypeTraits* t = GgmlTypeInfo(c.type);
    ASSERT_EQ(blocks.size() % t->type_size, 0u);
    const size_t n = blocks.size() / t->type_size * t->block_size;
    ASSERT_EQ(want.size(), n * 4) << c.name;
    std::vector<float> got(n);
    ASSERT_TRUE(DequantizeGgufRows(c.type, blocks.data(), n, got.data()));
    size_t mismatches = 0;
    for (size_t i = 0; i < n; ++i) {
      float w;
      std::memcpy(&w, want.data() + 4 * i, 4);
      if (std::memcmp(&w, &got[i], 4) != 0 && ++mismatches <= 3) {
        ADD_FAILURE() << c.name << " value " << i << ": got " << got[i] << " want " << w;
      }
    }
    EXPECT_EQ(mismatches, 0u) << c.name;
  }
  float out[256];
  EXPECT_FALSE(DequantizeGgufRows(ggml_type::kIQ2_XXS, out, 256, out));
}

TEST(GgufDequantizeTest, TypeTable) {
  EXPECT_EQ(GgmlTypeName(ggml_type::kQ6_K), "Q6_K");
  EXPECT_EQ(GgmlTypeInfo(ggml_type::kQ6_K)->type_size, 210u);
  EXPECT_EQ(GgmlTypeInfo(4), nullptr);
  EXPECT_EQ(GgmlTypeInfo(1000), nullptr);
  EXPECT_EQ(GgmlTypeName(1000), "type 1000");
  for (math::DType d :
       {math::DType::kF32, math::DType::kF16, math::DType::kBF16, math::DType::kQ8_0}) {
    EXPECT_EQ(InPlaceDType(GgmlTypeOf(d)), d);
  }
  EXPECT_TRUE(GgufDequantizable(ggml_type::kQ4_K));
  EXPECT_FALSE(GgufDequantizable(ggml_type::kQ5_K));
}

// ---- malformed files

// A valid file: two keys, two tensors (F32 [4] at 0, F32 [8] at 32).
std::string Valid() {
  Bytes b;
  b.Header(2, 2).KvU32("a.b", 7).Str("name").Put<uint32_t>(8).Str("x");
  b.Tensor("t0", {4}, ggml_type::kF32, 0).Tensor("t1", {8}, ggml_type::kF32, 32);
  b.PadTo(32).Zeros(32 + 32);
  return b.s;
}

TEST(GgufMalformedTest, ValidBaseline) {
  auto f = Parse(Valid());
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->tensors().size(), 2u);
}

TEST(GgufMalformedTest, EveryTruncationIsDataLoss) {
  const std::string full = Valid();
  auto f = Parse(full);
  ASSERT_TRUE(f.ok());
  const size_t end = f->data_start() + 32 + 32;  // the last tensor's last byte + 1
  for (size_t n = 0; n < end; ++n) {
    auto t = Parse(full.substr(0, n));
    ASSERT_FALSE(t.ok()) << "prefix of " << n << " bytes accepted";
    ASSERT_TRUE(absl::IsDataLoss(t.status())) << n << ": " << t.status();
    ASSERT_THAT(std::string(t.status().message()), StartsWith("mem.gguf: "));
  }
}

TEST(GgufMalformedTest, HeaderDefects) {
  std::string bad = Valid();
  bad[0] = 'X';
  ExpectDataLoss(bad, "not a GGUF file");
  ExpectDataLoss(Bytes().Header(0, 0, 1).s, "GGUF version 1 is not supported");
  ExpectDataLoss(Bytes().Header(0, 0, 4).s, "GGUF version 4 is not supported");
  ExpectDataLoss(Bytes().Header(0, ~0ull).s, "metadata count 18446744073709551615 cannot fit");
  ExpectDataLoss(Bytes().Header(1ull << 40, 0).Zeros(64).s, "tensor count 1099511627776");
  ExpectDataLoss(Bytes().Header(0, 1).Put<uint64_t>(~0ull).Zeros(16).s,
                 "reading the key of metadata entry 0");
  ExpectDataLoss(Bytes().Header(0, 1).Str("").Put<uint32_t>(4).Put<uint32_t>(1).s, "empty key");
  ExpectDataLoss(Bytes().Header(0, 1).Str("k").Put<uint32_t>(13).Zeros(8).s,
                 "metadata key 'k': unknown value type 13");
  ExpectDataLoss(Bytes().Header(0, 1).Str("k").Put<uint32_t>(8).Put<uint64_t>(1000).s,
                 "the value of metadata key 'k'");
  ExpectDataLoss(
      Bytes().Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(99).Put<uint64_t>(0).s,
      "unknown array element type 99");
  ExpectDataLoss(Bytes().Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(9).Put<uint64_t>(0).s,
                 "arrays of arrays");
  ExpectDataLoss(
      Bytes().Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(4).Put<uint64_t>(1ull << 62).s,
      "array of 4611686018427387904 x u32 cannot fit");
  ExpectDataLoss(
      Bytes().Header(0, 1).Str("k").Put<uint32_t>(9).Put<uint32_t>(8).Put<uint64_t>(1ull << 40).s,
      "array of 1099511627776 strings cannot fit");
  ExpectDataLoss(Bytes().Header(0, 1).Str("k").Put<uint32_t>(7).Put<uint8_t>(2).s, "bool value 2");
  ExpectDataLoss(Bytes().Header(0, 2).KvU32("k", 1).KvU32("k", 2).s,
                 "metadata key 'k': appears twice");
  ExpectDataLoss(Bytes().Header(0, 1).KvU32("general.alignment", 48).s,
                 "general.alignment 48 is not a power of two");
  ExpectDataLoss(Bytes().Header(0, 1).KvU32("general.alignment", 0).s, "is not a power of two");
  ExpectDataLoss(
      Bytes().Header(0, 1).Str("general.alignment").Put<uint32_t>(10).Put<uint64_t>(32).s,
      "'general.alignment' has type u64, expected u32");
}

TEST(GgufMalformedTest, TensorInfoDefects) {
  auto one = [](std::string_view name, std::vector<uint64_t> ne, uint32_t type, uint64_t offset,
                size_t data = 64) {
    return Bytes().Header(1, 0).Tensor(name, ne, type, offset).PadTo(32).Zeros(data).s;
  };
  ExpectDataLoss(one("", {4}, 0, 0), "tensor 0 has an empty name");
  ExpectDataLoss(Bytes().Header(1, 0).Put<uint64_t>(65537).Zeros(70000).s,
                 "name of 65537 bytes exceeds the limit of 65536");
  ExpectDataLoss(one("t", {}, 0, 0), "tensor 't': n_dims 0 outside [1, 4]");
  ExpectDataLoss(one("t", {1, 1, 1, 1, 1}, 0, 0), "n_dims 5 outside [1, 4]");
  ExpectDataLoss(one("t", {4, 0}, 0, 0), "tensor 't': dim 1 is 0");
  ExpectDataLoss(one("t", {1ull << 63}, 0, 0), "dim 0 is 9223372036854775808");
  ExpectDataLoss(one("t", {1ull << 32, 1ull << 32}, 0, 0), "element count overflows");
  ExpectDataLoss(one("t", {1ull << 62}, 0, 0), "byte count overflows");
  ExpectDataLoss(one("t", {32}, 4, 0), "tensor 't': unknown ggml type 4");
  ExpectDataLoss(one("t", {32}, 99, 0), "unknown ggml type 99");
  ExpectDataLoss(one("t", {48}, ggml_type::kQ8_0, 0),
                 "row of 48 values is not a whole number "
                 "of Q8_0 blocks of 32");
  ExpectDataLoss(one("t", {4}, 0, 16), "data offset 16 is not a multiple of the alignment 32");
  ExpectDataLoss(one("t", {32}, 0, 0, 100),
                 "tensor 't': data [0, +128) is outside the data "
                 "section of 100 bytes");
  ExpectDataLoss(one("t", {4}, 0, 1ull << 63), "is outside the data section");
  ExpectDataLoss(Bytes().Header(1, 0).Tensor("t", {4}, 0, 0).s + "x",
                 "data section would start at byte");
  ExpectDataLoss(
      Bytes().Header(2, 0).Tensor("a", {16}, 0, 0).Tensor("b", {4}, 0, 32).PadTo(32).Zeros(64).s,
      "tensor 'b': data at offset 32 overlaps tensor 'a' [0, 64)");
  ExpectDataLoss(
      Bytes().Header(2, 0).Tensor("a", {4}, 0, 0).Tensor("a", {4}, 0, 32).PadTo(32).Zeros(64).s,
      "tensor 'a': appears twice");
  // Zero tensors and no data section: fine.
  EXPECT_TRUE(Parse(Bytes().Header(0, 0).s).ok());
  EXPECT_TRUE(absl::IsDataLoss(Parse("").status()));
}

}  // namespace
}  // namespace cortiq::model
