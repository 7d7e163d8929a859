// StepGraph and the capture-aware helpers of graph.h; StreamScratch and DeviceBuffer
// (runtime.h) consult the calling thread's capture here.
#include "kernels/cuda/graph.h"

#include <algorithm>
#include <cstring>
#include <vector>

#include "common/error.h"
#include "kernels/cuda/runtime.h"

namespace kvb::kernels::cuda {

namespace detail {

// Chunks of memory handed out by bumping an offset, reset at each capture: a step's temporaries
// (device) or staged uploads (pinned host). Nothing is freed during a step; what a step used
// fits one chunk from the next step on (consolidate), so a steady decode allocates nothing.
class Arena {
 public:
  explicit Arena(bool pinned) : pinned_(pinned) {}
  ~Arena() { release_all(); }
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  void reset() {
    current_ = 0;
    offset_ = 0;
    used_ = 0;
  }
  void* take(size_t bytes) {
    constexpr size_t kAlign = 256;
    bytes = std::max<size_t>((bytes + kAlign - 1) / kAlign * kAlign, kAlign);
    used_ += bytes;
    while (current_ < chunks_.size() && offset_ + bytes > chunks_[current_].bytes) {
      ++current_;
      offset_ = 0;
    }
    if (current_ == chunks_.size()) {
      const size_t last = chunks_.empty() ? 0 : chunks_.back().bytes;
      const size_t size = std::max({bytes, 2 * last, size_t{1} << 20});
      chunks_.push_back({allocate(size), size});
      offset_ = 0;
    }
    void* p = static_cast<unsigned char*>(chunks_[current_].ptr) + offset_;
    offset_ += bytes;
    return p;
  }
  // After the host waited for every launch that read the chunks: one chunk of what the largest
  // step used (with room), if a step needed more than one.
  void consolidate() {
    high_ = std::max(high_, used_);
    if (chunks_.size() <= 1) return;
    release_all();
    const size_t bytes = high_ + high_ / 4;
    chunks_.push_back({allocate(bytes), bytes});
  }
  size_t bytes() const {
    size_t b = 0;
    for (const Chunk& c : chunks_) b += c.bytes;
    return b;
  }

 private:
  struct Chunk {
    void* ptr;
    size_t bytes;
  };
  void* allocate(size_t bytes) {
    void* p = nullptr;
    if (pinned_) {
      KVB_CUDA_CHECK(cudaMallocHost(&p, bytes));
    } else {
      KVB_CUDA_CHECK(cudaMalloc(&p, bytes));
    }
    return p;
  }
  void release_all() noexcept {
    for (const Chunk& c : chunks_) {
      if (pinned_) {
        cudaFreeHost(c.ptr);
      } else {
        cudaFree(c.ptr);
      }
    }
    chunks_.clear();
    reset();
  }
  bool pinned_;
  std::vector<Chunk> chunks_;
  size_t current_ = 0, offset_ = 0, used_ = 0, high_ = 0;
};

struct CaptureState {
  cudaStream_t stream = nullptr;
  cudaStream_t side = nullptr;  // pool allocations during a capture, waited for at once
  bool active = false;
  Arena scratch{false}, staging{true};
  std::vector<void*> stream_frees;  // pool memory: freed on the stream after the launch
  std::vector<void*> device_frees;  // cudaMalloc memory: freed after the host's next wait
};

namespace {
thread_local CaptureState* t_capture = nullptr;
}  // namespace

void* capture_scratch(size_t bytes, cudaStream_t stream) {
  KVB_CHECK(t_capture && t_capture->stream == stream) << "capture_scratch outside its capture";
  return t_capture->scratch.take(bytes);
}

bool defer_device_free(void* p) noexcept {
  if (!t_capture) return false;
  try {
    t_capture->device_frees.push_back(p);
  } catch (...) {
    // Out of host memory: leaked, not freed, since the captured work that may use it has not
    // run yet (cudaFree now would free it under that work).
  }
  return true;
}

}  // namespace detail

using detail::t_capture;

bool capturing(cudaStream_t stream) noexcept {
  return t_capture != nullptr && t_capture->stream == stream;
}

bool capturing_any() noexcept { return t_capture != nullptr; }

void* malloc_async(size_t bytes, cudaStream_t stream) {
  void* p = nullptr;
  if (capturing(stream)) {
    KVB_CUDA_CHECK(cudaMallocAsync(&p, bytes, t_capture->side));
    KVB_CUDA_CHECK(cudaStreamSynchronize(t_capture->side));
  } else {
    KVB_CUDA_CHECK(cudaMallocAsync(&p, bytes, stream));
  }
  return p;
}

void free_async(void* p, cudaStream_t stream) {
  if (p == nullptr) return;
  if (capturing(stream)) {
    t_capture->stream_frees.push_back(p);
    return;
  }
  KVB_CUDA_CHECK(cudaFreeAsync(p, stream));
}

void upload_async(void* dst, const void* src, size_t bytes, cudaStream_t stream) {
  if (bytes == 0) return;
  if (capturing(stream)) {
    void* staged = t_capture->staging.take(bytes);
    std::memcpy(staged, src, bytes);
    KVB_CUDA_CHECK(cudaMemcpyAsync(dst, staged, bytes, cudaMemcpyHostToDevice, stream));
    return;
  }
  KVB_CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
}

void require_not_capturing(cudaStream_t stream, const char* what) {
  if (capturing(stream)) require_no_capture(what);
}

void require_no_capture(const char* what) {
  KVB_CHECK(!capturing_any())
      << what << " inside a decode step captured as a CUDA graph: the step's host code cannot "
      << "wait for results its graph has not produced yet (a bug in the choice of capturable "
      << "steps, workers/engine/engine.h; run without CUDA graphs meanwhile)";
}

StepGraph::StepGraph(cudaStream_t stream)
    : stream_(stream), state_(std::make_unique<detail::CaptureState>()) {
  state_->stream = stream;
  KVB_CUDA_CHECK(cudaStreamCreateWithFlags(&state_->side, cudaStreamNonBlocking));
  KVB_CUDA_CHECK(cudaEventCreateWithFlags(&launched_, cudaEventDisableTiming));
}

StepGraph::~StepGraph() {
  abort();
  if (exec_) cudaGraphExecDestroy(exec_);
  // Teardown errors cannot be reported; the stream's work has run or is dropped.
  cudaStreamSynchronize(stream_);
  for (void* p : state_->device_frees) cudaFree(p);
  if (launched_) cudaEventDestroy(launched_);
  if (state_->side) cudaStreamDestroy(state_->side);
}

bool StepGraph::active() const { return state_->active; }

void StepGraph::issue_stream_frees() noexcept {
  for (void* p : state_->stream_frees) cudaFreeAsync(p, stream_);
  state_->stream_frees.clear();
}

void StepGraph::begin() {
  KVB_CHECK(t_capture == nullptr) << "StepGraph::begin: this thread already captures a step";
  if (pending_) {  // the last launch may still read the arena and the staging this capture reuses
    // Its event if it was recorded, else the stream (whose work includes the launch).
    KVB_CUDA_CHECK(launch_recorded_ ? cudaEventSynchronize(launched_)
                                    : cudaStreamSynchronize(stream_));
    after_sync();
  }
  state_->scratch.reset();
  state_->staging.reset();
  KVB_CUDA_CHECK(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed));
  state_->active = true;
  t_capture = state_.get();
}

