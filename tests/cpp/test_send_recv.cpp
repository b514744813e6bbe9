// The send/recv mailboxes (p2p_workspace/messages/mailboxes.cpp, NOTE [Mailboxes]) on the host
// device, over the job's TCPStore (no Python): several threads of each rank sending and receiving
// chunked messages in any tag order, receives from any rank, and the errors. Run under TSan too
// (scripts/sanitizers.sh).
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <thread>
#include <vector>

#include "p2p_workspace/messages/mailboxes.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

using std::chrono::milliseconds;
constexpr int64_t kSlot = 4096;
constexpr milliseconds kLong{60000};

std::unique_ptr<host::Mailboxes> make_mailboxes() {
  return std::make_unique<host::Mailboxes>(test_store(), world().rank, world().size,
                                           test_host_device(world().size), kSlot, kLong);
}

// Message i of rank `src`: 0 to ~5 slots of floats, distinct per rank and index, exact.
int64_t numel_of(int i) { return (i * 1237) % 5000; }
at::Tensor payload(int src, int i) {
  return at::arange(numel_of(i), at::kFloat) * 3 + src * 100000 + i * 7;
}

TEST(Mailboxes, ThreadsExchangeChunkedMessagesInAnyTagOrder) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto mb = make_mailboxes();
  const int right = (w.rank + 1) % w.size, left = (w.rank + w.size - 1) % w.size;
  constexpr int kMessages = 32, kTags = 4;
  // One thread sends message i with tag i % kTags, all posted before any is waited for.
  std::thread sender([&] {
    std::vector<host::P2POpPtr> ops;
    for (int i = 0; i < kMessages; ++i) {
      ops.push_back(mb->send(payload(w.rank, i), right, i % kTags, kLong));
    }
    for (auto& op : ops) mb->wait(*op);
  });
  // Two threads receive: one the highest tags first, the other the lowest; within a tag, in
  // order. Most messages pass each other (NOTE [Mailboxes]: the unexpected ones).
  std::vector<at::Tensor> got(kMessages);
  const auto receive = [&](std::vector<int> tags) {
    std::vector<std::pair<int, host::P2POpPtr>> ops;
    for (int tag : tags) {
      for (int i = tag; i < kMessages; i += kTags) {
        got[i] = at::full({numel_of(i)}, -1.0f);
        ops.emplace_back(i, mb->recv(got[i], left, tag, kLong));
      }
    }
    for (auto& [i, op] : ops) {
      mb->wait(*op);
      EXPECT_EQ(op->peer(), left);
    }
  };
  std::thread high(receive, std::vector<int>{3, 2});
  receive({0, 1});
  high.join();
  sender.join();
  for (int i = 0; i < kMessages; ++i) {
    EXPECT_TRUE(got[i].equal(payload(left, i))) << "message " << i << " from rank " << left;
  }
  store_barrier("done");  // nobody destroys an outbox a peer has yet to map
}

TEST(Mailboxes, ReceivesFromAnyRankNameTheirSource) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto mb = make_mailboxes();
  if (w.rank == 0) {
    std::vector<int> seen;
    for (int k = 1; k < w.size; ++k) {
      auto t = at::empty({3}, at::kLong);
      auto op = mb->recv(t, -1, 5, kLong);
      mb->wait(*op);
      seen.push_back(op->peer());
      EXPECT_EQ(t[0].item<int64_t>(), op->peer());
      EXPECT_EQ(op->future()->value().toTensorVector()[0].data_ptr(), t.data_ptr());
    }
    std::sort(seen.begin(), seen.end());
    for (int k = 1; k < w.size; ++k) EXPECT_EQ(seen[k - 1], k);
  } else {
    mb->wait(*mb->send(at::full({3}, int64_t{w.rank}), 0, 5, kLong));
  }
  store_barrier("done");
}

