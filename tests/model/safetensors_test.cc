// SafetensorsFile / SafetensorsWriter: round trips of F32/BF16/F16, and one
// test per defect on files the test writes, each checking the status code and
// that the message names the file and (where there is one) the tensor.
#include "core/model/safetensors.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "core/math/kernels.h"

namespace cortiq::model {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = (fs::path(::testing::TempDir()) / "safetensors_test_XXXXXX").string();
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& name) const { return (dir_ / name).string(); }

  static void WriteFile(const std::string& path, const std::string& bytes) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good());
  }

  // A hand-made file: length field (the header's true length unless
  // overridden), header text, data bytes.
  static std::string RawFile(const std::string& header, const std::string& data,
                             std::optional<uint64_t> length_field = std::nullopt) {
    uint64_t n = length_field.value_or(header.size());
    std::string out(reinterpret_cast<const char*>(&n), 8);
    return out + header + data;
  }

  // Opens `bytes` written to a file and expects failure with `code`, the
  // file's path and every piece in the message.
  void ExpectOpenError(const std::string& bytes, absl::StatusCode code,
                       std::initializer_list<std::string> pieces) {
    const std::string path = Path("bad.safetensors");
    WriteFile(path, bytes);
    auto r = SafetensorsFile::Open(path);
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(path));
    for (const std::string& p : pieces) {
      EXPECT_THAT(std::string(r.status().message()), HasSubstr(p));
    }
  }

  // A valid two-tensor file image.
  static std::string ValidImage() {
    SafetensorsWriter w;
    std::vector<float> a(12), b(6);
    for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>(i);
    for (size_t i = 0; i < b.size(); ++i) b[i] = -static_cast<float>(i);
    EXPECT_TRUE(w.AddF32("a.weight", math::DType::kF32, {3, 4}, a).ok());
    EXPECT_TRUE(w.AddF32("b.weight", math::DType::kBF16, {2, 3}, b).ok());
    return w.Serialize();
  }

  fs::path dir_;
};

std::vector<float> ToF32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  math::ConvertToF32(v.data, v.dtype, out.size(), out.data());
  return out;
}

// ---- Round trips ----

TEST_F(SafetensorsTest, RoundTripsF32Bf16F16) {
  // Exactly representable in all three dtypes.
  const std::vector<float> values = {0.0f, 1.0f, -2.0f, 0.5f, 1.25f, -3.75f, 96.0f, -0.125f};
  SafetensorsWriter w;
  ASSERT_TRUE(w.AddF32("t.f32", math::DType::kF32, {2, 4}, values).ok());
  ASSERT_TRUE(w.AddF32("t.bf16", math::DType::kBF16, {4, 2}, values).ok());
  ASSERT_TRUE(w.AddF32("t.f16", math::DType::kF16, {8}, values).ok());
  w.SetMetadata("format", "pt");
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  EXPECT_FALSE(fs::exists(path + ".tmp"));

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(f->TensorNames(), std::vector<std::string>({"t.bf16", "t.f16", "t.f32"}));
  EXPECT_EQ(f->metadata().at("format"), "pt");

  struct Case {
    const char* name;
    math::DType dtype;
    std::vector<int64_t> shape;
  };
  for (const Case& c :
       {Case{"t.f32", math::DType::kF32, {2, 4}}, Case{"t.bf16", math::DType::kBF16, {4, 2}},
        Case{"t.f16", math::DType::kF16, {8}}}) {
    auto v = f->Get(c.name);
    ASSERT_TRUE(v.ok()) << v.status();
    EXPECT_EQ(v->name, c.name);
    EXPECT_EQ(v->dtype, c.dtype);
    EXPECT_EQ(v->shape, c.shape);
    EXPECT_EQ(v->nbytes, values.size() * math::DTypeSize(c.dtype));
    EXPECT_EQ(reinterpret_cast<uintptr_t>(v->data) % math::DTypeSize(c.dtype), 0u) << c.name;
    EXPECT_EQ(ToF32(*v), values) << c.name;
  }
}

