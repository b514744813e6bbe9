// Where each area of a rank's signal pad lies (NOTE [Signal pad layout]), and where the pad lies
// in the rank's block: the one place that says it. Plain C++ without torch headers.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>

#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p {

// NOTE [Signal pad layout]
// Each rank's pad (after its buffer) holds, in 32-bit words, with C channels and W ranks:
//
//   signals        [C][W]                      sequence numbers (NOTE [Signal sequence numbers])
//   done words     [C][W]                      phases ended (NOTE [Collective phases])
//   descriptors    [C][2][W][kDescriptorWords] op signatures (NOTE [Op signatures])
//   graph signals  [C][W]                      counts (NOTE [Replay-safe signals])
//   graph done     [C][W]                      graph phases ended (NOTE [Replay-safe signals])
//   graph counters [C][2W + 1]                 this rank's own: sent, expected, phases
//   graph flags    [C][kMaxGraphBlocks][kGraphSlots][W]   flags (NOTE [Graph flags])
//   graph busy     [1]                         this rank's own (NOTE [One captured op at a time])
//
// indexed [channel][...][src] in the pad of the target. Invariants:
//  - every area but the graph counters and the graph busy word is written only by `src` (into its
//    peers' pads: a remote store) and read only by the pad's owner (a graph flag is also cleared
//    by it): no wait polls another rank's memory (on a GPU, across the interconnect);
//  - the graph counters and the graph busy word are read and written by the owner's streams only;
//  - the graph signals, graph done words and graph counters are contiguous: an open clears them
//    in one run (graph_counts);
//  - the pad is rounded up to whole pages; a new generation (growth) starts zeroed; after it comes
//    the graph region, the staging area of the captured kernels (NOTE [Graph flags]) alone.
class PadLayout {
 public:
  static constexpr int kDescriptorWords = 32;
  static constexpr size_t kPageSize = 4096;

  // One area: `words` words from word `begin` of the pad.
  struct Area {
    const char* name;
    size_t begin;
    size_t words;
  };
  static constexpr int kAreas = 8;

  constexpr PadLayout(int channels, int world_size)
      : c_(static_cast<size_t>(channels)), w_(static_cast<size_t>(world_size)) {}

  constexpr int channels() const { return static_cast<int>(c_); }
  constexpr int world_size() const { return static_cast<int>(w_); }

  // Word offsets from the start of the target's pad; `src` writes the word, the target reads it.
  constexpr size_t signal(int channel, int src) const { return signals() + per_src(channel, src); }
  constexpr size_t done(int channel, int src) const { return done_words() + per_src(channel, src); }
  // The first of the kDescriptorWords words of a descriptor.
  constexpr size_t descriptor(int channel, int parity, int src) const {
    return descriptors() +
           ((static_cast<size_t>(channel) * 2 + static_cast<size_t>(parity)) * w_ + u(src)) *
               kDescriptorWords;
  }
  constexpr size_t graph_signal(int channel, int src) const {
    return graph_signals() + per_src(channel, src);
  }
  constexpr size_t graph_done(int channel, int src) const {
    return graph_done_words() + per_src(channel, src);
  }
  // The graph counters of the pad's owner on `channel`: signals sent to `peer`, expected from
  // `peer`, and the graph phases it has begun.
  constexpr size_t graph_sent(int channel, int peer) const {
    return graph_counters() + u(channel) * (2 * w_ + 1) + u(peer);
  }
  constexpr size_t graph_expected(int channel, int peer) const {
    return graph_counters() + u(channel) * (2 * w_ + 1) + w_ + u(peer);
  }
  constexpr size_t graph_phases(int channel) const {
    return graph_counters() + u(channel) * (2 * w_ + 1) + 2 * w_;
  }
  // The flags of `channel`, indexed from here by graph_flag_index (GraphLaunch::own, ::peer).
  constexpr size_t graph_flags(int channel) const {
    return graph_flag_area() + u(channel) * graph_flag_words(world_size());
  }
  constexpr size_t graph_flag(int channel, int block, int slot, int src) const {
    return graph_flags(channel) + graph_flag_index(world_size(), block, slot, src);
  }
  // The word that says which captured op runs on this rank (NOTE [One captured op at a time]).
  constexpr size_t graph_busy() const {
    return graph_flag_area() + c_ * graph_flag_words(world_size());
  }
  // What an open clears (NOTE [Graph flags]): graph signals, graph done words, graph counters.
  constexpr size_t graph_counts() const { return graph_signals(); }
  constexpr size_t graph_counts_words() const { return graph_flag_area() - graph_signals(); }

  // Every area in pad order.
  constexpr std::array<Area, kAreas> areas() const {
    return {{{"signals", signals(), c_ * w_},
             {"done words", done_words(), c_ * w_},
             {"descriptors", descriptors(), c_ * 2 * w_ * kDescriptorWords},
             {"graph signals", graph_signals(), c_ * w_},
             {"graph done", graph_done_words(), c_ * w_},
             {"graph counters", graph_counters(), c_ * (2 * w_ + 1)},
             {"graph flags", graph_flag_area(), c_ * graph_flag_words(world_size())},
             {"graph busy", graph_busy(), 1}}};
  }
  // The words the areas take, and the pad's size in bytes (whole pages).
  constexpr size_t words() const { return graph_busy() + 1; }
  constexpr size_t bytes() const { return round_up(words() * sizeof(uint32_t), kPageSize); }

  static constexpr size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

 private:
  static constexpr size_t u(int i) { return static_cast<size_t>(i); }
  constexpr size_t per_src(int channel, int src) const { return u(channel) * w_ + u(src); }
  constexpr size_t signals() const { return 0; }
  constexpr size_t done_words() const { return c_ * w_; }
  constexpr size_t descriptors() const { return 2 * c_ * w_; }
  constexpr size_t graph_signals() const { return descriptors() + c_ * 2 * w_ * kDescriptorWords; }
  constexpr size_t graph_done_words() const { return graph_signals() + c_ * w_; }
  constexpr size_t graph_counters() const { return graph_done_words() + c_ * w_; }
  constexpr size_t graph_flag_area() const { return graph_counters() + c_ * (2 * w_ + 1); }

  size_t c_;
  size_t w_;
};

// A rank's block: | buffer | pad | graph region |, each a whole number of pages, so that each
// starts page-aligned in every rank's mapping.
struct BlockLayout {
  constexpr BlockLayout(int64_t buffer_size, const PadLayout& pad, int64_t graph_region_bytes)
      : buffer_bytes(PadLayout::round_up(static_cast<size_t>(buffer_size > 0 ? buffer_size : 0),
                                         PadLayout::kPageSize)),
        pad_bytes(pad.bytes()),
        region_bytes(PadLayout::round_up(
            static_cast<size_t>(graph_region_bytes > 0 ? graph_region_bytes : 0),
            PadLayout::kPageSize)) {}

  constexpr size_t pad_offset() const { return buffer_bytes; }
  constexpr size_t region_offset() const { return buffer_bytes + pad_bytes; }
  constexpr size_t block_bytes() const { return buffer_bytes + pad_bytes + region_bytes; }

  size_t buffer_bytes;
  size_t pad_bytes;
  size_t region_bytes;
};

}  // namespace cuda_p2p
