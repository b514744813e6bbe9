// CUDA blocks through the driver's virtual memory API (vmm_blocks.cpp, NOTE [Blocks that outlive
// their exporter] there): what the CUDA device allocates, exports and imports where the driver
// and the GPU offer it, legacy CUDA IPC elsewhere (cuda_device.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p::cuda {

// A block's mapping in this process: the address range reserved and mapped, `size` bytes (the
// requested size rounded up to the allocation granularity).
struct VmmMapping {
  void* ptr = nullptr;
  size_t size = 0;
};

class VmmBlocks {
 public:
  // The driver's entry points for GPU `device` (the CUDA runtime's index), or null with
  // `why_not` saying what is missing (a driver without them, a GPU without virtual memory
  // management or POSIX descriptor handles).
  static std::unique_ptr<VmmBlocks> open(int device, std::string& why_not);
  virtual ~VmmBlocks() = default;

  // A new allocation of at least `bytes`, mapped read-write for this GPU. Throws naming the
  // driver's error; an out-of-memory error as OutOfMemoryError.
  virtual VmmMapping allocate(size_t bytes) = 0;
  // Serves the allocation mapped at `m` to up to `max_peers` peers of this host, as a POSIX
  // descriptor over fd_exchange.hpp's socket. Its handle is "vmm:<size>:<socket handle>".
  virtual std::unique_ptr<BlockExporter> exporter(const VmmMapping& m, int max_peers) = 0;
  // Maps a peer's allocation from its exporter's handle, read-write for this GPU. The mapping
  // holds a reference of its own: the memory stays valid until it is unmapped here, whatever
  // the exporter does (it may exit).
  virtual VmmMapping import(const std::vector<uint8_t>& handle, size_t bytes, Millis timeout) = 0;
  // Unmaps and frees the address range; errors are ignored (teardown, a context gone).
  virtual void unmap(const VmmMapping& m) noexcept = 0;

  // Whether `handle` is an exporter's of this kind (else it is a legacy CUDA IPC handle).
  static bool is_vmm_handle(const std::vector<uint8_t>& handle);
};

}  // namespace cuda_p2p::cuda
