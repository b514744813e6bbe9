// A Device that forwards every call to another one: the base of the tests' devices that change
// one answer (a peer they cannot reach, events that complete when the test says so) and keep the
// host device's behaviour for the rest.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "p2p_workspace/device.hpp"

namespace cuda_p2p::test {

class ForwardingDevice : public Device {
 public:
  explicit ForwardingDevice(std::shared_ptr<Device> inner) : inner_(std::move(inner)) {}

  std::string name() const override { return inner_->name(); }
  // As legacy CUDA IPC's: a block must not be freed under a peer (test_workspace's leak test).
  bool blocks_outlive_owner() const override { return false; }
  std::string block_memory() const override { return inner_->block_memory(); }
  at::Device tensor_device() const override { return inner_->tensor_device(); }
  int device_index() const override { return inner_->device_index(); }
  std::string device_uuid() const override { return inner_->device_uuid(); }
  std::string peer_access_problem(const std::string& peer) override {
    return inner_->peer_access_problem(peer);
  }
  std::shared_ptr<Block> allocate(size_t bytes) override { return inner_->allocate(bytes); }
  std::unique_ptr<BlockExporter> export_block(const std::shared_ptr<Block>& b, int n) override {
    return inner_->export_block(b, n);
  }
  std::shared_ptr<Block> import_block(const std::vector<uint8_t>& h, size_t bytes,
                                      Millis timeout) override {
    return inner_->import_block(h, bytes, timeout);
  }
  std::shared_ptr<Stream> current_stream() override { return inner_->current_stream(); }
  std::shared_ptr<Stream> new_stream(bool high) override { return inner_->new_stream(high); }
  void copy(Stream& s, void* dst, const void* src, size_t n) override {
    inner_->copy(s, dst, src, n);
  }
  void write_signal(Stream& s, uint32_t* addr, uint32_t value) override {
    inner_->write_signal(s, addr, value);
  }
  void wait_signals(Stream& s, std::vector<SignalWait> w, Millis t, std::string c) override {
    inner_->wait_signals(s, std::move(w), t, std::move(c));
  }
  uint64_t capture_id(Stream& s) override { return inner_->capture_id(s); }
  void advance_counter(Stream& s, uint32_t* c, uint32_t d) override {
    inner_->advance_counter(s, c, d);
  }
  void write_counted(Stream& s, uint32_t* a, const uint32_t* c, uint32_t o) override {
    inner_->write_counted(s, a, c, o);
  }
  void wait_counted(Stream& s, std::vector<CountedWait> w, Millis t, std::string c) override {
    inner_->wait_counted(s, std::move(w), t, std::move(c));
  }
  void graph_kernel(Stream& s, const GraphLaunch& g, GraphKernelBody b, Millis t,
                    std::string c) override {
    inner_->graph_kernel(s, g, std::move(b), t, std::move(c));
  }
  void launch(Stream& s, std::function<void()> fn) override { inner_->launch(s, std::move(fn)); }
  void host_task(Stream& s, std::function<void()> fn) override {
    inner_->host_task(s, std::move(fn));
  }
  std::shared_ptr<Event> record(Stream& s) override { return inner_->record(s); }
  void wait_event(Stream& s, const Event& e) override { inner_->wait_event(s, e); }
  void synchronize(Stream& s) override { inner_->synchronize(s); }
  void synchronize(const Event& e) override { inner_->synchronize(e); }
  bool query(const Event& e) override { return inner_->query(e); }
  void quiesce() override { inner_->quiesce(); }
  bool drain(Millis limit) noexcept override { return inner_->drain(limit); }
  void set_timeout(Millis timeout) override { inner_->set_timeout(timeout); }
  void abort(const std::string& why) override { inner_->abort(why); }
  bool retire(const std::string& why, Millis limit) override { return inner_->retire(why, limit); }
  void check_healthy(const char* op) override { inner_->check_healthy(op); }
  void check_work(const char* op) override { inner_->check_work(op); }
  std::string lost_context() const override { return inner_->lost_context(); }
  bool has_failure_words() const override { return inner_->has_failure_words(); }
  void set_failure_words(FailureWords words) override {
    inner_->set_failure_words(std::move(words));
  }
  void add_failure_probe(std::function<std::string()> probe) override {
    inner_->add_failure_probe(std::move(probe));
  }
  void forget_failure_peers(const std::vector<int>& ranks) override {
    inner_->forget_failure_peers(ranks);
  }
  HostWords host_words(size_t n) override { return inner_->host_words(n); }
  void record_stream(const at::Tensor& t, Stream& s) override { inner_->record_stream(t, s); }
  // The blocks are the inner host device's, but none of its shortcuts is forwarded: the tests'
  // devices queue their work as CUDA's would (not synchronous, no inline stream).
  HostPaths* host_paths() const override { return &queued_; }

 protected:
  std::shared_ptr<Device> inner_;

 private:
  // NOTE [Host fast paths]: host memory, no shortcut.
  struct QueuedHostPaths : HostPaths {
    bool synchronous() const override { return false; }
    std::shared_ptr<CrossMemoryReader> cross_memory_reader(bool /*deny*/) override {
      return nullptr;
    }
    void set_ranks_cpus(int /*cpus*/) override {}
    int ranks_cpus() const override { return 0; }
    bool oversubscribed() const override { return false; }
    bool runs_inline(const Stream& /*s*/) const override { return false; }
    void write_signal_now(uint32_t* /*addr*/, uint32_t /*value*/) override {
      TORCH_CHECK(false, "cuda_p2p test: write_signal_now on a device without an inline stream");
    }
    bool poll_signals_now(c10::ArrayRef<SignalWait> /*waits*/) override { return false; }
  };
  mutable QueuedHostPaths queued_;
};

}  // namespace cuda_p2p::test
