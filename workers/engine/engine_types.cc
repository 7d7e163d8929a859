// Device and dtype parsing, and the engine factory behind `--device` / `--dtype`.
#include "workers/engine/engine_types.h"

#include <algorithm>

#include "common/error.h"
#include "common/log.h"
#include "kernels/f16.h"
#include "workers/engine/engine.h"
#ifdef KVB_WITH_CUDA
#include "kernels/cuda/runtime.h"
#include "workers/engine/cuda_engine.h"
#endif

namespace kvb::engine {

Device parse_device(const std::string& s) {
  if (s == "cpu") return Device::kCpu;
  if (s == "cuda") return Device::kCuda;
  KVB_USAGE_FAIL() << "--device must be cpu or cuda, got '" << s << "'";
}

DType parse_dtype(const std::string& s) {
  if (s == "f32") return DType::kF32;
  if (s == "bf16") return DType::kBf16;
  if (s == "native") return DType::kNative;
  KVB_USAGE_FAIL() << "--dtype must be f32, bf16 or native, got '" << s << "'";
}

DType resolve_dtype(Device d, const std::string& s) {
  if (s.empty()) return d == Device::kCuda ? DType::kBf16 : DType::kF32;
  const DType t = parse_dtype(s);
  KVB_USAGE_CHECK(!(t == DType::kNative && d == Device::kCuda))
      << "--dtype native (a GGUF model's own quantized blocks) runs on the CPU only: give "
         "--device cuda f32 or bf16, or --device cpu";
  return t;
}

const char* device_name(Device d) { return d == Device::kCuda ? "cuda" : "cpu"; }
const char* dtype_name(DType t) {
  return t == DType::kBf16 ? "bf16" : t == DType::kNative ? "native" : "f32";
}

size_t kv_slot_bytes(int head_dim, DType dtype) {
  return 2 * static_cast<size_t>(head_dim) * (dtype == DType::kBf16 ? 2 : 4) + sizeof(int32_t);
}

std::string run_device_label(Device device, DType dtype, const std::string& cuda_label) {
  if (device == Device::kCuda) return cuda_label + " (" + dtype_name(dtype) + ")";
  // Not the f32 reference: provenance says so.
  if (dtype == DType::kBf16) return "cpu (bf16 weights)";
  if (dtype == DType::kNative) return "cpu (native quantized weights)";
  return "cpu";
}

std::string label_precision(const std::string& label) {
  // The inverse of run_device_label, from its own spellings.
  for (const DType t : {DType::kF32, DType::kBf16, DType::kNative}) {
    const std::string tail = std::string(" (") + dtype_name(t) + ")";
    if (label == run_device_label(Device::kCpu, t, "") ||
        (label.rfind("cuda", 0) == 0 && label.size() > tail.size() &&
         label.compare(label.size() - tail.size(), tail.size(), tail) == 0)) {
      return dtype_name(t);
    }
  }
  return "";
}

std::string cuda_device_label(bool require_device) {
#ifdef KVB_WITH_CUDA
  const int count = kernels::cuda::device_count();
  if (count == 0) {
    if (require_device)
      KVB_FAIL() << "--device cuda: no GPU visible (cudaGetDeviceCount found none: "
                    "check the driver and CUDA_VISIBLE_DEVICES)";
    return "cuda (no GPU visible to the coordinator)";
  }
  cudaDeviceProp prop{};
  std::string name = "unknown GPU";
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) name = prop.name;
  // The label goes into runs.devices (JSON): no quotes or backslashes.
  for (char& ch : name) {
    if (ch == '"' || ch == '\\' || static_cast<unsigned char>(ch) < 0x20) ch = ' ';
  }
  return "cuda: " + name + " x" + std::to_string(count);
#else
  (void)require_device;
  KVB_USAGE_FAIL() << "--device cuda: this build has no CUDA (configure with nvcc on the PATH or "
                      "-DKVBENCH_CUDA=ON); use --device cpu";
#endif
}

int node_local_gpu(int worker_index) {
#ifdef KVB_WITH_CUDA
  const int count = kernels::cuda::device_count();
  if (count == 0)
    KVB_FAIL() << "--device cuda: no GPU visible on this node (worker " << worker_index
               << "; check the driver and CUDA_VISIBLE_DEVICES)";
  if (worker_index >= count) {
    KVB_LOG_WARN << "node-local worker " << worker_index << " shares GPU " << worker_index % count
                 << " (" << count << " visible): start at most one worker per GPU";
  }
  return worker_index % count;
#else
  (void)worker_index;
  return 0;
#endif
}

