// The host (CPU) device: the device interface on shared memory and host streams
// (host_device_impl.hpp and its .cpp files). What the backend and tests use to create one; algorithms use Device.
#pragma once

#include <memory>
#include <string>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p {

// How a host device runs the work of the streams it creates (NOTE [Cooperative host streams] in
// host/host_stream.cpp): kCooperative, the default, in the thread that waits for it; kThreads on
// one executor thread per stream (the GPU's true concurrency, for tests that look for missing
// stream joins). kDefault is kCooperative (the backend resolves Options.host_streams and
// CUDA_P2P_HOST_STREAMS in backend/config.cpp).
enum class HostStreams { kDefault, kCooperative, kThreads };
// "auto" (kDefault), "cooperative" or "threads"; anything else is an error naming `what`.
HostStreams parse_host_streams(const std::string& value, const std::string& what);

// NOTE [Host device with CUDA's semantics]
// The host device's ops complete before they return and its waits raise into their streams, so
// the protocol code's CUDA branches and CUDA's failure behaviour would never run in CI. With
// HostSemantics::kCuda (Options.host_semantics / CUDA_P2P_HOST_SEMANTICS=cuda;
// tests/cpp/harness.hpp) the host device behaves as the CUDA device does, on host memory and host
// streams:
//  - the caller's current stream is a host stream of its thread's own (made on first use),
//    never the inline one: an op returns with its work queued (cooperative streams run it only
//    when someone waits: the host runs ahead as far as it can), and host_synchronous() is false,
//    so the ops take their CUDA branches (an op signature is compared in stream order and a
//    disagreement recorded for the next op, NOTE [Op signatures]);
//  - a signal wait is cuStreamWaitValue32: it polls its words with no deadline and never looks
//    at the device's failure; a Watchdog (p2p_workspace/watchdog.hpp) tracks it, fails the
//    device at its deadline and releases it by writing the awaited values into the words (NOTE
//    [Releasing blocked waits]); a released wait raises nothing into its stream, which runs on;
//  - a counted wait is the wait kernel of a replayed graph: it gives up at its own deadline,
//    counted from when the stream reaches it, flags the peers it missed, and its stream runs on;
//    check_healthy and synchronize turn the flag into the device's failure;
//  - synchronize, quiesce and Work.wait poll with the group's timeout (set_timeout) and raise the
//    device's failure as soon as there is one, as CudaDevice::poll_until does.
// Host tasks, copies, launches and events are the host's: a closure still runs on the host, in
// stream order, so ops whose closures refer to their locals (the fused pipelines: NOTE [Host ops
// return complete] in ops/pipeline_common.hpp) still wait for their own streams.
enum class HostSemantics { kSynchronous, kCuda };
// "auto" (synchronous), "synchronous" or "cuda"; anything else is an error naming `what`.
HostSemantics parse_host_semantics(const std::string& value, const std::string& what);

// `processes`: how many ranks of this host share its CPUs through this device's signals (0:
// unknown); waits poll with PAUSE only while they fit the CPUs (NOTE [Host waits on shared
// cores] in host/futex_wait.cpp).
std::shared_ptr<Device> make_host_device(int processes = 0,
                                         HostStreams streams = HostStreams::kDefault,
                                         HostSemantics semantics = HostSemantics::kSynchronous);

// Gives `device` (a host device on which no op has run yet, e.g. the one a group made at its
// creation) CUDA's semantics: NOTE [Host device with CUDA's semantics]. For tests that reach the
// device through the backend.
void use_cuda_semantics(Device& device);

// Makes `stream` (a stream `device`, a host device, created with new_stream) the calling thread's
// current stream on `device`, as torch.cuda.set_stream does on a GPU; null restores the inline
// stream. Ops then enqueue on it and return before their work has run, so that the tests see the
// stream order a GPU sees (NOTE [One order per group] in p2p_workspace/symmetric_workspace.cpp).
void set_current_stream(Device& device, std::shared_ptr<Stream> stream);

// A recorded stretch of stream work (NOTE [Host capture] in host/host_device_capture.cpp): the host's
// CUDA graph.
class HostGraph {
 public:
  virtual ~HostGraph() = default;
  // Enqueues the recorded work again, on the streams it was recorded on, after their queued work.
  virtual void replay() = 0;
  // How many tasks it holds (waits included).
  virtual size_t tasks() const = 0;
};
// Starts recording `stream` (made by device.new_stream) and the streams that join it; one capture
// per device at a time.
void begin_capture(Device& device, const std::shared_ptr<Stream>& stream);
// Ends the capture; what was recorded.
std::shared_ptr<HostGraph> end_capture(Device& device);

}  // namespace cuda_p2p
