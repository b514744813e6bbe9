// The signal pad's layout (NOTE [Signal pad layout] in p2p_workspace/pad_layout.hpp), checked from
// the outside: every accessor, over every argument, lands in its own area and on no word another
// slot has; the areas tile the pad; sizes match numbers worked out by hand; and a workspace's slots
// sit where the layout says, in a block of the size it published.
#include <string>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <vector>

#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/pad_layout.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

struct Config {
  int channels;
  int world_size;
};
// Up to kMaxGraphRanks ranks and past it, one channel to the most a workspace allows.
const Config kConfigs[] = {{1, 1}, {1, 2}, {4, 1},  {4, 2},  {4, 3},
                           {4, 4}, {2, 8}, {3, 16}, {1, 17}, {64, 4}};

std::string name(const Config& c) {
  return std::to_string(c.channels) + " channels, " + std::to_string(c.world_size) + " ranks";
}

enum AreaIndex {
  kSignals,
  kDone,
  kDescriptors,
  kGraphSignals,
  kGraphDone,
  kCounters,
  kFlags,
  kBusy
};

// Which slot owns each word of the pad: a word claimed twice is an overlap, one never claimed
// a gap.
class Claims {
 public:
  explicit Claims(const PadLayout& layout) : layout_(layout), claimed_(layout.words(), false) {}

  void claim(AreaIndex area, size_t word, const std::string& what) {
    const PadLayout::Area a = layout_.areas()[area];
    ASSERT_LT(word, layout_.words()) << what << " lies past the pad";
    ASSERT_TRUE(word >= a.begin && word < a.begin + a.words)
        << what << " (word " << word << ") lies outside " << a.name;
    ASSERT_FALSE(claimed_[word]) << what << " (word " << word << ") overlaps another slot";
    claimed_[word] = true;
  }

  void expect_every_word_claimed() const {
    for (size_t w = 0; w < claimed_.size(); ++w) {
      ASSERT_TRUE(claimed_[w]) << "word " << w << " belongs to no slot";
    }
  }

 private:
  const PadLayout& layout_;
  std::vector<bool> claimed_;
};

TEST(PadLayout, AreasTileThePadInOrder) {
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(name(c));
    const PadLayout l(c.channels, c.world_size);
    size_t end = 0;
    for (const auto& a : l.areas()) {
      EXPECT_EQ(a.begin, end) << a.name;
      EXPECT_GT(a.words, 0u) << a.name;
      end = a.begin + a.words;
    }
    EXPECT_EQ(end, l.words());
    // Whole pages, and no page more than the words need.
    EXPECT_EQ(l.bytes() % 4096, 0u);
    EXPECT_GE(l.bytes(), l.words() * 4);
    EXPECT_LT(l.bytes() - l.words() * 4, 4096u);
  }
}

TEST(PadLayout, EverySlotIsItsOwnWordInItsOwnArea) {
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(name(c));
    const PadLayout l(c.channels, c.world_size);
    Claims claims(l);
    for (int ch = 0; ch < c.channels; ++ch) {
      const std::string at = "channel " + std::to_string(ch);
      for (int src = 0; src < c.world_size; ++src) {
        const std::string from = at + ", src " + std::to_string(src);
        claims.claim(kSignals, l.signal(ch, src), "signal, " + from);
        claims.claim(kDone, l.done(ch, src), "done word, " + from);
        for (int parity = 0; parity < 2; ++parity) {
          for (int k = 0; k < PadLayout::kDescriptorWords; ++k) {
            claims.claim(kDescriptors, l.descriptor(ch, parity, src) + static_cast<size_t>(k),
                         "descriptor word " + std::to_string(k) + ", " + from);
          }
        }
        claims.claim(kGraphSignals, l.graph_signal(ch, src), "graph signal, " + from);
        claims.claim(kGraphDone, l.graph_done(ch, src), "graph done word, " + from);
        claims.claim(kCounters, l.graph_sent(ch, src), "graph sent counter, " + from);
        claims.claim(kCounters, l.graph_expected(ch, src), "graph expected counter, " + from);
        for (int block = 0; block < kMaxGraphBlocks; ++block) {
          for (int slot = 0; slot < kGraphSlots; ++slot) {
            const size_t flag = l.graph_flag(ch, block, slot, src);
            claims.claim(kFlags, flag, "graph flag, " + from);
            // GraphLaunch indexes a channel's flags from graph_flags(channel).
            ASSERT_EQ(flag, l.graph_flags(ch) + graph_flag_index(c.world_size, block, slot, src));
          }
        }
      }
      claims.claim(kCounters, l.graph_phases(ch), "graph phases, " + at);
    }
    claims.claim(kBusy, l.graph_busy(), "graph busy word");
    claims.expect_every_word_claimed();
  }
}

TEST(PadLayout, AnOpenClearsExactlyTheGraphCounts) {
  for (const Config& c : kConfigs) {
    SCOPED_TRACE(name(c));
    const PadLayout l(c.channels, c.world_size);
    const auto areas = l.areas();
    EXPECT_EQ(l.graph_counts(), areas[kGraphSignals].begin);
    EXPECT_EQ(l.graph_counts_words(),
              areas[kGraphSignals].words + areas[kGraphDone].words + areas[kCounters].words);
    EXPECT_EQ(l.graph_counts() + l.graph_counts_words(), areas[kFlags].begin);
  }
}

