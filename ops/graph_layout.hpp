// How a captured collective run as one kernel splits its data (NOTE [Captured collectives in one
// kernel] in ops/captured_collectives.cpp): which elements each block stages and reads, and where
// they lie in the graph region. Plain C++, shared by the host's body of the op and its CUDA kernel
// (ops/cuda/graph_collectives.cu), so that both cut the data alike; also the element types the
// CUDA kernels reduce.
#pragma once

#include <cstdint>

#include "p2p_workspace/graph_flags.hpp"

namespace cuda_p2p::ops::graph {

// One packed load: every block's range starts at a multiple of it.
inline constexpr int64_t kUnitBytes = 16;
// Bytes a block stages before the op takes another block (up to kMaxGraphBlocks).
inline constexpr int64_t kBlockBytes = 32 << 10;
// Offsets in the region: whole cache lines.
inline constexpr int64_t kRegionAlign = 64;
// Threads of a block on the GPU (the first world_size of them also run the flag barriers).
inline constexpr int kThreads = 512;

// The element types of the CUDA kernels (ops/cuda/), named without ATen.
enum class Dtype : int { kFloat, kDouble, kHalf, kBFloat16, kInt8, kUInt8, kInt16, kInt32, kInt64 };

enum class Kind : int { kOneShot, kTwoShot, kAllGather, kReduceScatter };

struct Range {
  int64_t begin;
  int64_t end;
};

CUDA_P2P_HOST_DEVICE inline int64_t align_up(int64_t v, int64_t to) {
  return (v + to - 1) / to * to;
}

// Part i of `parts` of n elements of `esize` bytes (1, 2, 4 or 8), cut at whole units; the
// first units % parts parts one unit larger, the last one holding the tail.
CUDA_P2P_HOST_DEVICE inline Range part(int64_t n, int64_t esize, int64_t parts, int64_t i) {
  const int64_t per = kUnitBytes / esize;
  const int64_t units = (n + per - 1) / per;
  const int64_t q = units / parts, r = units % parts;
  const int64_t ub = i * q + (i < r ? i : r);
  const int64_t ue = ub + q + (i < r ? 1 : 0);
  return {ub * per < n ? ub * per : n, ue * per < n ? ue * per : n};
}

// What one kernel op moves, the same on every rank (it depends on the op's sizes only).
struct Layout {
  Kind kind = Kind::kOneShot;
  int world_size = 1;
  int rank = 0;
  int blocks = 1;
  // One-shot and two-shot: the tensor's elements; all-gather: each rank's input's; reduce-scatter:
  // each chunk's (the output's).
  int64_t numel = 0;
  int64_t esize = 1;

  // Barriers: the open, the data published (and for the two-shot the reduced chunks published).
  CUDA_P2P_HOST_DEVICE int barriers() const { return kind == Kind::kTwoShot ? 3 : 2; }
  // Bytes each rank stages, which size the blocks.
  CUDA_P2P_HOST_DEVICE int64_t staged() const {
    return kind == Kind::kReduceScatter ? world_size * numel * esize : numel * esize;
  }
  // Two-shot: chunk c of the tensor (rank c reduces it); block b's range of `r`.
  CUDA_P2P_HOST_DEVICE Range chunk(int c) const { return part(numel, esize, world_size, c); }
  CUDA_P2P_HOST_DEVICE Range block_of(Range r, int b) const {
    const Range p = part(r.end - r.begin, esize, blocks, b);
    return {r.begin + p.begin, r.begin + p.end};
  }
  // Block b's range of the op's elements (one-shot, all-gather; reduce-scatter: of each chunk).
  CUDA_P2P_HOST_DEVICE Range block(int b) const { return part(numel, esize, blocks, b); }
  // Two-shot: where rank c's reduced chunk c starts in its region (element chunk(c).begin of the
  // chunk lands here); reduce-scatter: where chunk c starts in every region.
  CUDA_P2P_HOST_DEVICE int64_t reduced_offset() const {
    return align_up(numel * esize, kRegionAlign);
  }
  CUDA_P2P_HOST_DEVICE int64_t chunk_stride() const {
    return align_up(numel * esize, kRegionAlign);
  }
  // Bytes of the region the op uses.
  CUDA_P2P_HOST_DEVICE int64_t region_bytes() const {
    switch (kind) {
      case Kind::kTwoShot: {
        const Range c0 = chunk(0);  // the largest
        return reduced_offset() + align_up((c0.end - c0.begin) * esize, kRegionAlign);
      }
      case Kind::kReduceScatter:
        return world_size * chunk_stride();
      default:
        return numel * esize;
    }
  }
};

// Blocks of an op that stages `bytes` per rank.
inline int blocks_for(int64_t bytes) {
  const int64_t b = (bytes + kBlockBytes - 1) / kBlockBytes;
  return static_cast<int>(b < 1 ? 1 : (b > kMaxGraphBlocks ? kMaxGraphBlocks : b));
}

}  // namespace cuda_p2p::ops::graph
