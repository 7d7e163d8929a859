// Tests of workers/formats/gguf: round trips of files written by tests/gguf_writer.h (every
// metadata value type, tensors of every supported type, custom general.alignment, v2 and v3),
// specific errors of malformed files, and a seeded fuzz over mutations of a valid file that must
// either load with every tensor inside the file or throw kvb::Error naming the file.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/error.h"
#include "dequant_fixture.h"
#include "gguf_writer.h"
#include "kernels/cpu/dequant.h"
#include "workers/formats/gguf.h"

namespace kvb::formats {
namespace {

using testing::GgufWriter;
using W = GgufWriter;

class GgufTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("kvb_test_gguf_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::create_directories(dir_);
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string write(const std::vector<uint8_t>& bytes, const std::string& name = "t.gguf") {
    const std::string path = (dir_ / name).string();
    EXPECT_TRUE(GgufWriter::write_file(path, bytes));
    return path;
  }

  // Opens the file and loads every tensor; expects a kvb::Error naming the path and containing
  // every fragment.
  void expect_error(const std::vector<uint8_t>& bytes, std::initializer_list<const char*> frags) {
    const std::string path = write(bytes);
    try {
      auto f = GgufFile::open(path);
      for (const auto& t : f->tensors()) f->load_f32(t.name);
      ADD_FAILURE() << "no error; expected one containing " << *frags.begin();
    } catch (const kvb::Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
      for (const char* frag : frags) {
        EXPECT_NE(msg.find(frag), std::string::npos) << "missing '" << frag << "' in: " << msg;
      }
    }
  }

  std::filesystem::path dir_;
};

// Raw tensor bytes: random, with the f16 scale fields of each block set to finite values.
std::vector<uint8_t> random_tensor(uint32_t type, uint64_t n, std::mt19937_64& rng) {
  size_t block_bytes = 0, block_elems = 0;
  kernels::cpu::ggml_block_info(type, &block_bytes, &block_elems);
  std::vector<uint8_t> raw(n / block_elems * block_bytes);
  if (type == 0) {  // F32: finite floats
    for (size_t i = 0; i < n; ++i) {
      const float v = static_cast<float>(static_cast<int64_t>(rng() % 2001) - 1000) / 64.0f;
      std::memcpy(raw.data() + 4 * i, &v, 4);
    }
    return raw;
  }
  for (auto& b : raw) b = static_cast<uint8_t>(rng());
  // High byte of every f16/bf16 value or scale: clear the top exponent bit, so it is finite.
  if (type == 1 || type == 30) {
    for (size_t i = 1; i < raw.size(); i += 2) raw[i] &= 0xBF;
    return raw;
  }
  testing::make_scales_finite(type, raw.data(), raw.size(), block_bytes);
  return raw;
}

struct SeedTensor {
  const char* name;
  std::vector<uint64_t> dims;
  uint32_t type;
};
const std::vector<SeedTensor> kSeedTensors = {
    {"f32.weight", {4, 3}, 0},   {"f16.weight", {8, 2}, 1},     {"bf16.weight", {3}, 30},
    {"q8_0.weight", {32, 2}, 8}, {"q4_0.weight", {64}, 2},      {"q4_1.weight", {32, 3}, 3},
    {"q4_k.weight", {256}, 12},  {"q5_k.weight", {256, 2}, 13}, {"q6_k.weight", {256}, 14},
    {"q5_0.weight", {32, 3}, 6}, {"q5_1.weight", {64}, 7},      {"q2_k.weight", {256, 2}, 10},
    {"q3_k.weight", {256}, 11},  {"iq4_nl.weight", {96}, 20},   {"iq4_xs.weight", {256, 3}, 23},
};

// A valid file with metadata of every value type and one tensor of every supported type.
GgufWriter make_seed(uint32_t version = 3, uint32_t alignment = 0) {
  GgufWriter w(version);
  w.add_string("general.architecture", "llama");
  if (alignment) w.set_alignment(alignment);
  w.add_scalar<uint8_t>("t.u8", W::kU8, 200);
  w.add_scalar<int8_t>("t.i8", W::kI8, -5);
  w.add_scalar<uint16_t>("t.u16", W::kU16, 60000);
  w.add_scalar<int16_t>("t.i16", W::kI16, -30000);
  w.add_scalar<uint32_t>("t.u32", W::kU32, 4000000000u);
  w.add_scalar<int32_t>("t.i32", W::kI32, -2000000000);
  w.add_scalar<float>("t.f32", W::kF32, 0.1f);
  w.add_bool("t.bool", true);
  w.add_string("t.string", "h\xC3\xA9llo, GGUF");
  w.add_scalar<uint64_t>("t.u64", W::kU64, (uint64_t{1} << 40) + 3);
  w.add_scalar<uint64_t>("t.u64_big", W::kU64, std::numeric_limits<uint64_t>::max());
  w.add_scalar<int64_t>("t.i64", W::kI64, -(int64_t{1} << 50));
  w.add_scalar<double>("t.f64", W::kF64, 3.141592653589793);
  w.add_array<uint8_t>("a.u8", W::kU8, {1, 2, 255});
  w.add_array<int8_t>("a.i8", W::kI8, {-128, 127});
  w.add_array<uint16_t>("a.u16", W::kU16, {65535});
  w.add_array<int16_t>("a.i16", W::kI16, {-2, 3});
  w.add_array<uint32_t>("a.u32", W::kU32, {7, 4294967295u});
  w.add_array<int32_t>("a.i32", W::kI32, {-1, 0, 1});
  w.add_array<uint64_t>("a.u64", W::kU64, {uint64_t{1} << 62});
  w.add_array<int64_t>("a.i64", W::kI64, {std::numeric_limits<int64_t>::min()});
  w.add_array<float>("a.f32", W::kF32, {0.5f, -1.25f});
  w.add_array<double>("a.f64", W::kF64, {1e300, -2.5});
  w.add_array<uint8_t>("a.bool", W::kBool, {1, 0, 1});
  w.add_array<int32_t>("a.empty", W::kI32, {});
  w.add_string_array("a.string", {"a", "", "ccc"});
  std::mt19937_64 rng(42);
  for (const SeedTensor& t : kSeedTensors) {
    uint64_t n = 1;
    for (uint64_t d : t.dims) n *= d;
    w.add_tensor(t.name, t.dims, t.type, random_tensor(t.type, n, rng));
  }
  return w;
}

TEST_F(GgufTest, RoundTripMetadataOfEveryType) {
  GgufWriter w = make_seed();
  const std::vector<uint8_t> bytes = w.bytes();
  auto f = GgufFile::open(write(bytes));
  EXPECT_EQ(f->version(), 3u);
  EXPECT_EQ(f->alignment(), 32u);
  EXPECT_EQ(f->file_size(), bytes.size());
  EXPECT_EQ(f->data_offset(), w.data_offset());
  EXPECT_EQ(f->metadata().size(), 27u);

  EXPECT_EQ(f->get_string("general.architecture"), "llama");
  EXPECT_EQ(f->get_int("t.u8"), 200);
  EXPECT_EQ(f->get_int("t.i8"), -5);
  EXPECT_EQ(f->get_int("t.u16"), 60000);
  EXPECT_EQ(f->get_int("t.i16"), -30000);
  EXPECT_EQ(f->get_int("t.u32"), 4000000000LL);
  EXPECT_EQ(f->get_int("t.i32"), -2000000000LL);
  EXPECT_EQ(f->get_float("t.f32"), static_cast<double>(0.1f));
  EXPECT_TRUE(f->get_bool("t.bool"));
  EXPECT_EQ(f->get_int("t.bool"), 1);
  EXPECT_EQ(f->get_string("t.string"), "h\xC3\xA9llo, GGUF");
  EXPECT_EQ(f->get_int("t.u64"), (int64_t{1} << 40) + 3);
  EXPECT_EQ(f->get("t.u64_big").u, std::numeric_limits<uint64_t>::max());
  EXPECT_EQ(f->get_float("t.u64_big"), 18446744073709551615.0);
  EXPECT_EQ(f->get_int("t.i64"), -(int64_t{1} << 50));
  EXPECT_EQ(f->get_float("t.f64"), 3.141592653589793);
  EXPECT_EQ(f->get_float("t.i32"), -2e9);  // integers read as floats too
  EXPECT_EQ(f->get("t.u16").type, GgufValue::Type::kU16);

  EXPECT_EQ(f->get_int_array("a.u8"), (std::vector<int64_t>{1, 2, 255}));
  EXPECT_EQ(f->get_int_array("a.i8"), (std::vector<int64_t>{-128, 127}));
  EXPECT_EQ(f->get_int_array("a.u16"), (std::vector<int64_t>{65535}));
  EXPECT_EQ(f->get_int_array("a.i16"), (std::vector<int64_t>{-2, 3}));
  EXPECT_EQ(f->get_int_array("a.u32"), (std::vector<int64_t>{7, 4294967295LL}));
  EXPECT_EQ(f->get_int_array("a.i32"), (std::vector<int64_t>{-1, 0, 1}));
  EXPECT_EQ(f->get_int_array("a.u64"), (std::vector<int64_t>{int64_t{1} << 62}));
  EXPECT_EQ(f->get_int_array("a.i64"), (std::vector<int64_t>{std::numeric_limits<int64_t>::min()}));
  EXPECT_EQ(f->get_float_array("a.f32"), (std::vector<double>{0.5, -1.25}));
  EXPECT_EQ(f->get_float_array("a.f64"), (std::vector<double>{1e300, -2.5}));
  EXPECT_EQ(f->get_int_array("a.bool"), (std::vector<int64_t>{1, 0, 1}));
  EXPECT_TRUE(f->get_int_array("a.empty").empty());
  EXPECT_EQ(f->get("a.empty").elem_type, GgufValue::Type::kI32);
  EXPECT_EQ(f->get_string_array("a.string"), (std::vector<std::string>{"a", "", "ccc"}));
  EXPECT_EQ(f->get("a.string").arr_len, 3u);

  EXPECT_EQ(f->get_int_or("absent", -7), -7);
  EXPECT_EQ(f->get_float_or("absent", 2.5), 2.5);
  EXPECT_EQ(f->get_string_or("absent", "x"), "x");
  EXPECT_FALSE(f->get_bool_or("absent", false));
  EXPECT_EQ(f->get_int_or("t.i8", 0), -5);
}

TEST_F(GgufTest, TypedAccessorsNameKeyAndExpectedType) {
  auto f = GgufFile::open(write(make_seed().bytes()));
  auto expect_msg = [&](auto fn, const char* frag1, const char* frag2) {
    try {
      fn();
      ADD_FAILURE() << "no error; expected " << frag1;
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(frag1), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(frag2), std::string::npos) << e.what();
    }
  };
  expect_msg([&] { f->get_string("t.u32"); }, "'t.u32' has type u32", "expected string");
  expect_msg([&] { f->get_int("t.string"); }, "'t.string' has type string", "expected an integer");
  expect_msg([&] { f->get_float("t.string"); }, "'t.string'", "expected f32, f64 or an integer");
  expect_msg([&] { f->get_bool("t.u8"); }, "'t.u8' has type u8", "expected bool");
  expect_msg([&] { f->get_int("t.u64_big"); }, "'t.u64_big'", "fits in i64");
  expect_msg([&] { f->get_int_array("a.f32"); }, "'a.f32' has type array of f32",
             "expected array of integers");
  expect_msg([&] { f->get_float_array("a.i32"); }, "'a.i32'", "expected array of f32 or f64");
  expect_msg([&] { f->get_string_array("t.string"); }, "'t.string'", "expected array of string");
  expect_msg([&] { f->get_string("no.such.key"); }, "'no.such.key'", "not found");
  expect_msg([&] { f->get_int_or("t.string", 3); }, "'t.string'", "expected an integer");
}

TEST_F(GgufTest, RoundTripTensorsOfEverySupportedType) {
  GgufWriter w = make_seed();
  const std::vector<uint8_t> bytes = w.bytes();
  auto f = GgufFile::open(write(bytes));
  ASSERT_EQ(f->tensors().size(), kSeedTensors.size());
  for (size_t k = 0; k < kSeedTensors.size(); ++k) {
    const SeedTensor& want = kSeedTensors[k];
    const GgufTensorInfo& ti = f->tensors()[k];
    SCOPED_TRACE(want.name);
    EXPECT_EQ(ti.name, want.name);
    EXPECT_EQ(ti.dims, want.dims);
    EXPECT_EQ(ti.type, want.type);
    EXPECT_EQ(ti.offset, w.tensor_offsets()[k]);
    EXPECT_EQ(ti.offset % 32, 0u);
    EXPECT_EQ(f->find_tensor(want.name), &ti);
    size_t block_bytes = 0, block_elems = 0;
    ASSERT_TRUE(kernels::cpu::ggml_block_info(ti.type, &block_bytes, &block_elems));
    EXPECT_EQ(ti.num_bytes, ti.num_elements / block_elems * block_bytes);
    const std::vector<uint8_t> raw = f->load_raw(want.name);
    ASSERT_EQ(raw.size(), ti.num_bytes);
    EXPECT_EQ(0, std::memcmp(raw.data(), bytes.data() + f->data_offset() + ti.offset, raw.size()));
    // A range of its bytes (the native engine's rows), and a range that leaves the tensor.
    const uint64_t first = ti.num_bytes / 3, count = ti.num_bytes - first - 1;
    EXPECT_EQ(f->load_raw(want.name, first, count),
              std::vector<uint8_t>(raw.begin() + first, raw.begin() + first + count));
    try {
      f->load_raw(want.name, first, ti.num_bytes);
      ADD_FAILURE() << "a range beyond the tensor was read";
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find("leave its " + std::to_string(ti.num_bytes) + " bytes"),
                std::string::npos)
          << e.what();
    }
    const std::vector<float> vals = f->load_f32(want.name, want.dims);
    ASSERT_EQ(vals.size(), ti.num_elements);
    std::vector<float> ref(ti.num_elements);
    kernels::cpu::dequantize(ti.type, raw.data(), ref.data(), ref.size());
    EXPECT_EQ(0, std::memcmp(vals.data(), ref.data(), vals.size() * sizeof(float)));
  }
  EXPECT_EQ(f->find_tensor("absent"), nullptr);
  // F32 values as written: (i - 1000) / 64 for the seed's generator, so check one by hand.
  const std::vector<float> f32 = f->load_f32("f32.weight");
  float first;
  std::memcpy(&first, bytes.data() + f->data_offset(), 4);
  EXPECT_EQ(f32[0], first);
}

