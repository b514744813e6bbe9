// WorkspaceWindow: torch's one-sided window (c10d::Window, from Backend::new_window; Python
// dist._new_window) on the group's symmetric heap (docs/windows.md). It runs the protocol of
// ops/window.hpp and gives it what a group has: heap memory for the registered tensor and the
// signal counters, the ranks' records (exchanged over the wrapped CPU backend), Works, counters
// ("window.put", ...). Compiled only against a torch whose c10d has windows (CUDA_P2P_WITH_WINDOWS,
// detected by CMakeLists.txt).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Window.hpp>
#include <utility>
#include <vector>

#include "backend/abort_hooks.hpp"
#include "backend/counters.hpp"
#include "backend/engine_context.hpp"
#include "backend/symmetric_memory.hpp"
#include "ops/window.hpp"

namespace cuda_p2p {

// What a window is given of its group (made by ProcessGroupCudaP2P::new_window).
struct WindowGroup {
  // The group itself, held so that its heap and workspace outlive every window made on it (a
  // Python window may be dropped after destroy_process_group).
  c10::intrusive_ptr<c10d::Backend> owner;
  EngineContext group;
  SymmetricMemory& heap;
  Counters& counters;
  // The wrapped CPU backend (Gloo): the records' all-gather, on either workspace device.
  c10::intrusive_ptr<c10d::Backend> exchange;
  std::function<Millis()> timeout;   // the group's current timeout
  std::function<bool()> coalescing;  // whether the group is coalescing (no exchange then)
  // The group's abort hooks, for the Works of queued calls (NOTE [Errors of queued ops] in
  // backend/works.cpp).
  std::shared_ptr<AbortHooks> abort_hooks;
};

class WorkspaceWindow : public c10d::Window {
 public:
  // Collective: every rank makes the window at the same point of its op sequence (it creates the
  // group's heap the first time and places the window's signal counters there).
  explicit WorkspaceWindow(WindowGroup group);
  ~WorkspaceWindow() override;

  // Collective (NOTE [Window registration] in windows.cpp).
  void tensor_register(const at::Tensor& tensor, bool owning = true) override;
  void tensor_deregister() override;

  c10::intrusive_ptr<c10d::Work> put(const at::Tensor& tensor, int64_t dstRank,
                                     int64_t targetOffsetNelems, bool asyncOp,
                                     const c10d::PutOptions& opts = c10d::PutOptions()) override;
  c10::intrusive_ptr<c10d::Work> signal(
      int64_t peerRank, bool asyncOp,
      const c10d::SignalOptions& opts = c10d::SignalOptions()) override;
  c10::intrusive_ptr<c10d::Work> wait_signal(
      int64_t peerRank, bool asyncOp,
      const c10d::WaitSignalOptions& opts = c10d::WaitSignalOptions()) override;
  at::Tensor map_remote_tensor(int64_t rank) override;
  c10d::WindowAttr get_attr(int64_t peerRank) override;

 private:
  // The ranks' records, rank r's at [r * mine.size(), (r + 1) * mine.size()).
  std::vector<int64_t> all_gather(const std::vector<int64_t>& mine, const char* what);
  // Runs `fn` on the caller's current stream of the workspace's device and returns the Work
  // (complete on a synchronous host device, else waiting for the event recorded after it).
  template <typename Fn>
  c10::intrusive_ptr<c10d::Work> run(const char* what, c10d::OpType type,
                                     std::vector<at::Tensor> outputs, Fn&& fn);
  int checked_rank(int64_t r, const char* what, const char* role) const;
  // "N tensor(s) from map_remote_tensor (of rank(s) ...) is/are" for the mapped tensors still
  // alive, or "" (NOTE [Mapped tensors outlive no registration]); under registration_mutex_.
  std::string live_mappings();

  WindowGroup g_;       // first: destroyed last, after everything that lives in the group's heap
  at::Tensor signals_;  // this rank's counters in its heap (NOTE [Window signals])
  std::unique_ptr<ops::WindowProtocol> protocol_;
  std::mutex registration_mutex_;  // tensor_register / tensor_deregister / map_remote_tensor
  at::Tensor registered_;          // where the peers' puts land: the registered tensor
  // The storages of the tensors map_remote_tensor returned, with their ranks (NOTE [Mapped
  // tensors outlive no registration] in windows.cpp); expired ones are dropped as calls come.
  std::vector<std::pair<int, c10::weak_intrusive_ptr<c10::StorageImpl>>> mapped_;
};

}  // namespace cuda_p2p
