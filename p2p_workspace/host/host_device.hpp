// Host (CPU) implementation of the device interface. Exposed for tests; algorithms use Device.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p::host {

// A block of shared memory: an anonymous memfd (never a name in /dev/shm), mode 0600.
class HostBlock : public Block {
 public:
  HostBlock(int fd, size_t bytes, bool own_fd);
  ~HostBlock() override;
  // The memfd, kept open on the owning rank (for export); -1 on importers.
  int fd() const { return fd_; }

 private:
  int fd_;
};

// A host stream. The inline stream (the caller's "current stream") runs work immediately in the
// calling thread; an executor stream runs work in order on its own thread.
class HostStream : public Stream, public std::enable_shared_from_this<HostStream> {
 public:
  explicit HostStream(bool inline_mode);
  ~HostStream() override;

  void enqueue(std::function<void()> fn);
  // Tasks enqueued so far; an event records this number.
  uint64_t enqueued() const { return enqueued_; }
  // Blocks until `seq` tasks have finished (or been skipped after an error); rethrows the
  // stream's first error if `rethrow`.
  void wait_done(uint64_t seq, bool rethrow);
  std::exception_ptr error() const;

 private:
  void loop();

  const bool inline_;
  uint64_t enqueued_ = 0;  // only touched by the enqueuing thread
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  uint64_t done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;
};

class HostEvent : public Event {
 public:
  HostEvent(std::shared_ptr<HostStream> stream, uint64_t seq)
      : stream(std::move(stream)), seq(seq) {}
  std::shared_ptr<HostStream> stream;
  uint64_t seq;
};

// memfd-backed blocks (host/shared_block.cpp): allocate, export to peers over a Unix socket
// (SCM_RIGHTS, same user only), import.
std::shared_ptr<Block> allocate_shared_block(size_t bytes);
std::unique_ptr<BlockExporter> export_shared_block(const std::shared_ptr<Block>& block,
                                                   int max_peers);
std::shared_ptr<Block> import_shared_block(const std::vector<uint8_t>& handle, size_t bytes,
                                           Millis timeout);

// Waits until `word` reaches `value` (sequence-number order) or `deadline` passes: spins briefly,
// then sleeps in the kernel (futex on the shared word). Returns whether it was reached.
bool futex_wait_until(const uint32_t* word, uint32_t value,
                      std::chrono::steady_clock::time_point deadline);
// The same without polling first: sleeps in the kernel until the word reaches `value`.
bool futex_sleep_until(const uint32_t* word, uint32_t value,
                       std::chrono::steady_clock::time_point deadline);
// Stores `value` with release order and wakes every waiter (of any process).
void futex_store_and_wake(uint32_t* word, uint32_t value);

}  // namespace cuda_p2p::host