// A tensor with a non-finite element (F32, F16) or block scale (Q4_1's m, Q6_K's d at the block's
// end, Q8_0's d) is refused by every load, naming the file, the tensor, its type and the block
// with its elements; the file's other tensors still load, and so does a range of whole blocks
// before the bad one.
TEST_F(GgufTest, NonFiniteElementsAndBlockScalesAreRefused) {
  std::mt19937_64 rng(7);
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  auto put16 = [](std::vector<uint8_t>& raw, size_t at, uint16_t v) {
    std::memcpy(&raw[at], &v, 2);
  };
  std::vector<uint8_t> f32 = random_tensor(0, 8, rng);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::memcpy(&f32[4 * 6], &nan, 4);
  std::vector<uint8_t> f16 = random_tensor(1, 8, rng);
  put16(f16, 2 * 5, 0x7C00);  // +Inf
  std::vector<uint8_t> q41 = random_tensor(3, 96, rng);
  put16(q41, 20 * 1 + 2, 0x7E00);  // block 1's m: NaN
  std::vector<uint8_t> q6k = random_tensor(14, 512, rng);
  put16(q6k, 210 * 1 + 208, 0xFC00);  // block 1's d (the last two bytes): -Inf
  std::vector<uint8_t> q80 = random_tensor(8, 64, rng);
  w.add_tensor("f32.bad", {8}, 0, f32);
  w.add_tensor("f16.bad", {8}, 1, f16);
  w.add_tensor("q4_1.bad", {32, 3}, 3, q41);
  w.add_tensor("q6_k.bad", {256, 2}, 14, q6k);
  w.add_tensor("q8_0.good", {32, 2}, 8, q80);
  const std::string path = write(w.bytes());
  auto f = GgufFile::open(path);
  auto refused = [&](const std::function<void()>& load, const std::string& needle) {
    try {
      load();
      ADD_FAILURE() << "loaded; expected: " << needle;
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  };
  refused([&] { f->load_f32("f32.bad"); },
          "tensor 'f32.bad' (F32): f32.bad[6] = nan is not a finite number; the file is damaged");
  refused([&] { f->load_f32("f16.bad"); }, "tensor 'f16.bad' (F16): f16.bad[5] = inf is not a");
  refused([&] { f->load_f32("q4_1.bad"); },
          "tensor 'q4_1.bad' (Q4_1) block 1 (elements 32..63) has a scale that is not a finite "
          "number (NaN or Inf): the file is damaged");
  refused([&] { f->load_raw("q4_1.bad"); }, "tensor 'q4_1.bad' (Q4_1) block 1");
  refused([&] { f->load_raw("q4_1.bad", 20, 40); }, "tensor 'q4_1.bad' (Q4_1) block 1");
  refused([&] { f->load_f32("q6_k.bad"); }, "tensor 'q6_k.bad' (Q6_K) block 1 (elements 256..511)");
  EXPECT_EQ(f->load_raw("q4_1.bad", 0, 20).size(), 20u);   // block 0 alone is finite
  EXPECT_EQ(f->load_raw("q4_1.bad", 40, 20).size(), 20u);  // block 2 too
  EXPECT_EQ(f->load_raw("q4_1.bad", 21, 10).size(), 10u);  // not whole blocks: not checked
  EXPECT_EQ(f->load_f32("q8_0.good").size(), 64u);
  for (uint32_t type : {2u, 3u, 6u, 7u, 8u, 10u, 11u, 12u, 13u, 14u, 20u, 23u}) {
    size_t bb = 0, be = 0;
    ASSERT_TRUE(kernels::cpu::ggml_block_info(type, &bb, &be));
    const std::vector<uint8_t> raw = random_tensor(type, be * 3, rng);
    EXPECT_EQ(kernels::cpu::first_nonfinite_block(type, raw.data(), be * 3), -1)
        << kernels::cpu::ggml_type_name(type);
  }
}

// A GGUF holding the gguf-py golden blocks of every supported type (tests/fixtures/dequant, from
// scripts/make_dequant_fixture.py) as 2-D tensors loads them to gguf-py 0.10.0's values, bit for
// bit. Alignment 1 packs the tensors back to back, so a wrong block size in the type table shows
// as an overlap, a tensor past the end of the file, or shifted values.
const char* const kFixtureTypes[] = {"F32",  "F16",  "BF16", "Q8_0",   "Q4_0",
                                     "Q4_1", "Q5_0", "Q5_1", "Q2_K",   "Q3_K",
                                     "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"};

TEST_F(GgufTest, EveryTypeLoadsToGgufPyValues) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  w.set_alignment(1);
  std::vector<testing::DequantFixture> fixtures;
  for (const char* type : kFixtureTypes) {
    fixtures.push_back(testing::read_dequant_fixture(KVB_FIXTURES_DIR, type));
    const testing::DequantFixture& fx = fixtures.back();
    w.add_tensor(std::string("t.") + type, {fx.want.size() / 2, 2}, fx.type, fx.raw);
  }
  auto f = GgufFile::open(write(w.bytes()));
  ASSERT_EQ(f->tensors().size(), fixtures.size());
  for (const testing::DequantFixture& fx : fixtures) {
    const std::string name = std::string("t.") + kernels::cpu::ggml_type_name(fx.type);
    SCOPED_TRACE(name);
    const GgufTensorInfo* ti = f->find_tensor(name);
    ASSERT_NE(ti, nullptr);
    EXPECT_EQ(ti->num_bytes, fx.raw.size());
    const std::vector<float> got = f->load_f32(name, {fx.want.size() / 2, 2});
    ASSERT_EQ(got.size(), fx.want.size());
    EXPECT_EQ(0, std::memcmp(got.data(), fx.want.data(), got.size() * sizeof(float)));
  }
}

