// The host (CPU) device: the device interface on shared memory and host streams
// (host_device.cpp). What the backend and tests use to create one; algorithms use Device.
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

// `processes`: how many ranks of this host share its CPUs through this device's signals (0:
// unknown); waits poll with PAUSE only while they fit the CPUs (NOTE [Host waits on shared
// cores] in host/futex_wait.cpp).
std::shared_ptr<Device> make_host_device(int processes = 0,
                                         HostStreams streams = HostStreams::kDefault);

// Makes `stream` (a stream `device`, a host device, created with new_stream) the calling thread's
// current stream on `device`, as torch.cuda.set_stream does on a GPU; null restores the inline
// stream. Ops then enqueue on it and return before their work has run, so that the tests see the
// stream order a GPU sees (NOTE [One order per group] in p2p_workspace/symmetric_workspace.cpp).
void set_current_stream(Device& device, std::shared_ptr<Stream> stream);

// A recorded stretch of stream work (NOTE [Host capture] in host/host_device.cpp): the host's
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