TEST_F(SafetensorsTest, WriterRoundsToNearestEven) {
  // 1 + 2^-8 lies exactly between two bf16 values: ties to even (1.0);
  // 1 + 3 * 2^-9 rounds up to 1 + 2^-7.
  const std::vector<float> values = {1.0f + 0x1.0p-8f, 1.0f + 3 * 0x1.0p-9f};
  SafetensorsWriter w;
  ASSERT_TRUE(w.AddF32("x", math::DType::kBF16, {2}, values).ok());
  const std::string path = Path("r.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  auto v = f->Get("x");
  ASSERT_TRUE(v.ok());
  EXPECT_EQ(ToF32(*v), std::vector<float>({1.0f, 1.0f + 0x1.0p-7f}));
}

TEST_F(SafetensorsTest, RawBytesAndZeroSizeTensors) {
  SafetensorsWriter w;
  const uint16_t raw[3] = {0x3f80, 0x4000, 0xc040};  // bf16 1, 2, -3
  ASSERT_TRUE(w.Add("raw", math::DType::kBF16, {3},
                    std::string_view(reinterpret_cast<const char*>(raw), sizeof(raw)))
                  .ok());
  ASSERT_TRUE(w.Add("empty", math::DType::kF32, {0, 7}, "").ok());
  ASSERT_TRUE(w.Add("scalar", math::DType::kF32, {}, std::string("\0\0\x80\x3f", 4)).ok());
  const std::string path = Path("raw.safetensors");
  ASSERT_TRUE(w.Write(path).ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(ToF32(*f->Get("raw")), std::vector<float>({1.0f, 2.0f, -3.0f}));
  EXPECT_EQ(f->Get("empty")->nbytes, 0u);
  EXPECT_EQ(f->Get("empty")->numel(), 0);
  EXPECT_EQ(ToF32(*f->Get("scalar")), std::vector<float>({1.0f}));
}

TEST_F(SafetensorsTest, ViewsSurviveMovingTheFile) {
  const std::string path = Path("m.safetensors");
  WriteFile(path, ValidImage());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  TensorView a = *f->Get("a.weight");
  SafetensorsFile moved = std::move(*f);
  SafetensorsFile moved_again = std::move(moved);
  EXPECT_EQ(ToF32(a)[11], 11.0f);
  EXPECT_EQ(moved_again.Get("a.weight")->data, a.data);
  math::WeightView wv = a.AsWeightView();
  EXPECT_EQ(wv.rows, 3u);
  EXPECT_EQ(wv.cols, 4u);
  EXPECT_EQ(wv.dtype, math::DType::kF32);
}

TEST_F(SafetensorsTest, AcceptsHeaderPaddingAndMetadata) {
  const std::string header =
      R"({"__metadata__":{"format":"pt"},"x":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})"
      "        ";
  const std::string path = Path("pad.safetensors");
  WriteFile(path, RawFile(header, std::string(8, '\0')));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->Has("x"));
  EXPECT_FALSE(f->Has("__metadata__"));
}

// ---- Writer errors ----

TEST_F(SafetensorsTest, WriterRejectsBadInput) {
  SafetensorsWriter w;
  EXPECT_EQ(w.Add("x", math::DType::kF32, {2, 2}, std::string(15, '\0')).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("x", math::DType::kF32, {-1}, "").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(w.Add("", math::DType::kF32, {0}, "").code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> v(3);
  EXPECT_EQ(w.AddF32("y", math::DType::kF16, {4}, v).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(w.AddF32("y", math::DType::kF16, {3}, v).ok());
  EXPECT_EQ(w.AddF32("y", math::DType::kF16, {3}, v).code(), absl::StatusCode::kAlreadyExists);
  absl::Status s = w.Write(Path("no/such/dir/x.safetensors"));
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("no/such/dir/x.safetensors"));
}

// ---- One test per defect ----

TEST_F(SafetensorsTest, MissingFile) {
  auto r = SafetensorsFile::Open(Path("absent.safetensors"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("absent.safetensors"));
}

TEST_F(SafetensorsTest, EmptyFile) {
  ExpectOpenError("", absl::StatusCode::kDataLoss, {"0 bytes", "8-byte"});
}

TEST_F(SafetensorsTest, FileShorterThanLengthField) {
  ExpectOpenError("abcde", absl::StatusCode::kDataLoss, {"5 bytes", "truncated"});
}

TEST_F(SafetensorsTest, HeaderLengthLargerThanFile) {
  ExpectOpenError(RawFile("{}", "", /*length_field=*/4096), absl::StatusCode::kDataLoss,
                  {"header length 4096", "truncated"});
}

TEST_F(SafetensorsTest, HeaderLengthOverLimit) {
  ExpectOpenError(RawFile("{}", "", /*length_field=*/uint64_t{1} << 62),
                  absl::StatusCode::kDataLoss, {"exceeds the limit"});
}

TEST_F(SafetensorsTest, HeaderCutShort) {
  const std::string image = ValidImage();
  uint64_t n = 0;
  std::memcpy(&n, image.data(), 8);
  ExpectOpenError(image.substr(0, 8 + n / 2), absl::StatusCode::kDataLoss,
                  {"header length", "truncated"});
}

TEST_F(SafetensorsTest, DataCutShort) {
  const std::string image = ValidImage();
  // The writer puts F32 (a.weight) first, BF16 (b.weight) last: cutting the
  // tail truncates b.weight.
  ExpectOpenError(image.substr(0, image.size() - 3), absl::StatusCode::kDataLoss,
                  {"'b.weight'", "out of range", "truncated"});
}

TEST_F(SafetensorsTest, MalformedHeaderJson) {
  ExpectOpenError(RawFile(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})", "abcd"),
                  absl::StatusCode::kDataLoss, {"malformed header JSON"});
}

TEST_F(SafetensorsTest, HeaderIsNotAnObject) {
  ExpectOpenError(RawFile("[1,2,3]", ""), absl::StatusCode::kDataLoss, {"expected an object"});
}

TEST_F(SafetensorsTest, EntryIsNotAnObject) {
  ExpectOpenError(RawFile(R"({"w":[0,4]})", "abcd"), absl::StatusCode::kDataLoss,
                  {"tensor 'w'", "expected an object"});
}

TEST_F(SafetensorsTest, EntryWithoutDtype) {
  ExpectOpenError(RawFile(R"({"w":{"shape":[1],"data_offsets":[0,4]}})", "abcd"),
                  absl::StatusCode::kDataLoss, {"tensor 'w'", "dtype"});
}

TEST_F(SafetensorsTest, NegativeShape) {
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", "abcd"),
                  absl::StatusCode::kDataLoss, {"tensor 'w'", "bad shape"});
}

TEST_F(SafetensorsTest, MalformedOffsets) {
  for (const char* offsets : {R"([0])", R"([0,4,8])", R"("0,4")", R"([-4,4])", R"([0.5,4])"}) {
    ExpectOpenError(
        RawFile(std::string(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":)") + offsets + "}}",
                "abcd"),
        absl::StatusCode::kDataLoss, {"tensor 'w'", "data_offsets"});
  }
}

TEST_F(SafetensorsTest, OffsetsBeginAfterEnd) {
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", "abcd"),
                  absl::StatusCode::kDataLoss, {"tensor 'w'", "begin after end"});
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[250],"data_offsets":[0,1000]}})", "abcd"),
                  absl::StatusCode::kDataLoss,
                  {"tensor 'w'", "[0, 1000)", "out of range", "4 bytes"});
}

