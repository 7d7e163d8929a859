// A decode step as one CUDA graph (issue 16 item 5, "launch overhead"): the step's launches are
// captured from its stream, the executable graph of the previous step is updated with them in
// place (cudaGraphExecUpdate: same topology, new arguments) or instantiated anew, and launched
// once. The host still runs every op of the step (the block stack, the policies, the index): a
// capture records launches instead of submitting them, so a step's kernels run back to back on
// the device instead of each waiting for the host's launch.
//
// What the ops of a captured step may do (and how the helpers below make them capturable):
//  - launch kernels and cuBLAS calls, stream-ordered device-to-device copies: captured as nodes;
//  - upload host data (upload_async): staged in pinned memory that the copy node reads when the
//    graph runs (a capture may not read pageable memory later);
//  - take temporary device memory (StreamScratch) from the capture's arena, and grow persistent
//    buffers (DeviceBuffer, malloc_async): allocated at once from the device or its pool, never
//    as graph allocation nodes (an executable graph with memory nodes cannot be updated); frees
//    of memory the captured work may still use wait until the graph has run (free_async after its
//    launch, DeviceBuffer's after the host's next wait for the stream: after_sync()).
//  - never wait for the device or copy to the host: those calls throw kvb::Error naming the op
//    (the step's host decisions cannot depend on results that do not exist yet). Which policies'
//    decode steps qualify is decided by the block stack (workers/engine/engine.h).
// Counters (captures, updates, instantiations, nodes) make the mechanism's costs countable.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace kvb::kernels::cuda {

// Whether the calling thread is capturing `stream` into a StepGraph.
bool capturing(cudaStream_t stream) noexcept;
// Whether the calling thread is capturing any stream into a StepGraph.
bool capturing_any() noexcept;

// cudaMallocAsync(bytes) on `stream`; while capturing it, from the same pool on a side stream
// that the host waits for (not a graph node). Throws kvb::Error (kOutOfMemory when it is).
void* malloc_async(size_t bytes, cudaStream_t stream);
// cudaFreeAsync(p) on `stream`; while capturing it, issued on the stream after the graph's
// launch (the captured work may still read p). Null is a no-op.
void free_async(void* p, cudaStream_t stream);
// cudaMemcpyAsync(dst, src, bytes, host to device) on `stream` from pageable memory (returns
// once src may change); while capturing it, src is copied now into pinned staging that the
// graph's copy node reads when it runs.
void upload_async(void* dst, const void* src, size_t bytes, cudaStream_t stream);
// Throws kvb::Error when the calling thread captures `stream`: `what` (a wait for the device or
// a copy to the host) cannot be part of a captured step.
void require_not_capturing(cudaStream_t stream, const char* what);
// The same for an operation on no particular stream (a device-wide wait: cudaDeviceSynchronize,
// a synchronous copy): throws when the calling thread captures any stream.
void require_no_capture(const char* what);

struct GraphCounters {
  int64_t captures = 0;        // steps captured and launched as a graph
  int64_t updates = 0;         // ... whose executable graph was updated in place
  int64_t instantiations = 0;  // ... that needed a new executable graph (first, or topology)
  int64_t aborted = 0;         // captures ended by an error (the graph discarded)
  size_t last_nodes = 0;       // nodes of the last captured step
  size_t arena_bytes = 0;      // the scratch arena's device bytes (after consolidation)
};

namespace detail {
struct CaptureState;  // graph.cu
}

// One executable graph per stream, re-captured each step (one per backend).
class StepGraph {
 public:
  explicit StepGraph(cudaStream_t stream);
  ~StepGraph();
  StepGraph(const StepGraph&) = delete;
  StepGraph& operator=(const StepGraph&) = delete;

  // Starts capturing the stream (relaxed mode: allocations on the host thread are allowed).
  // Precondition: nothing captures on this thread. The previous launch reads the arena and the
  // staging that this capture reuses: if the host has not waited for it (after_sync()), begin
  // waits for it first (an error path: the engine's passes end with a wait).
  void begin();
  bool active() const;
  // Ends the capture, updates the executable graph in place or instantiates it, launches it on
  // the stream, then issues the frees deferred during the capture (stream-ordered after it).
  void end_and_launch();
  // A launch the host has not waited for yet (after end_and_launch or abort launched one; false
  // after after_sync). After end_and_launch threw, false means the step's graph never ran.
  bool pending() const { return pending_; }
  // Ends a capture that an error interrupted. Where the capture is still valid (the error was
  // the host's), what was captured is launched, as the same ops launched one by one would have
  // run before the error, so the device state matches the host's; where CUDA invalidated the
  // capture, nothing of it runs. Deferred frees are issued. Returns whether the captured work
  // was launched; false when not active.
  bool abort() noexcept;
  // The host has waited for the stream (every launch has run): frees deferred until then
  // happen, and the arenas, if a step outgrew them, become one chunk of the size it needed.
  void after_sync();
  const GraphCounters& counters() const { return counters_; }

 private:
  void issue_stream_frees() noexcept;
  cudaStream_t stream_;
  cudaGraphExec_t exec_ = nullptr;
  cudaEvent_t launched_ = nullptr;  // recorded after each launch
  bool pending_ = false;            // a launch the host has not waited for (after_sync)
  bool launch_recorded_ = false;    // launched_ follows that launch (else wait for the stream)
  std::unique_ptr<detail::CaptureState> state_;
  GraphCounters counters_;
};

}  // namespace kvb::kernels::cuda
