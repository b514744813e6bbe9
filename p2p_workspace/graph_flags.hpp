// The flags of captured ops (NOTE [Graph flags]): where a captured op's barriers live in the
// ranks' pads, and what a device needs to run them - the CUDA device in a kernel
// (p2p_workspace/cuda/graph_barrier.cuh, ops/cuda/graph_collectives.cu), the host device in one
// task of a stream (host/host_device_capture.cpp). Plain C++ without torch headers, so that the CUDA
// sources include it.
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define CUDA_P2P_HOST_DEVICE __host__ __device__
#else
#define CUDA_P2P_HOST_DEVICE
#endif

// The shared kernel bodies (NOTE [One kernel source] in ops/kernel_body.hpp): a __host__
// __device__ template calls its policy's functions, which are __device__ only on the CUDA side:
// nvcc checks such a call only where it instantiates the template for the host, which it never
// does for the CUDA policy. Loops over a pack's elements unroll on the GPU.
#if defined(__CUDACC__)
#define CUDA_P2P_POLICY_CALLS _Pragma("nv_exec_check_disable")
#else
#define CUDA_P2P_POLICY_CALLS
#endif
#if defined(__CUDA_ARCH__)
#define CUDA_P2P_UNROLL _Pragma("unroll")
#else
#define CUDA_P2P_UNROLL
#endif

namespace cuda_p2p {

// NOTE [Graph flags]
// A captured op runs at every replay with what it was enqueued with, so its signals cannot carry
// host-issued sequence numbers (NOTE [Replay-safe signals] in symmetric_workspace.cpp), and the
// counts that replace them drift for good once a rank replays a graph once more than its peers.
// So the barriers of a captured op are flags that return to zero after every use:
//  - a flag is a word of the pad, one per (channel, block, slot, src), set only by `src` and read
//    and cleared only by the pad's owner (NOTE [Signal pad layout]). To pass a barrier, block b
//    of every rank stores the op's tag into its slot of block b in every peer's pad, waits until
//    every peer's word in its own slot is set, checks that each holds its own tag, and clears it.
//    The tag is a hash of the op's descriptor (its signature's text: kind, sizes, dtype, reduce
//    op, algorithm), the same on every rank, nonzero, in 30 bits (a host word's top bit is its
//    sleeper bit: NOTE [Sleeper bit]). Nothing outside the graph changes between replays: a
//    replay finds every flag at zero, as the capture left it;
//  - slots: an op's first barrier (its open) uses slot 0, its later ones on each channel
//    alternate slots 1 and 2, and every op has at least two barriers. So two consecutive barriers
//    of a channel never share a slot, which makes a store into a peer's slot safe without asking
//    whether the peer has cleared it: the last barrier j' that used the slot is at least two
//    barriers back; the peer cleared its word when it passed j' and before it stored anything for
//    the barrier after j', and the sender stores into the slot only after passing the barrier
//    just before this one, which needed the peer's store for that barrier (a release the sender
//    acquired). Across ops the open separates them: a rank stores for op n+1 only after it passed
//    op n+1's open, which needed every peer's open store, made after the peer ended op n;
//  - both sides check: a word is consumed exactly (never "reached", as a count is), so no peer can
//    be ahead on a slot, and every rank compares the tag of every word it consumes. A rank that
//    replays a graph once more than its peers stores into their open slots and waits for theirs,
//    which never come: it gives up at the group's timeout naming them and its device fails
//    (NOTE [Counted waits end with the failure] in watchdog.hpp), which reaches the peers through
//    their failure words. A rank whose next op is another one finds a foreign tag: an error naming
//    that rank and both tags, never two different ops paired. A rank that replays once less is
//    the same story seen from its peers. Either way nobody returns data of a mismatched op;
//  - blocks: a kernel op runs on G blocks (G depends only on the op's sizes, so it is the same on
//    every rank), and block b of every rank pairs with block b of every peer; the data block b
//    stages and the data it reads are the same range on every rank (ops/graph_layout.hpp), so
//    each block's barriers order exactly what that block needs;
//  - an op run as one kernel (ops/captured_collectives.cpp) has its barriers on slots 0, 1 (and
//    2) of every block and its data between them. An op that keeps the copy engine (a large
//    collective, a fused pipeline) opens with a kernel that first clears this rank's graph counts
//    (NOTE [Replay-safe signals]: they then count from zero in every op, whatever an earlier
//    replay left) and then passes the slot-0 barrier; its full barriers are flag barriers, its
//    other signals counted; it closes with a flag barrier. A barrier alone (intra_node_barrier,
//    a barrier op) is an op of two flag barriers;
//  - what is open is kept per capture (its id): a barrier is the open op's next one only within
//    the capture that opened it. An op that raises after its open (or a rejection) forgets it, so
//    a later barrier-only op opens for itself; two threads capturing on one group keep theirs
//    apart.
// One device, the host's or CUDA's, runs every flag wait (Device::graph_kernel): on the host in
// one task of the stream (the whole op: one recorded task per captured op), on CUDA in the
// kernel; a wait gives up at the group's timeout and ends at a failure as a counted wait does.

// Slots per (channel, block, src): the open, then two that alternate.
inline constexpr int kGraphSlots = 3;
// Blocks of a kernel op, and the ranks whose captured ops use flags (more ranks: counted signals,
// as before; docs/workspace.md, "Graph capture").
inline constexpr int kMaxGraphBlocks = 32;
inline constexpr int kMaxGraphRanks = 16;
// Barriers one kernel runs.
inline constexpr int kMaxGraphBarriers = 4;
// Tags live in the low 30 bits.
inline constexpr uint32_t kGraphTagMask = (1u << 30) - 1;

// NOTE [One captured op at a time]
// A group's captured ops share its flags and its graph region, and their barriers assume that one
// of them runs at a time on a rank (NOTE [Graph flags]): two graphs of one group replayed at once
// on two streams would consume each other's flags (the same op in both: both pass on one flag and
// stage into one region, silently) or meet a foreign tag. Nothing outside the GPU orders two
// replays, so the kernels check it themselves, on a word of the rank's own pad (the graph busy
// word, NOTE [Signal pad layout]) that only its own kernels touch:
//  - the word holds an owner (the captured op's number on this rank, given when it is captured:
//    a replay runs the op with the number it was captured with) and how many of that owner's
//    blocks are inside it. A kernel op's block takes it at entry (a compare-and-swap: free, or
//    already its op's) and gives it back at its end, whichever way it ends; a copy-engine op's
//    open kernel takes it and its close kernel gives it back, so the whole op holds it;
//  - a block that finds another owner's count in the word refuses to run: it touches no flag
//    and no data, records why in the device's give-up record and ends quietly; the record fails
//    the device (the watchdog reads it), whose failure reaches the peers through their failure
//    words: their kernels end quietly too, and the next call on the group, or cuda_p2p.check(),
//    raises the cause on this rank and names this rank on its peers. Nobody traps
//    (NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp);
//  - a CUDA graph never runs concurrently with itself (CUDA orders two launches of one
//    executable graph), so one owner's blocks are always one replay's;
//  - an op that raises after its open under capture gives the word back with a kernel of no
//    barriers (SymmetricWorkspace::graph_abandon), or every later replay would hold it;
//  - what it cannot see: two ops that never overlap in time on this rank but interleave their
//    barriers with the peers' (one stream per graph, replays unordered across ranks) still meet
//    a foreign tag, as before.
// Owner (23 bits) and count (8: at most kMaxGraphBlocks blocks of a kernel, or an open) in one
// 32-bit word, clear of a host word's sleeper bit.
inline constexpr uint32_t kGraphBusyCountBits = 8;
inline constexpr uint32_t kGraphBusyCountMask = (1u << kGraphBusyCountBits) - 1;
inline constexpr uint32_t kGraphOwnerMask = (1u << 23) - 1;

// The flags of one channel in one rank's pad: [block][slot][src].
CUDA_P2P_HOST_DEVICE constexpr size_t graph_flag_index(int world_size, int block, int slot,
                                                       int src) {
  return (static_cast<size_t>(block) * kGraphSlots + static_cast<size_t>(slot)) *
             static_cast<size_t>(world_size) +
         static_cast<size_t>(src);
}
constexpr size_t graph_flag_words(int world_size) {
  return static_cast<size_t>(kMaxGraphBlocks) * kGraphSlots * static_cast<size_t>(world_size);
}

// The tag of an op whose descriptor is `text` (FNV-1a, in 30 bits, never 0).
constexpr uint32_t graph_tag(const char* text, size_t n) {
  uint32_t h = 2166136261u;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<uint8_t>(text[i]);
    h *= 16777619u;
  }
  h &= kGraphTagMask;
  return h == 0 ? 1 : h;
}

