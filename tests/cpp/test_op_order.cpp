// The group's op order and teardown with callers whose current stream is a stream of its own
// (host::set_current_stream, like torch.cuda.set_stream) and an executor thread per stream
// (HostStreams::kThreads, the GPU's concurrency). NOTE [One order per group] and NOTE [Teardown
// drains] in p2p_workspace/symmetric_workspace.cpp; each result is checked against the same math
// done by plain ATen in this process. On the host every op has run when it returns (NOTE [Host
// ops return complete] in ops/pipeline_common.hpp), so the alternation test checks the stream
// order's plumbing, not the GPU hazard it prevents (that is gpu_check's stress step); the
// teardown test crashes without the drain.
#include <ATen/ATen.h>

#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "ops/fused_ops.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/symmetric_heap.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

at::Tensor input(at::IntArrayRef sizes, int64_t seed) { return small_ints(sizes, seed); }

c10::intrusive_ptr<ProcessGroupCudaP2P> make_group(int64_t buffer_size, Millis timeout) {
  auto options = c10::make_intrusive<ProcessGroupCudaP2P::Options>();
  options->host_streams = "threads";  // the GPU's concurrency
  options->buffer_size = buffer_size;
  options->timeout = timeout;
  const auto& w = world();
  auto pg = c10::make_intrusive<ProcessGroupCudaP2P>(
      test_store(), w.rank, w.size, options, c10::make_intrusive<Unreachable>(w.rank, w.size),
      nullptr);
  if (pg->workspace() != nullptr) apply_test_semantics(pg->workspace()->device());
  return pg;
}

// Waits until the calling thread's current stream of `pg`'s device has run what was enqueued on it
// (with CUDA's semantics an op returns with its work queued: cuda_semantics()).
void settle(ProcessGroupCudaP2P& pg) {
  Device& dev = pg.workspace()->device();
  dev.synchronize(*dev.current_stream());
}

// One op issued on a caller stream, and what it must produce once that stream has run.
struct Issued {
  std::string what;
  at::Tensor got;
  at::Tensor want;
};

// Op i of a seeded schedule: an all-gather→matmul, a matmul→reduce-scatter, a workspace
// all-reduce or all-gather, on the current stream. Every input is kept alive by `keep`.
Issued issue(ProcessGroupCudaP2P& pg, int i, std::vector<at::Tensor>& keep) {
  const int W = world().size, me = world().rank;
  const int seed = 1000 * (i + 1);
  const int64_t rows = 3 + i % 5;  // odd sizes, a different payload for every op
  Issued out;
  switch (i % 4) {
    case 0: {
      auto B = input({6, 5}, seed + 99);
      keep.push_back(B);
      auto shard = input({rows, 6}, seed + me);
      keep.push_back(shard);
      auto group = pg.pipeline_group(c10::DeviceType::CPU);
      std::lock_guard<std::mutex> lock(group.state.mutex);
      auto r = ops::fused_all_gather_matmul(group, shard, {B}, 0, false, "pipeline");
      std::vector<at::Tensor> shards;
      for (int q = 0; q < W; ++q) shards.push_back(input({rows, 6}, seed + q));
      return {"fused_all_gather_matmul #" + std::to_string(i), r.outputs[0],
              at::matmul(at::cat(shards), B)};
    }
    case 1: {
      auto B = input({6, 4}, seed + 99);
      keep.push_back(B);
      auto A = input({rows * W, 6}, seed + me);
      keep.push_back(A);
      auto group = pg.pipeline_group(c10::DeviceType::CPU);
      std::lock_guard<std::mutex> lock(group.state.mutex);
      auto got = ops::fused_matmul_reduce_scatter(group, A, B, "sum", 0, "pipeline", 0);
      at::Tensor sum;
      for (int q = 0; q < W; ++q) {
        auto p = at::matmul(input({rows * W, 6}, seed + q), B);
        sum = q == 0 ? p : sum + p;
      }
      return {"fused_matmul_reduce_scatter #" + std::to_string(i), got.output,
              sum.chunk(W, 0)[me].contiguous()};
    }
    case 2: {
      std::vector<at::Tensor> t{input({rows * 7}, seed + me)};
      keep.push_back(t[0]);
      pg.allreduce(t, c10d::AllreduceOptions());
      at::Tensor sum = input({rows * 7}, seed);
      for (int q = 1; q < W; ++q) sum = sum + input({rows * 7}, seed + q);
      return {"all_reduce #" + std::to_string(i), t[0], sum};
    }
    default: {
      auto in = input({rows, 3}, seed + me);
      auto outt = at::empty({rows * W, 3});
      keep.push_back(in);
      pg._allgather_base(outt, in, c10d::AllgatherOptions());
      std::vector<at::Tensor> shards;
      for (int q = 0; q < W; ++q) shards.push_back(input({rows, 3}, seed + q));
      return {"all_gather #" + std::to_string(i), outt, at::cat(shards)};
    }
  }
}