std::unique_ptr<Engine> make_engine(const Model& model, Device device, DType dtype, int gpu,
                                    kernels::Communicator* tp) {
  if (device == Device::kCpu) {
    return std::make_unique<Engine>(model, tp, dtype);
  }
  KVB_USAGE_CHECK(dtype != DType::kNative)
      << "--dtype native (a GGUF model's own quantized blocks) runs on the CPU only";
#ifdef KVB_WITH_CUDA
  KVB_USAGE_CHECK(!tp || tp->size() <= 1)
      << "--device cuda: tensor-parallel groups (--gpus-per-worker > 1) run on the CPU engine "
         "only in this build; use --device cpu or one GPU per worker";
  if (!kernels::cuda::has_device()) {
    KVB_FAIL()
        << "--device cuda: no GPU visible (cudaGetDeviceCount found none: check the driver and "
           "CUDA_VISIBLE_DEVICES)";
  }
  return std::make_unique<Engine>(model, cuda_backend(model, dtype, gpu));
#else
  (void)gpu;
  (void)tp;
  KVB_USAGE_FAIL() << "--device cuda: this build has no CUDA (configure with nvcc on the PATH or "
                      "-DKVBENCH_CUDA=ON); use --device cpu";
#endif
}

policies::StatsRequest forward_stats_request(int n, const kernels::KvCache& cache, int num_layers,
                                             policies::Policy* policy, PolicyHook* hook,
                                             PrefillRecord* record, int64_t* prefills) {
  if (!policy) *hook = PolicyHook::kNone;
  KVB_CHECK(*hook != PolicyHook::kDecode || n == 1) << "decode hook with " << n << " tokens";
  KVB_CHECK(!record || *hook == PolicyHook::kNone) << "a recorded prefill runs without a policy";
  if (n > 1 || cache.next_position() == 0) ++*prefills;
  policies::StatsRequest req;
  if (*hook == PolicyHook::kPrefill) req = policy->prefill_stats(n);
  if (*hook == PolicyHook::kDecode) req = policy->decode_request();
  if (record) {
    req = record->request;
    if (record->continues) {
      // Pre-RoPE keys and queries are recorded per piece (the prefix store joins them).
      KVB_CHECK(!req.col_sums || record->col_sums.size() == static_cast<size_t>(num_layers))
          << "a continued prefill record holds no column sums to continue";
      record->seed_col_sums = std::move(record->col_sums);
      record->seed_strides = std::move(record->strides);
      record->continues = false;
    } else {
      record->seed_col_sums.clear();
      record->seed_strides.clear();
    }
    record->n_new = n;
    record->last_w = std::min(req.last_w, n);
    record->strides.assign(num_layers, 0);
    record->col_sums.assign(num_layers, {});
    record->last_probs.assign(num_layers, {});
    record->pre_rope_keys.assign(num_layers, {});
    record->pre_rope_queries.assign(num_layers, {});
    record->n_queries = std::min(req.last_queries, n);
    record->last_queries.assign(num_layers, {});
  }
  return req;
}

void Backend::rerotate_keys(int layer, const kernels::cpu::RopeParams& rope,
                            kernels::KvCache& cache) {
  KVB_CHECK(cache.host_rows()) << "rerotate_keys: layer " << layer
                               << "'s rows are not on the host";
  kernels::cpu::RopeParams pure = rope;
  pure.attn_factor = 1.0f;  // a rotation: the keys carry the factor from their first RoPE
  const kernels::LayerKvView v = cache.layer(layer);
  std::vector<int32_t> delta;
  std::vector<float> rows;  // f16 rows: rotated in f32, rounded back
  for (int h = 0; h < v.num_kv_heads; ++h) {
    const int len = cache.length(layer, h);
    if (len == 0) continue;
    delta.resize(len);
    for (int s = 0; s < len; ++s) delta[s] = s - v.position(h)[s];
    const size_t count = static_cast<size_t>(len) * v.head_dim;
    if (v.keys16 != nullptr) {
      rows.resize(count);
      kernels::f16_to_f32(v.key16(h, 0), rows.data(), count);
      kernels::cpu::rope(rows.data(), delta.data(), len, 1, v.head_dim, pure);
      kernels::f32_to_f16(rows.data(), v.key16(h, 0), count);
    } else {
      kernels::cpu::rope(v.key(h, 0), delta.data(), len, 1, v.head_dim, pure);
    }
  }
  cache.renumber_positions(layer);
}

}  // namespace kvb::engine