// A tensor of each type added for issue 15 whose data is one byte short of its blocks' size
// (the last tensor of a file that ends early) is refused, naming the file, the tensor, the type
// and the block arithmetic.
TEST_F(GgufTest, ShortTensorDataNamesTypeAndBlockSize) {
  struct Case {
    uint32_t type;
    uint64_t row;
    const char* frag;
  };
  for (const Case& c : {Case{6, 64, "(Q5_0: 64 elements = 2 blocks of 22 bytes)"},
                        Case{7, 32, "(Q5_1: 32 elements = 1 blocks of 24 bytes)"},
                        Case{10, 256, "(Q2_K: 256 elements = 1 blocks of 84 bytes)"},
                        Case{11, 512, "(Q3_K: 512 elements = 2 blocks of 110 bytes)"},
                        Case{20, 96, "(IQ4_NL: 96 elements = 3 blocks of 18 bytes)"},
                        Case{23, 256, "(IQ4_XS: 256 elements = 1 blocks of 136 bytes)"}}) {
    SCOPED_TRACE(c.frag);
    GgufWriter w;
    w.set_alignment(1);  // no padding after the data: the file ends where the tensor does
    std::mt19937_64 rng(3);
    std::vector<uint8_t> data = random_tensor(c.type, c.row, rng);
    w.add_tensor("blk.0.attn_k.weight", {c.row}, c.type, data);
    const std::vector<uint8_t> full = w.bytes();
    auto f = GgufFile::open(write(full));  // the full file loads
    EXPECT_EQ(f->tensors()[0].num_bytes, data.size());
    EXPECT_EQ(f->load_f32("blk.0.attn_k.weight").size(), c.row);
    expect_error(std::vector<uint8_t>(full.begin(), full.end() - 1),
                 {"tensor 'blk.0.attn_k.weight'", "past the end of the file", c.frag});
  }
}