TEST(OpOrder, OpsIssuedOnTwoCallerStreamsAlternatelyRunInIssueOrder) {
  // Ops n and n+1 on different caller streams share the pipeline channels and the buffer; on a
  // GPU op n+1 waits for op n through the group's order (NOTE [One order per group]). Here every
  // op, fused or collective, is issued from one of two caller streams, or the inline one, and its
  // result must equal the reference.
  auto pg = make_group(1 << 14, std::chrono::seconds(60));
  ASSERT_TRUE(pg->is_p2p_available()) << pg->p2p_unavailable_reason();
  Device& dev = pg->workspace()->device();
  std::array<std::shared_ptr<Stream>, 2> callers{dev.new_stream(false), dev.new_stream(false)};
  std::vector<at::Tensor> keep;
  std::vector<Issued> issued;
  constexpr int kOps = 48;
  for (int i = 0; i < kOps; ++i) {
    // Two callers alternately, in an order that is the same on every rank.
    set_current_stream(dev, callers[(i / 2 + i) % 2]);
    issued.push_back(issue(*pg, i, keep));
  }
  set_current_stream(dev, nullptr);
  for (auto& c : callers) dev.synchronize(*c);
  for (const auto& op : issued) {
    ASSERT_EQ(op.got.sizes(), op.want.sizes()) << op.what;
    EXPECT_TRUE(at::equal(op.got, op.want))
        << op.what << ": max abs diff " << (op.got - op.want).abs().max().item<float>();
  }
  // An op on the inline stream after them waits for them too.
  auto last = issue(*pg, kOps, keep);
  settle(*pg);
  EXPECT_TRUE(at::equal(last.got, last.want)) << last.what;
}

TEST(OpOrder, TeardownWithWorkStillQueuedDrainsBeforeReleasingTheBlocks) {
  // NOTE [Teardown drains]: a stream of the group still has a pull from every peer's buffer
  // queued (behind a slow task, as a GPU copy waits behind a GEMM) when the workspace is
  // destroyed. Without the drain the mappings are unmapped under the pull (a crash), and a peer
  // may free its block first.
  const int W = world().size, me = world().rank;
  auto dev =
      make_host_device(W, HostStreams::kThreads,
                       cuda_semantics() ? HostSemantics::kCuda : HostSemantics::kSynchronous);
  auto stream = dev->new_stream(false);
  auto got = at::zeros({W, 64}, at::kInt);
  {
    WorkspaceOptions o;
    o.buffer_size = 1 << 14;
    SymmetricWorkspace ws(test_store(), me, W, dev, o);
    ASSERT_TRUE(ws.available());
    ws.get_buffer(me, {64}, at::kInt).fill_(100 + me);
    ws.barrier(*dev->current_stream(), 0);  // every buffer is written
    dev->host_task(*stream, [] { std::this_thread::sleep_for(std::chrono::milliseconds(300)); });
    for (int r = 0; r < W; ++r) {
      dev->copy(*stream, got[r].data_ptr(), ws.buffer(r), 64 * sizeof(int32_t));
    }
  }  // destroyed with the pulls still queued
  dev->synchronize(*stream);
  for (int r = 0; r < W; ++r) {
    EXPECT_TRUE(got[r].eq(100 + r).all().item<bool>()) << "the pull from rank " << r;
  }
  store_barrier("teardown-done");
}