TEST_F(SafetensorsTest, HugeOffsetsDoNotOverflow) {
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[4611686018427387904],)"
                          R"("data_offsets":[0,18446744073709551615]}})",
                          "abcd"),
                  absl::StatusCode::kDataLoss, {"tensor 'w'", "out of range"});
}

TEST_F(SafetensorsTest, OverlappingOffsets) {
  ExpectOpenError(RawFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},)"
                          R"("b":{"dtype":"F32","shape":[4],"data_offsets":[8,24]}})",
                          std::string(24, '\0')),
                  absl::StatusCode::kDataLoss, {"tensor 'b'", "overlap", "'a'"});
}

TEST_F(SafetensorsTest, OverlapHiddenBehindAnEarlierLongTensor) {
  // c lies inside a although b (between them in begin order) does not overlap c.
  ExpectOpenError(RawFile(R"({"a":{"dtype":"F32","shape":[8],"data_offsets":[0,32]},)"
                          R"("b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]},)"
                          R"("c":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})",
                          std::string(32, '\0')),
                  absl::StatusCode::kDataLoss, {"overlap", "'a'"});
}

TEST_F(SafetensorsTest, ShapeSizeMismatch) {
  ExpectOpenError(
      RawFile(R"({"w":{"dtype":"BF16","shape":[3],"data_offsets":[0,8]}})", std::string(8, '\0')),
      absl::StatusCode::kDataLoss, {"tensor 'w'", "shape [3]", "BF16", "8 bytes"});
}

TEST_F(SafetensorsTest, ShapeProductOverflow) {
  ExpectOpenError(RawFile(R"({"w":{"dtype":"F32","shape":[4294967296,4294967296],)"
                          R"("data_offsets":[0,0]}})",
                          ""),
                  absl::StatusCode::kDataLoss, {"tensor 'w'", "does not match"});
}

TEST_F(SafetensorsTest, MetadataNotStrings) {
  ExpectOpenError(RawFile(R"({"__metadata__":{"n":1}})", ""), absl::StatusCode::kDataLoss,
                  {"__metadata__", "'n'"});
}

TEST_F(SafetensorsTest, UnsupportedDtypeFailsOnlyAtGet) {
  const std::string path = Path("mixed.safetensors");
  std::string header = R"({"q":{"dtype":"I8","shape":[4],"data_offsets":[0,4]},)"
                       R"("d":{"dtype":"F64","shape":[1],"data_offsets":[4,12]},)"
                       R"("u":{"dtype":"Q4_K","shape":[7],"data_offsets":[12,16]},)"
                       R"("f":{"dtype":"F32","shape":[1],"data_offsets":[16,20]}})";
  header.append((8 - header.size() % 8) % 8, ' ');  // as writers pad it
  WriteFile(path, RawFile(header, std::string(20, '\0')));
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->Get("f").ok());
  for (const char* name : {"q", "d", "u"}) {
    auto v = f->Get(name);
    ASSERT_FALSE(v.ok());
    EXPECT_EQ(v.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_THAT(std::string(v.status().message()), HasSubstr(path));
    EXPECT_THAT(std::string(v.status().message()), HasSubstr(std::string("'") + name + "'"));
    EXPECT_THAT(std::string(v.status().message()), HasSubstr("unsupported dtype"));
  }
  EXPECT_EQ(f->Info("q")->dtype_name, "I8");
  EXPECT_FALSE(f->Info("q")->dtype.has_value());
  EXPECT_EQ(f->RawData("d").size(), 8u);
}