TEST_F(GgufTest, ShapeMismatchAndMissingTensorAreNamed) {
  auto f = GgufFile::open(write(make_seed().bytes()));
  try {
    f->load_f32("q8_0.weight", {2, 32});
    ADD_FAILURE() << "shape mismatch accepted";
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("'q8_0.weight' has shape [32, 2] (ggml order), "
                                         "expected [2, 32]"),
              std::string::npos)
        << e.what();
  }
  try {
    f->load_f32("output.weight");
    ADD_FAILURE() << "missing tensor loaded";
  } catch (const kvb::Error& e) {
    EXPECT_NE(std::string(e.what()).find("no tensor named 'output.weight'"), std::string::npos)
        << e.what();
  }
}

TEST_F(GgufTest, CustomAlignmentAndVersion2) {
  for (uint32_t alignment : {1u, 8u, 64u, 256u}) {
    for (uint32_t version : {2u, 3u}) {
      SCOPED_TRACE("alignment " + std::to_string(alignment) + " version " +
                   std::to_string(version));
      GgufWriter w = make_seed(version, alignment);
      const std::vector<uint8_t> bytes = w.bytes();
      auto f = GgufFile::open(write(bytes));
      EXPECT_EQ(f->version(), version);
      EXPECT_EQ(f->alignment(), alignment);
      EXPECT_EQ(f->get_int("general.alignment"), alignment);
      EXPECT_EQ(f->data_offset() % alignment, 0u);
      EXPECT_EQ(f->data_offset(), w.data_offset());
      for (size_t k = 0; k < f->tensors().size(); ++k) {
        EXPECT_EQ(f->tensors()[k].offset, w.tensor_offsets()[k]);
        EXPECT_EQ(f->tensors()[k].offset % alignment, 0u);
        EXPECT_EQ(f->load_raw(f->tensors()[k].name).size(), f->tensors()[k].num_bytes);
      }
    }
  }
}