TEST(OpOrder, AFailureInOneGroupLeavesAnotherGroupWorking) {
  // Two groups in one process: group A's op waits for a rank that never arrives and fails it;
  // group B, on its own device object and streams, keeps running checked ops.
  const int W = world().size;
  if (W < 2) GTEST_SKIP() << "needs 2 ranks";
  // Outlives group A, whose released stream may still run the failed op at its teardown.
  std::vector<at::Tensor> t{at::ones({16})};
  auto a = make_group(1 << 14, std::chrono::milliseconds(1500));
  auto b = make_group(1 << 14, std::chrono::seconds(60));
  std::vector<at::Tensor> keep;
  if (world().rank != W - 1) {
    // With CUDA's semantics the op returns enqueued; its failure reaches the host at its next
    // check, here the stream's synchronize; the next op raises it at once.
    expect_error(
        [&] {
          a->allreduce(t, c10d::AllreduceOptions());
          settle(*a);
        },
        "never arrived");
    expect_error([&] { a->allreduce(t, c10d::AllreduceOptions()); }, "never arrived");
  }
  for (int i = 0; i < 8; ++i) {
    auto op = issue(*b, i, keep);
    settle(*b);
    EXPECT_TRUE(at::equal(op.got, op.want)) << op.what;
  }
  store_barrier("after-failure");
}

TEST(OpOrder, HeapFreesInStreamOrderAreReclaimedAllAtOnceWhenNeeded) {
  // NOTE [Heap frees in stream order]: a deferred range stays allocated until an allocation
  // needs it; then every deferred free completes, in order, after its wait - the same calls on
  // every rank, whatever the waits' progress. A range whose wait says the work may still be
  // queued (a failed drain: issue 48, finding 8) is never handed out again.
  HeapAllocator heap(8192, 256);
  std::vector<std::string> log;
  const auto a = heap.allocate(1024), b = heap.allocate(1024), e = heap.allocate(1024),
             c = heap.allocate(2048), f = heap.allocate(3072);
  ASSERT_TRUE(a && b && c && e && f);
  heap.free_after(*a, [&] {
    log.push_back("a");
    return true;
  });
  heap.free_after(*b, [&] {
    log.push_back("b");
    return false;  // not drained: kept
  });
  heap.free_after(*e, [&]() -> bool {
    log.push_back("e");
    throw std::runtime_error("a failed device");  // unknown: kept
  });
  EXPECT_EQ(heap.deferred_blocks(), 3);
  EXPECT_EQ(heap.used_bytes(), 8192);  // not reusable yet
  EXPECT_TRUE(log.empty());
  const auto d = heap.allocate(512);  // no free range: completes all three, then serves
  ASSERT_TRUE(d.has_value());
  EXPECT_EQ(*d, *a);  // first fit over the reclaimed range, as an immediate free would give
  EXPECT_EQ(log, (std::vector<std::string>{"a", "b", "e"}));
  EXPECT_EQ(heap.deferred_blocks(), 0);
  EXPECT_EQ(heap.used_bytes(), 512 + 1024 + 1024 + 2048 + 3072);  // b and e stay taken
  EXPECT_FALSE(heap.allocate(1024).has_value()) << "a range whose work may be queued was reused";
  expect_error([&] { heap.free_after(*a + 8192, [] { return true; }); }, "no live block at offset");
  heap.free(*c);
  heap.free(*d);
  heap.free(*f);
  EXPECT_EQ(heap.used_bytes(), 2048);
  EXPECT_FALSE(heap.allocate(16384).has_value());  // larger than the heap: nothing to wait for
}

}  // namespace
}  // namespace cuda_p2p::test