// What a receiver checks before it copies a chunk read from a peer's mailbox: its bytes fit a
// slot and its message, and it continues the message being received.
TEST(Mailboxes, ChunkHeadersOutsideTheirMessageAreRefused) {
  const auto header = [](int64_t total, int64_t offset, int64_t bytes) {
    return host::ChunkHeader{7, total, offset, bytes, static_cast<int32_t>(at::kFloat), 0};
  };
  // Accepted: a whole message in one chunk, an empty one, the last chunk of a longer one.
  EXPECT_EQ(host::chunk_header_error(header(100, 0, 100), kSlot, -1), "");
  EXPECT_EQ(host::chunk_header_error(header(0, 0, 0), kSlot, -1), "");
  EXPECT_EQ(host::chunk_header_error(header(3 * kSlot + 5, 3 * kSlot, 5), kSlot, 3 * kSlot + 5),
            "");
  const std::vector<std::pair<host::ChunkHeader, int64_t>> refused = {
      {header(2 * kSlot, 0, kSlot + 1), -1},          // more than a slot
      {header(100, 60, 41), 100},                     // past the end of its message
      {header(100, -8, 8), 100},                      // before its start
      {header(100, 0, -1), -1},                       // negative bytes
      {header(-1, 0, 0), -1},                         // a negative message
      {header(INT64_MAX, INT64_MAX - 1, kSlot), -1},  // an offset + bytes that overflows
      {header(2 * kSlot, kSlot, kSlot), -1},          // a first chunk not at offset 0
      {header(3 * kSlot, kSlot, kSlot), 2 * kSlot},   // another message's chunk
  };
  for (const auto& [h, receiving] : refused) {
    const std::string e = host::chunk_header_error(h, kSlot, receiving);
    EXPECT_NE(e.find("a chunk header (tag 7, message of " + std::to_string(h.total) +
                     " bytes, chunk of " + std::to_string(h.bytes) + " bytes at offset " +
                     std::to_string(h.offset) + ")"),
              std::string::npos)
        << e;
  }
  EXPECT_NE(host::chunk_header_error(header(100, 60, 41), kSlot, 100)
                .find("does not fit its message or a slot of 4096 bytes"),
            std::string::npos);
  EXPECT_NE(host::chunk_header_error(header(2 * kSlot, kSlot, kSlot), kSlot, -1)
                .find("starts a message at a nonzero offset"),
            std::string::npos);
  EXPECT_NE(host::chunk_header_error(header(3 * kSlot, kSlot, kSlot), kSlot, 2 * kSlot)
                .find("does not belong to the message of 8192 bytes being received"),
            std::string::npos);
}

// NOTE [Mailbox records]: what a rank publishes parses back; anything else is refused naming the
// rank, before anything is mapped.
TEST(Mailboxes, RecordsAreParsedStrictly) {
  const host::MailboxRecord good{kSlot, 4096 + host::Mailboxes::kSlots * kSlot, {0x00, 0xab, 0x7f}};
  const std::string text = host::serialize(good);
  const host::MailboxRecord back = host::parse_mailbox_record(text, 3);
  EXPECT_EQ(back.slot_bytes, good.slot_bytes);
  EXPECT_EQ(back.region_bytes, good.region_bytes);
  EXPECT_EQ(back.handle, good.handle);
  const std::string region = std::to_string(good.region_bytes);
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"", "expected 4 lines"},
      {"cuda_p2p-mailbox-v0\n4096\n" + region + "\n00ab\n", "expected 4 lines"},
      {"cuda_p2p-mailbox-v1\n4096\n" + region + "\n00ab", "not newline-terminated"},
      {"cuda_p2p-mailbox-v1\n-4096\n" + region + "\n00ab\n", "not a positive integer"},
      {"cuda_p2p-mailbox-v1\n4097\n" + region + "\n00ab\n", "expected a multiple of 4096"},
      {"cuda_p2p-mailbox-v1\n4096\n4096\n00ab\n", "regions of 4096 bytes for slots of 4096"},
      {"cuda_p2p-mailbox-v1\n999999999999999999\n1\n00ab\n", "expected a multiple of 4096"},
      {"cuda_p2p-mailbox-v1\n4096\n" + region + "\n0g\n", "hex bytes"},
      {"cuda_p2p-mailbox-v1\n4096\n" + region + "\n\n", "hex bytes"},
      {"cuda_p2p-mailbox-v1\n4096\n" + region + "\n" + std::string(4096, 'a') + "\n", "too long"},
  };
  for (const auto& [record, why] : refused) {
    try {
      host::parse_mailbox_record(record, 3);
      ADD_FAILURE() << "accepted: " << record;
    } catch (const c10::Error& e) {
      const std::string msg = e.what_without_backtrace();
      EXPECT_NE(msg.find("rank 3's mailbox record in the store is invalid"), std::string::npos)
          << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
    }
  }
}