// ---- specific errors

std::vector<uint8_t> with_u32(std::vector<uint8_t> b, size_t at, uint32_t v) {
  std::memcpy(b.data() + at, &v, 4);
  return b;
}
std::vector<uint8_t> with_u64(std::vector<uint8_t> b, size_t at, uint64_t v) {
  std::memcpy(b.data() + at, &v, 8);
  return b;
}
GgufWriter one_tensor(const std::vector<uint64_t>& dims, uint32_t type, int64_t offset = -1) {
  GgufWriter w;
  w.add_string("general.architecture", "llama");
  std::mt19937_64 rng(1);
  uint64_t n = 1;
  for (uint64_t d : dims) n *= d;
  size_t bb = 0, be = 1;
  kernels::cpu::ggml_block_info(type, &bb, &be);
  w.add_tensor("blk.0.attn_q.weight", dims, type,
               bb ? random_tensor(type, n, rng) : std::vector<uint8_t>(64), offset);
  return w;
}

TEST_F(GgufTest, HeaderErrors) {
  const std::vector<uint8_t> good = make_seed().bytes();
  std::vector<uint8_t> bad = good;
  bad[0] = 'X';
  expect_error(bad, {"bad magic", "offset 0", "expected 'GGUF'"});
  expect_error(with_u32(good, 4, 1), {"unsupported GGUF version 1", "offset 4", "expected 2 or 3"});
  expect_error(with_u32(good, 4, 4), {"unsupported GGUF version 4"});
  expect_error(with_u32(good, 4, 0x03000000u), {"big-endian"});
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 12),
               {"truncated at offset 8", "tensor_count", "8 bytes expected"});
  expect_error(std::vector<uint8_t>(good.begin(), good.begin() + 2), {"too short"});
  expect_error(std::vector<uint8_t>(), {"too short"});
  expect_error(with_u64(good, 16, uint64_t{1} << 60), {"metadata_kv_count", "impossible"});
  expect_error(with_u64(good, 8, 1000000), {"tensor_count 1000000", "impossible"});
}