// The kernels read elements by type: a header whose length leaves the data
// off the element boundary (writers pad it to 8) is refused at Get, naming
// the tensor and the byte; the same header padded opens.
TEST_F(SafetensorsTest, MisalignedDataIsRefusedAtGet) {
  const std::string header = R"({"f":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                             R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[8,12]}})";
  for (size_t pad = 0; pad < 4; ++pad) {
    const std::string path = Path("pad.safetensors");
    WriteFile(path, RawFile(header + std::string(pad, ' '), std::string(12, '\0')));
    auto f = SafetensorsFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    const uint64_t start = 8 + header.size() + pad;
    for (const auto& [name, size] : {std::pair{"f", 4u}, std::pair{"b", 2u}}) {
      auto v = f->Get(name);
      const uint64_t at = start + (name == std::string("b") ? 8 : 0);
      if (at % size == 0) {
        EXPECT_TRUE(v.ok()) << v.status();
        continue;
      }
      ASSERT_FALSE(v.ok()) << name << " at " << at;
      EXPECT_EQ(v.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(std::string(v.status().message()),
                  HasSubstr(absl::StrCat("tensor '", name, "': data at byte ", at,
                                         " of the file is not ", size, "-byte aligned")));
    }
  }
}

TEST_F(SafetensorsTest, KnownUnsupportedDtypeStillSizeChecked) {
  ExpectOpenError(RawFile(R"({"q":{"dtype":"I8","shape":[5],"data_offsets":[0,4]}})", "abcd"),
                  absl::StatusCode::kDataLoss, {"tensor 'q'", "I8"});
}

TEST_F(SafetensorsTest, MissingTensor) {
  const std::string path = Path("m.safetensors");
  WriteFile(path, ValidImage());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok());
  auto v = f->Get("c.weight");
  ASSERT_FALSE(v.ok());
  EXPECT_EQ(v.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(v.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(v.status().message()), HasSubstr("'c.weight'"));
  EXPECT_EQ(f->Info("c.weight"), nullptr);
  EXPECT_TRUE(f->RawData("c.weight").empty());
}

// Any corruption of a valid file gives a status, never a crash (run under
// ASan/UBSan with CORTIQ_SANITIZE=ON to make this strict).
TEST_F(SafetensorsTest, RandomCorruptionNeverCrashes) {
  const std::string image = ValidImage();
  const std::string path = Path("fuzz.safetensors");
  std::mt19937_64 gen(20240601);  // test-only randomness; fixed seed
  int opened = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string bytes = image;
    const int edits = 1 + static_cast<int>(gen() % 4);
    for (int e = 0; e < edits; ++e) {
      switch (gen() % 4) {
        case 0:  // flip a byte anywhere
          bytes[gen() % bytes.size()] = static_cast<char>(gen());
          break;
        case 1:  // flip a byte in the length field or header
          bytes[gen() % std::min<size_t>(bytes.size(), 120)] ^= static_cast<char>(1 << (gen() % 8));
          break;
        case 2:  // truncate
          bytes.resize(gen() % bytes.size());
          break;
        case 3:  // replace a digit in the header
          for (size_t i = 8 + gen() % 100; i < std::min<size_t>(bytes.size(), 140); ++i) {
            if (bytes[i] >= '0' && bytes[i] <= '9') {
              bytes[i] = static_cast<char>('0' + gen() % 10);
              break;
            }
          }
          break;
      }
      if (bytes.empty()) break;
    }
    WriteFile(path, bytes);
    auto f = SafetensorsFile::Open(path);
    if (f.ok()) {
      ++opened;
      for (const std::string& name : f->TensorNames()) {
        auto v = f->Get(name);
        if (v.ok()) {
          // Touch every byte: they must all be inside the mapping.
          const auto* p = static_cast<const volatile uint8_t*>(v->data);
          uint8_t acc = 0;
          for (size_t i = 0; i < v->nbytes; ++i) acc ^= p[i];
          (void)acc;
        }
      }
    } else {
      EXPECT_THAT(std::string(f.status().message()), HasSubstr(path));
    }
  }
  EXPECT_GT(opened, 0);  // some edits (inside the data) leave a valid file
}

}  // namespace
}  // namespace cortiq::model