TEST(Mailboxes, TimeoutsNameBothRanksAndMismatchesKeepTheMessage) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto mb = make_mailboxes();
  const milliseconds short_timeout{300};
  if (w.rank == 1) {
    auto t = at::zeros({3});
    expect_error([&] { mb->wait(*mb->recv(t, 0, 7, short_timeout)); },
                 "rank 1's recv from rank 0 (tag 7, 12 bytes of Float) timed out after 300 ms: "
                 "rank 0 has sent nothing on this group");
    auto any = at::zeros({2});
    expect_error([&] { mb->wait(*mb->recv(any, -1, 99, short_timeout)); },
                 "rank 1's recv from any rank (tag 99, 8 bytes of Float) timed out after 300 ms: "
                 "no rank sent a message with tag 99");
  }
  store_barrier("nothing sent");
  if (w.rank == 0) {
    mb->wait(*mb->send(at::arange(3, at::kFloat), 1, 1, kLong));
    // Larger than the mailbox, never taken: times out midway, and the channel is unusable.
    expect_error([&] { mb->wait(*mb->send(at::zeros({4 * kSlot}), 1, 9, short_timeout)); },
                 "rank 0's send to rank 1 (tag 9, 65536 bytes of Float) timed out after 300 ms: "
                 "rank 1 did not take the earlier chunks from its mailbox (2 of 16 chunks sent); "
                 "the channel to rank 1 is now unusable");
    expect_error([&] { mb->wait(*mb->send(at::zeros({1}), 1, 1, kLong)); },
                 "the channel from rank 0 to rank 1 is unusable");
  } else if (w.rank == 1) {
    auto wrong = at::zeros({3}, at::kInt);
    expect_error([&] { mb->wait(*mb->recv(wrong, 0, 1, kLong)); },
                 "rank 1 expected 12 bytes of Int from rank 0 with tag 1, but rank 0 sent 12 bytes "
                 "of Float with that tag; the message stays queued");
    auto right = at::zeros({3});
    mb->wait(*mb->recv(right, 0, 1, kLong));
    EXPECT_TRUE(right.equal(at::arange(3, at::kFloat)));
    // Nothing more is posted here: rank 0's large send stays untaken.
  }
  store_barrier("done");
}

TEST(Mailboxes, AFailureEndsThePendingOpsAndTheLaterOnes) {
  const auto& w = world();
  if (w.size < 2) GTEST_SKIP() << "needs 2 ranks";
  auto mb = make_mailboxes();
  auto t = at::zeros({1});
  auto op = mb->recv(t, (w.rank + 1) % w.size, 3, kLong);
  std::thread waiter(
      [&] { expect_error([&] { mb->wait(*op); }, "cuda_p2p send/recv: going away"); });
  std::this_thread::sleep_for(milliseconds(50));
  mb->fail("cuda_p2p send/recv: going away");
  waiter.join();
  EXPECT_TRUE(op->done());
  EXPECT_TRUE(op->future()->hasError());
  expect_error([&] { mb->wait(*mb->send(t, (w.rank + 1) % w.size, 3, kLong)); }, "going away");
  store_barrier("done");
}

}  // namespace
}  // namespace cuda_p2p::test