TEST(PadLayout, SizesWorkedOutByHand) {
  // 1 channel, 2 ranks: signals 2, done 2, descriptors 2*2*32, graph signals 2, graph done 2,
  // counters 2*2 + 1, flags 32*3*2, the busy word.
  EXPECT_EQ(PadLayout(1, 2).words(), 2u + 2 + 128 + 2 + 2 + 5 + 192 + 1);
  // 4 channels: 664 words per rank plus 5 (docs/workspace.md: 2656 bytes per rank plus 20).
  for (int w : {1, 2, 3, 4, 8, 16}) {
    EXPECT_EQ(PadLayout(4, w).words(), 664u * w + 5) << w << " ranks";
  }
  EXPECT_EQ(PadLayout(4, 1).bytes(), 4096u);
  EXPECT_EQ(PadLayout(4, 2).bytes(), 8192u);
  EXPECT_EQ(PadLayout(4, 3).bytes(), 8192u);
  EXPECT_EQ(PadLayout(4, 4).bytes(), 12288u);
  EXPECT_EQ(PadLayout(4, 8).bytes(), 24576u);
  // 4 channels, 2 ranks: the graph counts follow 8 + 8 + 512 words, and take 8 + 8 + 20.
  EXPECT_EQ(PadLayout(4, 2).graph_counts(), 528u);
  EXPECT_EQ(PadLayout(4, 2).graph_counts_words(), 36u);
}

TEST(PadLayout, BlocksArePagesOfBufferPadAndRegion) {
  // tests/cpp/test_workspace_records.cpp's record: a 4096-byte buffer and two pages of pad.
  EXPECT_EQ(BlockLayout(4096, PadLayout(4, 2), 0).block_bytes(), 12288u);
  const BlockLayout b(5000, PadLayout(3, 5), 10000);
  EXPECT_EQ(b.buffer_bytes, 8192u);
  EXPECT_EQ(b.pad_offset(), 8192u);
  EXPECT_EQ(b.pad_bytes, PadLayout(3, 5).bytes());
  EXPECT_EQ(b.region_offset(), 8192u + b.pad_bytes);
  EXPECT_EQ(b.region_bytes, 12288u);
  EXPECT_EQ(b.block_bytes(), b.region_offset() + 12288u);
  EXPECT_EQ(b.region_offset() % 4096, 0u);
}

// A one-rank workspace: its slots are where PadLayout says, its graph region follows the pad, and
// the block it published (and allocated) is buffer + pad + region.
TEST(PadLayout, AWorkspaceUsesIt) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  WorkspaceOptions o;
  o.buffer_size = 5000;
  o.num_channels = 3;
  o.graph_region_bytes = 10000;
  o.timeout = std::chrono::seconds(10);
  SymmetricWorkspace ws(store, 0, 1, make_host_device(), o);
  ASSERT_TRUE(ws.available()) << ws.unavailable_reason();
  const PadLayout l(3, 1);
  const BlockLayout b(5000, l, 10000);
  auto* base = static_cast<char*>(ws.buffer(0));
  auto offset = [&](const void* p) {
    return static_cast<size_t>(static_cast<const char*>(p) - base);
  };
  EXPECT_EQ(ws.buffer_size(), 8192);
  for (int ch = 0; ch < 3; ++ch) {
    EXPECT_EQ(offset(ws.signal_slot(0, ch, 0)), 8192 + 4 * l.signal(ch, 0));
    EXPECT_EQ(offset(ws.done_slot(0, ch, 0)), 8192 + 4 * l.done(ch, 0));
    EXPECT_EQ(offset(ws.descriptor_slot(0, ch, 1, 0)), 8192 + 4 * l.descriptor(ch, 1, 0));
    EXPECT_EQ(offset(ws.graph_flag(0, ch, kMaxGraphBlocks - 1, 2, 0)),
              8192 + 4 * l.graph_flag(ch, kMaxGraphBlocks - 1, 2, 0));
  }
  EXPECT_EQ(offset(ws.graph_region(0)), b.region_offset());
  EXPECT_EQ(ws.graph_region_bytes(), 12288);
  // The record's sixth line is the block size (NOTE [Workspace records]).
  const auto bytes = store->get("cuda_p2p/workspace/1/info/0");
  std::string record(bytes.begin(), bytes.end());
  std::vector<std::string> lines;
  for (size_t at = 0, nl; (nl = record.find('\n', at)) != std::string::npos; at = nl + 1) {
    lines.push_back(record.substr(at, nl - at));
  }
  ASSERT_GT(lines.size(), 5u) << record;
  EXPECT_EQ(lines[5], std::to_string(b.block_bytes()));
  // The last word of the region is this rank's memory.
  ws.graph_region(0)[b.region_bytes - 1] = 1;
}

static_assert(PadLayout(4, 2).bytes() == 8192);

}  // namespace
}  // namespace cuda_p2p::test
