// The engine factory's errors (--device, --dtype) and the CPU engine's accounting, checked
// without a GPU.
#include <gtest/gtest.h>

#include "common/error.h"
#include "workers/engine/cpu_backend.h"
#include "workers/engine/engine.h"
#include "workers/engine/engine_types.h"

namespace kvb {
namespace {

TEST(EngineFactory, DeviceAndDtypeErrors) {
  EXPECT_EQ(engine::parse_device("cpu"), engine::Device::kCpu);
  EXPECT_EQ(engine::parse_device("cuda"), engine::Device::kCuda);
  EXPECT_THROW(engine::parse_device("gpu"), Error);
  EXPECT_THROW(engine::parse_dtype("fp16"), Error);
  EXPECT_EQ(engine::resolve_dtype(engine::Device::kCpu, ""), engine::DType::kF32);
  EXPECT_EQ(engine::resolve_dtype(engine::Device::kCuda, ""), engine::DType::kBf16);
  EXPECT_EQ(engine::resolve_dtype(engine::Device::kCuda, "f32"), engine::DType::kF32);
  // bf16 on the CPU: bf16 weights beside the f32 reference (test_engine_bf16 checks its values).
  EXPECT_EQ(engine::resolve_dtype(engine::Device::kCpu, "bf16"), engine::DType::kBf16);
  try {
    engine::resolve_dtype(engine::Device::kCpu, "f16");
    FAIL() << "--dtype f16 was accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(err.what()).find("--dtype must be f32, bf16 or native"), std::string::npos);
  }
  // The device a sweep records: the precision is part of it.
  EXPECT_EQ(engine::run_device_label(engine::Device::kCpu, engine::DType::kF32, ""), "cpu");
  EXPECT_EQ(engine::run_device_label(engine::Device::kCpu, engine::DType::kBf16, ""),
            "cpu (bf16 weights)");
  EXPECT_EQ(engine::run_device_label(engine::Device::kCuda, engine::DType::kBf16,
                                     "cuda: NVIDIA H200 x1"),
            "cuda: NVIDIA H200 x1 (bf16)");
  EXPECT_EQ(engine::run_device_label(engine::Device::kCuda, engine::DType::kF32,
                                     "cuda: NVIDIA H200 x1"),
            "cuda: NVIDIA H200 x1 (f32)");
  // ... and is read back from a run's record: the labels above, and older cuda labels that do
  // not say (unknown: "").
  EXPECT_EQ(engine::label_precision("cpu"), "f32");
  EXPECT_EQ(engine::label_precision("cpu (bf16 weights)"), "bf16");
  EXPECT_EQ(engine::label_precision("cuda: NVIDIA H200 x1 (bf16)"), "bf16");
  EXPECT_EQ(engine::label_precision("cuda: NVIDIA H200 x1 (f32)"), "f32");
  EXPECT_EQ(engine::label_precision("cuda: NVIDIA H200 x1"), "");
  EXPECT_EQ(engine::label_precision("cuda (no GPU visible to the coordinator) (bf16)"), "bf16");
  EXPECT_EQ(engine::label_precision("tpu (bf16)"), "");
  engine::Model m;
  m.config.num_layers = 1;
  std::unique_ptr<engine::Engine> e =
      engine::make_engine(m, engine::Device::kCpu, engine::DType::kF32);
  EXPECT_EQ(e->device_description(), "cpu");
  EXPECT_EQ(e->device_peak_bytes(), 0u);
  // K/V bytes: the CPU engine counts its f32 cache; a bf16 slot of head_dim 64 holds
  // 2 x 64 x 2 bytes of K/V and a 4-byte position, an f32 slot is what KvCache counts.
  EXPECT_EQ(engine::kv_slot_bytes(64, engine::DType::kBf16), 260u);
  kernels::KvCache kv({2, 3, 64}, 5);
  EXPECT_EQ(engine::kv_slot_bytes(64, engine::DType::kF32), kv.bytes_per_slot());
  EXPECT_EQ(e->kv_logical_bytes(kv), kv.logical_bytes());
  EXPECT_EQ(e->kv_physical_bytes(kv), 2u * 3 * 5 * kv.bytes_per_slot());
  EXPECT_NE(dynamic_cast<engine::CpuBackend*>(&e->backend()), nullptr);  // the CPU engine
  // bf16 on the CPU: the CPU engine with bf16 weights, whose KV cache stays f32 (counted so).
  std::unique_ptr<engine::Engine> b =
      engine::make_engine(m, engine::Device::kCpu, engine::DType::kBf16);
  EXPECT_NE(dynamic_cast<engine::CpuBackend*>(&b->backend()), nullptr);
  EXPECT_EQ(b->kv_physical_bytes(kv), 2u * 3 * 5 * kv.bytes_per_slot());
  // native (issue 35): a GGUF model's own blocks, on the CPU only, recorded as such; a model
  // without a GGUF file is refused by name.
  EXPECT_EQ(engine::resolve_dtype(engine::Device::kCpu, "native"), engine::DType::kNative);
  EXPECT_EQ(engine::kv_slot_bytes(64, engine::DType::kNative), kv.bytes_per_slot());
  EXPECT_EQ(engine::run_device_label(engine::Device::kCpu, engine::DType::kNative, ""),
            "cpu (native quantized weights)");
  EXPECT_EQ(engine::label_precision("cpu (native quantized weights)"), "native");
  auto usage_error = [](auto&& f) {
    try {
      f();
    } catch (const Error& err) {
      EXPECT_EQ(err.kind(), ErrorKind::kUsage);
      return std::string(err.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(usage_error([] { engine::resolve_dtype(engine::Device::kCuda, "native"); })
                .find("--dtype native (a GGUF model's own quantized blocks) runs on the CPU only"),
            std::string::npos);
  m.path = "stories.bin";
  EXPECT_NE(usage_error([&] { engine::make_engine(m, engine::Device::kCpu, engine::DType::kNative); })
                .find("stories.bin is not a GGUF file (use --dtype f32 or bf16)"),
            std::string::npos);
  EXPECT_NE(usage_error([&] { engine::make_engine(m, engine::Device::kCuda, engine::DType::kNative); })
                .find("runs on the CPU only"),
            std::string::npos);
#ifndef KVB_WITH_CUDA
  try {
    engine::make_engine(m, engine::Device::kCuda, engine::DType::kBf16);
    FAIL() << "cuda in a build without CUDA did not throw";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("this build has no CUDA"), std::string::npos);
  }
#endif
}

}  // namespace
}  // namespace kvb
