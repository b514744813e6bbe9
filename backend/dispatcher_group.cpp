#include "backend/dispatcher_group.hpp"

#include <c10/util/Exception.h>

#include <array>
#include <memory>
#include <mutex>
#include <torch/csrc/distributed/c10d/GroupRegistry.hpp>
#include <utility>

namespace cuda_p2p {
namespace {

// How errors name a group: "" is the default group (NOTE [The default group's name]).
std::string describe(std::string_view requested, const std::string& group_name) {
  return requested.empty() ? "the default group ('" + group_name + "', group_name '')"
                           : "group '" + group_name + "'";
}

c10::intrusive_ptr<c10d::ProcessGroup> resolve_group(const std::string& group_name,
                                                     std::string_view requested, const char* op) {
  try {
    return c10d::resolve_process_group(group_name);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cuda_p2p ", op, ": no process group named '", group_name, "'",
                requested.empty() && !group_name.empty()  // "" resolved to the record
                    ? " (group_name '' meant the default group, recorded under that name "
                      "when it was created and destroyed since)"
                    : "",
                " (pass group.group_name of a group created with backend='cuda_p2p'): ", e.what());
  }
}

// NOTE [The default group's name]
// The dispatcher ops take group_name="" for the default group, so that `op(t)` - the call of a
// model whose tensor parallelism spans the world - passes no strings: each string argument costs
// the dispatcher's Python binding a conversion on every call (docs/collectives.md, "The
// dispatcher op"; the figures: docs/measurements/collectives-reference-figures.md). torch keeps its
// default group in Python (distributed_c10d's _world), out of reach of a C++ kernel, so the
// backend's creator records the name of a cuda_p2p group created while no default group exists -
// torch's default group being created - here. A process-wide record, as torch's default group is
// process-wide; groups side by side are unaffected (they are named).
// A stale record (the default group destroyed, a non-cuda_p2p default group created after it) is
// harmless: its name resolves to no group, or to a group the checks below reject with an error
// that says "" meant the default group.
std::mutex default_group_mutex;
std::string default_group_name;  // under default_group_mutex; "" until a default group exists

std::string recorded_default_group_name(const char* op) {
  std::string name;
  {
    std::lock_guard<std::mutex> lock(default_group_mutex);
    name = default_group_name;
  }
  TORCH_CHECK(!name.empty(), "cuda_p2p ", op,
              ": group_name '' means the default group, but no default group was created with "
              "backend='cuda_p2p' (pass group.group_name of a cuda_p2p group)");
  return name;
}

c10::intrusive_ptr<ProcessGroupCudaP2P> resolve_uncached(std::string_view name,
                                                         c10::DeviceType device_type,
                                                         const char* op) {
  const std::string group_name = name.empty() ? recorded_default_group_name(op) : std::string(name);
  auto group = resolve_group(group_name, name, op);
  c10::intrusive_ptr<c10d::Backend> backend;
  try {
    backend = group->getBackend(device_type);
  } catch (const std::exception& e) {
    TORCH_CHECK(false, "cuda_p2p ", op, ": ", describe(name, group_name), " has no backend for ",
                c10::DeviceTypeName(device_type), " tensors: ", e.what());
  }
  TORCH_CHECK(dynamic_cast<ProcessGroupCudaP2P*>(backend.get()) != nullptr, "cuda_p2p ", op,
              ": expected a group created with backend='cuda_p2p', but ",
              describe(name, group_name), " runs ",
              backend ? backend->getBackendName() : std::string("no backend"), " for ",
              c10::DeviceTypeName(device_type), " tensors");
  return c10::static_intrusive_pointer_cast<ProcessGroupCudaP2P>(std::move(backend));
}

// NOTE [Group lookup cache]
// Why: a dispatcher op names its group by a string; torch's registry resolves it under a
// process-wide lock, then getBackend and a dynamic_cast follow, on every call of an op whose whole
// cost is latency (docs/collectives.md, "The dispatcher op"). So each thread keeps the last few
// (name, device type) pairs it resolved.
// Invariants:
//  - an entry holds the backend's raw pointer and a weak reference to its lifetime token
//    (ProcessGroupCudaP2P::lifetime_token(), dropped first thing in its destructor), not to the
//    backend (c10's weak_intrusive_ptr would defer its destructor, and the unmapping, to the last
//    weak reference);
//  - an entry is used only while the token lives and the backend is neither shut down nor aborted
//    (retired()): destroy_process_group shuts a group's backends down before it unregisters the
//    name, so a reused name never finds a stale entry;
//  - keyed by name and keeping nothing alive: groups side by side each have their entry, a
//    retired group is resolved anew and its ops raise as without the cache; destroying a group
//    while another thread is inside one of its ops is the caller's race, as without it.
struct CacheEntry {
  std::string name;
  c10::DeviceType device_type = c10::DeviceType::CPU;
  ProcessGroupCudaP2P* backend = nullptr;
  std::weak_ptr<const bool> alive;
};
constexpr size_t kCacheEntries = 4;
thread_local std::array<CacheEntry, kCacheEntries> cache;
thread_local size_t cache_next = 0;  // the entry a miss replaces (round robin)

}  // namespace

void set_default_group_name(const std::string& group_name) {
  std::lock_guard<std::mutex> lock(default_group_mutex);
  default_group_name = group_name;
}

bool is_default_group_name(const std::string& group_name) {
  std::lock_guard<std::mutex> lock(default_group_mutex);
  return !group_name.empty() && group_name == default_group_name;
}

int64_t resolve_group_size(const std::string& group_name, const char* op) {
  // "" as resolve_backend takes it, so that a Meta kernel sizes the group its CPU/CUDA kernel runs.
  const std::string name = group_name.empty() ? recorded_default_group_name(op) : group_name;
  return resolve_group(name, group_name, op)->getSize();
}

c10::intrusive_ptr<ProcessGroupCudaP2P> resolve_backend(std::string_view group_name,
                                                        c10::DeviceType device_type,
                                                        const char* op) {
  CacheEntry* slot = nullptr;
  for (auto& entry : cache) {
    if (entry.device_type == device_type && entry.name == group_name) {
      slot = &entry;
      break;
    }
  }
  // Alive (not destroyed), still referenced (a backend whose last reference went is never
  // revived), not retired: NOTE [Group lookup cache].
  if (slot != nullptr) {
    // expired(): one load, where lock() is a compare-and-swap loop and the token is not used.
    if (!slot->alive.expired() && c10::raw::intrusive_ptr::use_count(slot->backend) > 0 &&
        !slot->backend->retired()) {
      return c10::intrusive_ptr<ProcessGroupCudaP2P>::reclaim_copy(slot->backend);
    }
  }
  auto backend = resolve_uncached(group_name, device_type, op);
  if (!backend->retired()) {
    if (slot == nullptr) {  // a new name: replace the entries in turn
      slot = &cache[cache_next];
      cache_next = (cache_next + 1) % kCacheEntries;
      slot->name = std::string(group_name);
      slot->device_type = device_type;
    }
    slot->backend = backend.get();
    slot->alive = backend->lifetime_token();
  }
  return backend;
}

}  // namespace cuda_p2p