// One run of flag barriers (a kernel op, or a barrier of a copy-engine op), as the workspace
// describes it to the device (SymmetricWorkspace::graph_kernel and friends) and the device hands
// it to the kernel with its failure words filled in.
struct GraphLaunch {
  uint32_t tag = 0;
  int rank = 0;
  int world_size = 1;
  int blocks = 1;
  int barriers = 0;                      // in this kernel
  uint8_t slot[kMaxGraphBarriers] = {};  // of each barrier
  uint32_t* own = nullptr;               // this rank's flags of the channel
  // Every rank's flags of the channel as mapped here (this rank's too), where this rank stores.
  uint32_t* peer[kMaxGraphRanks] = {};
  // Words block 0 zeroes before its first store (an open: this rank's graph counts), or none.
  uint32_t* reset = nullptr;
  uint32_t reset_words = 0;
  // Filled by the device: the deadline of each wait, where a give-up is recorded (CUDA: a
  // cuda::GraphGiveUp in host-mapped memory), and the words a wait ends at (NOTE [Failure words]:
  // this rank's failure word; the device's own failure).
  uint64_t timeout_ns = 0;
  void* give_up = nullptr;
  const uint32_t* peer_failed = nullptr;
  const uint32_t* failed = nullptr;
  bool trap_on_peer_failure = false;  // NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp
  // NOTE [One captured op at a time]: this rank's graph busy word, the op's owner number (nonzero,
  // in kGraphOwnerMask), and whether this kernel takes the word at entry and gives it back at its
  // end (a kernel op: both; an open: takes; a close: gives back; a barrier inside an op: neither).
  uint32_t* busy = nullptr;
  uint32_t owner = 0;
  bool takes = false;
  bool releases = false;

  // The word this rank consumes from `src`, and the word it stores into in `target`'s pad.
  CUDA_P2P_HOST_DEVICE uint32_t* mine(int block, int i, int src) const {
    return own + graph_flag_index(world_size, block, slot[i], src);
  }
  CUDA_P2P_HOST_DEVICE uint32_t* theirs(int block, int i, int target) const {
    return peer[target] + graph_flag_index(world_size, block, slot[i], rank);
  }
};

}  // namespace cuda_p2p