TEST_F(GgufTest, MissingFileAndDirectory) {
  for (const std::string& path : {(dir_ / "absent.gguf").string(), dir_.string()}) {
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "opened " << path;
    } catch (const kvb::Error& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

TEST_F(GgufTest, TensorTypeErrors) {
  expect_error(one_tensor({64}, 99).bytes(),
               {"tensor 'blk.0.attn_q.weight'", "type id 99 (unknown)",
                "expected one of: F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, "
                "Q5_K, Q6_K, IQ4_NL, IQ4_XS"});
  // Defined by ggml but not read here: the grid-based IQ types and Q8_1 / Q8_K.
  expect_error(one_tensor({256}, 16).bytes(), {"'blk.0.attn_q.weight'", "type id 16 (IQ2_XXS)"});
  expect_error(one_tensor({32}, 9).bytes(), {"'blk.0.attn_q.weight'", "type id 9 (Q8_1)"});
  expect_error(one_tensor({48}, 2).bytes(), {"row length 48", "multiple of the block size 32"});
  expect_error(one_tensor({128}, 11).bytes(),
               {"'blk.0.attn_q.weight'", "Q3_K", "row length 128", "block size 256"});
}

TEST_F(GgufTest, ShapeErrors) {
  GgufWriter w5;
  w5.add_tensor("x", {1, 1, 1, 1, 1}, 0, std::vector<uint8_t>(4));
  expect_error(w5.bytes(), {"tensor 'x'", "5 dimensions", "expected 1..4"});
  GgufWriter w0;
  w0.add_tensor("x", {4, 0}, 0, {});
  expect_error(w0.bytes(), {"tensor 'x'", "dimension 1 is 0"});
  GgufWriter wo;
  wo.add_tensor("x", {uint64_t{1} << 32, uint64_t{1} << 32}, 0, std::vector<uint8_t>(4));
  expect_error(wo.bytes(), {"tensor 'x'", "overflows"});
}

TEST_F(GgufTest, DataPlacementErrors) {
  // Data cut short: the tensor's bytes extend past the end of the file.
  GgufWriter q6 = one_tensor({256}, 14);  // 210 data bytes, then 14 bytes of padding
  const std::vector<uint8_t> full = q6.bytes();
  expect_error(std::vector<uint8_t>(full.begin(), full.end() - 20),
               {"'blk.0.attn_q.weight'", "past the end of the file"});
  // Aligned offsets near 2^64 must not wrap around when added to the data section's start.
  const auto offset_field = std::find_if(q6.fields().begin(), q6.fields().end(), [](auto& f) {
    return f.kind == GgufWriter::FieldKind::kOffset;
  });
  ASSERT_NE(offset_field, q6.fields().end());
  for (uint64_t off : {~uint64_t{31}, uint64_t{1} << 63, uint64_t{32}}) {
    expect_error(with_u64(full, offset_field->offset, off),
                 {"'blk.0.attn_q.weight' data [", "past the end of the file"});
  }
  expect_error(one_tensor({32}, 0, 16).bytes(),
               {"'blk.0.attn_q.weight' data offset 16 is not aligned", "multiple of 32"});
  GgufWriter two;
  two.add_tensor("a", {64}, 0, std::vector<uint8_t>(256), 0);
  two.add_tensor("b", {8}, 0, std::vector<uint8_t>(32), 128);
  expect_error(two.bytes(), {"tensors 'a' [0, 256) and 'b' [128, 160) overlap"});
  GgufWriter dup;
  dup.add_tensor("a", {8}, 0, std::vector<uint8_t>(32));
  dup.add_tensor("a", {8}, 0, std::vector<uint8_t>(32));
  expect_error(dup.bytes(), {"duplicate tensor name 'a'"});
}

TEST_F(GgufTest, MetadataErrors) {
  GgufWriter dup;
  dup.add_scalar<uint32_t>("llama.block_count", W::kU32, 1);
  dup.add_scalar<uint32_t>("llama.block_count", W::kU32, 2);
  expect_error(dup.bytes(), {"duplicate metadata key 'llama.block_count'", "offset"});

  GgufWriter unknown;
  unknown.add_raw_kv("x.weird", 13, {0, 0, 0, 0});
  expect_error(unknown.bytes(), {"'x.weird'", "unknown value type id 13 at offset", "0..12"});

  GgufWriter nested;  // array of arrays (element type 9)
  std::vector<uint8_t> payload = {9, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0};
  nested.add_raw_kv("x.nested", W::kArray, payload);
  expect_error(nested.bytes(), {"'x.nested'", "nested array", "not supported"});

  GgufWriter bad_elem;
  bad_elem.add_raw_kv("x.arr", W::kArray, {77, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0});
  expect_error(bad_elem.bytes(), {"'x.arr'", "unknown element type id 77"});

  GgufWriter big_array;  // claims 2^40 u32 elements
  big_array.add_raw_kv("x.big", W::kArray, {4, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0});
  expect_error(big_array.bytes(), {"'x.big'", "array length 1099511627776", "bytes remain"});

  GgufWriter big_string;
  big_string.add_raw_kv("x.s", W::kString, {0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x7F});
  expect_error(big_string.bytes(), {"value of metadata key 'x.s'", "has length"});

  GgufWriter bad_bool;
  bad_bool.add_raw_kv("x.b", W::kBool, {2});
  expect_error(bad_bool.bytes(), {"'x.b'", "expected 0 or 1"});

  GgufWriter empty_key;
  empty_key.add_scalar<uint8_t>("", W::kU8, 1);
  expect_error(empty_key.bytes(), {"metadata key #0", "empty"});

  for (uint32_t a : {0u, 48u}) {
    GgufWriter w;
    w.add_scalar<uint32_t>("general.alignment", W::kU32, a);
    expect_error(w.bytes(), {"general.alignment is", "power of two"});
  }
  GgufWriter a64;
  a64.add_scalar<uint64_t>("general.alignment", W::kU64, 64);
  expect_error(a64.bytes(), {"'general.alignment' has type u64, expected u32"});

  // A key whose length runs past the end of the file.
  std::vector<uint8_t> good = make_seed().bytes();
  expect_error(with_u64(good, 24, 1000000), {"metadata key #0", "offset 24", "has length 1000000"});
}

// ---- fuzz: mutated copies of a valid file never crash, hang or over-allocate.

TEST_F(GgufTest, FuzzMutationsLoadOrThrow) {
  GgufWriter w = make_seed(3, 64);
  const std::vector<uint8_t> seed = w.bytes();
  const auto& fields = w.fields();
  std::mt19937_64 rng(0x6775666Du);
  std::vector<std::vector<uint8_t>> cases;

  // Truncation at every structural boundary, and inside every field.
  for (const GgufWriter::Field& f : fields) {
    cases.emplace_back(seed.begin(), seed.begin() + f.offset);
    if (f.size > 1) cases.emplace_back(seed.begin(), seed.begin() + f.offset + f.size / 2);
  }
  auto pick_field = [&](std::initializer_list<GgufWriter::FieldKind> kinds) {
    for (;;) {
      const GgufWriter::Field& f = fields[rng() % fields.size()];
      for (auto k : kinds) {
        if (f.kind == k) return f;
      }
    }
  };
  const uint64_t n = seed.size();
  const uint64_t interesting[] = {0,
                                  1,
                                  2,
                                  3,
                                  4,
                                  5,
                                  8,
                                  9,
                                  12,
                                  13,
                                  14,
                                  30,
                                  31,
                                  64,
                                  99,
                                  255,
                                  0xFFFF,
                                  0xFFFFFFFFull,
                                  0x7FFFFFFFFFFFFFFFull,
                                  0x8000000000000000ull,
                                  ~0ull,
                                  n - 1,
                                  n,
                                  n + 1,
                                  n / 2,
                                  uint64_t{1} << 32};
  using K = GgufWriter::FieldKind;
  for (int i = 0; i < 300; ++i) {  // overwrite counts, lengths, dims, offsets and type ids
    std::vector<uint8_t> b = seed;
    const auto& f = pick_field({K::kCount, K::kLength, K::kDim, K::kOffset, K::kType});
    const uint64_t v = rng() % 3 == 0 ? rng() : interesting[rng() % std::size(interesting)];
    std::memcpy(b.data() + f.offset, &v, std::min<uint64_t>(f.size, 8));
    cases.push_back(std::move(b));
  }
  for (int i = 0; i < 300; ++i) {  // random byte flips anywhere, sometimes then truncated
    std::vector<uint8_t> b = seed;
    const int flips = 1 + static_cast<int>(rng() % 8);
    for (int k = 0; k < flips; ++k) b[rng() % b.size()] ^= static_cast<uint8_t>(1 + rng() % 255);
    if (rng() % 4 == 0) b.resize(rng() % b.size());
    cases.push_back(std::move(b));
  }
  for (int i = 0; i < 50; ++i) cases.emplace_back(seed.begin(), seed.begin() + rng() % n);
  ASSERT_GE(cases.size(), 300u);

  size_t ok = 0, rejected = 0;
  for (size_t c = 0; c < cases.size(); ++c) {
    const std::string path = write(cases[c], "fuzz.gguf");
    try {
      auto f = GgufFile::open(path);
      for (const GgufTensorInfo& t : f->tensors()) {
        ASSERT_LE(f->data_offset() + t.offset + t.num_bytes, cases[c].size()) << "case " << c;
        ASSERT_EQ(f->load_raw(t.name).size(), t.num_bytes) << "case " << c;
        ASSERT_EQ(f->load_f32(t.name).size(), t.num_elements) << "case " << c;
      }
      ++ok;
    } catch (const kvb::Error& e) {
      ASSERT_NE(std::string(e.what()).find(path), std::string::npos)
          << "case " << c << ": error does not name the file: " << e.what();
      ++rejected;
    }
    // Any other exception (bad_alloc, length_error, ...) escapes and fails the test.
  }
  EXPECT_EQ(ok + rejected, cases.size());
  EXPECT_GT(rejected, cases.size() / 2);  // most mutations break the file
  EXPECT_GT(ok, 0u);                      // some (flips inside data or strings) do not
  RecordProperty("fuzz_cases", static_cast<int>(cases.size()));
  RecordProperty("fuzz_loaded", static_cast<int>(ok));
}

}  // namespace
}  // namespace kvb::formats