void StepGraph::end_and_launch() {
  KVB_CHECK(state_->active) << "StepGraph::end_and_launch without begin";
  t_capture = nullptr;
  state_->active = false;
  // Frees deferred during the capture go on the stream after whatever this call launches, on
  // every path out of it.
  struct FreesGuard {
    StepGraph* g;
    ~FreesGuard() { g->issue_stream_frees(); }
  } frees{this};
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph);
  struct GraphGuard {
    cudaGraph_t g;
    ~GraphGuard() {
      if (g) cudaGraphDestroy(g);
    }
  } guard{graph};
  if (ended != cudaSuccess || graph == nullptr) {
    ++counters_.aborted;
    KVB_CUDA_CHECK(ended);
    KVB_FAIL() << "cudaStreamEndCapture returned no graph";
  }
  size_t nodes = 0;
  KVB_CUDA_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
  bool updated = false;
  if (exec_) {
    cudaGraphExecUpdateResultInfo info{};
    if (cudaGraphExecUpdate(exec_, graph, &info) == cudaSuccess) {
      updated = true;
    } else {
      (void)cudaGetLastError();  // the update's refusal is not an error of later calls
      cudaGraphExecDestroy(exec_);
      exec_ = nullptr;
    }
  }
  if (updated) {
    ++counters_.updates;
  } else {
    KVB_CUDA_CHECK(cudaGraphInstantiate(&exec_, graph, 0));
    ++counters_.instantiations;
  }
  KVB_CUDA_CHECK(cudaGraphLaunch(exec_, stream_));
  pending_ = true;  // from here the launch may read the arena and the staging
  launch_recorded_ = false;
  KVB_CUDA_CHECK(cudaEventRecord(launched_, stream_));
  launch_recorded_ = true;
  ++counters_.captures;
  counters_.last_nodes = nodes;
}

bool StepGraph::abort() noexcept {
  if (!state_->active) return false;
  t_capture = nullptr;
  state_->active = false;
  ++counters_.aborted;
  cudaGraph_t graph = nullptr;
  bool launched = false;
  // Ends an invalidated capture too (then with an error and no graph).
  if (cudaStreamEndCapture(stream_, &graph) == cudaSuccess && graph != nullptr) {
    cudaGraphExec_t once = nullptr;
    if (cudaGraphInstantiate(&once, graph, 0) == cudaSuccess) {
      launched = cudaGraphLaunch(once, stream_) == cudaSuccess;
      if (launched) {
        pending_ = true;
        launch_recorded_ = cudaEventRecord(launched_, stream_) == cudaSuccess;
      }
      cudaGraphExecDestroy(once);  // a launched graph's work completes regardless
    }
  }
  if (graph) cudaGraphDestroy(graph);
  (void)cudaGetLastError();
  issue_stream_frees();
  return launched;
}

void StepGraph::after_sync() {
  for (void* p : state_->device_frees) cudaFree(p);  // the launches that used them have run
  state_->device_frees.clear();
  state_->scratch.consolidate();
  state_->staging.consolidate();
  counters_.arena_bytes = state_->scratch.bytes();
  pending_ = false;
}

}  // namespace kvb::kernels::cuda
