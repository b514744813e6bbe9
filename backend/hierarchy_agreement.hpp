// The agreement of a group spanning hosts (NOTE [Hierarchical agreement] in
// hierarchy_agreement.cpp): before any hierarchical collective moves data, every rank of the group
// learns what every other rank passed, by an all-gather on each host and one across hosts; a
// small all-reduce rides along.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <functional>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <vector>

#include "ops/op_signature.hpp"

namespace cuda_p2p {

struct HostLayout;

// One rank's record in the agreement: the descriptor of its signature, followed on the wire by an
// inline area of kInlineBytes, where an all-reduce that rides in the agreement puts its tensor.
// The blocks the exchanges move are records of several ranks: `slots` descriptors, then one
// inline area (AgreementBlock).
struct AgreementRecord {
  static constexpr int64_t kDescriptorBytes = sizeof(ops::DescriptorWords);
  static constexpr int64_t kInlineBytes = 4096;

  // ops::encode_signature(signature, 0): the agreement is every call's first and only handshake.
  ops::DescriptorWords descriptor{};

  static AgreementRecord of(const ops::OpSignature& signature);
  // Writes the descriptor to the kDescriptorBytes at `dst`.
  void encode(uint8_t* dst) const;
  // Whether the kDescriptorBytes at `src` are this record's descriptor.
  bool same_as(const uint8_t* src) const;
  // The record of group rank `rank`, read from the `size` bytes at `src`. Strict: anything but a
  // descriptor `of` writes (short, another stamp, an unknown op kind, stray flags, a text longer
  // than the descriptor holds or with bytes after it) raises, naming the rank and what was
  // expected.
  static AgreementRecord decode(const uint8_t* src, int64_t size, int rank);
};

// A block of the agreement's exchanges: `slots` descriptors, then the inline area. A rank's own
// block has one slot; a host's, what it sends across hosts, one per rank of the widest host (the
// padding zero); the group's, one per rank.
struct AgreementBlock {
  int64_t slots;
  int64_t bytes() const { return inline_offset() + AgreementRecord::kInlineBytes; }
  int64_t descriptor_offset(int64_t slot) const { return slot * AgreementRecord::kDescriptorBytes; }
  int64_t inline_offset() const { return slots * AgreementRecord::kDescriptorBytes; }
};

// The hierarchy's steps the exchanges run on (with its errors, which name the group's ranks).
struct AgreementSteps {
  std::function<void(const at::Tensor& out, const at::Tensor& in)> intra_all_gather;
  std::function<void(const at::Tensor& out, const at::Tensor& in)> inter_all_gather;
  std::function<void(const at::Tensor& t, int local_root)> intra_broadcast;
};

class HierarchyAgreement {
 public:
  HierarchyAgreement(const HostLayout& layout, int rank);

  // Exchanges `mine`, this rank's signature, across the group: throws ops::SignatureMismatch when
  // the group's signatures differ; returns normally when they all agree or `mine` is itself
  // invalid (the caller raises its own error). With a `payload` (a contiguous all-reduce that
  // fits_inline), the exchange carries it and reduces it with `op` in place: returns true when it
  // did (every rank agreed). Not thread-safe: the caller serialises its calls.
  bool agree(const ops::OpSignature& mine, const AgreementSteps& steps,
             const at::Tensor& payload = at::Tensor(), const c10d::ReduceOp& op = c10d::ReduceOp());
  // Whether an all-reduce of `t` rides in the agreement.
  static bool fits_inline(const at::Tensor& t);

 private:
  const int world_;                            // W
  const int local_;                            // this rank's local index
  const bool even_;                            // every host has as many ranks
  const bool crosses_;                         // this rank takes the inter-host all-gather
  const std::vector<std::vector<int>> hosts_;  // by host: its ranks
  const int64_t host_ranks_;                   // L: the ranks of this rank's host
  int64_t widest_ = 0;                         // the most ranks a host has
  // The exchanges' buffers, made on first use: this rank's block, its host's ranks' blocks as the
  // intra all-gather delivers them (padded to the widest host), the host's block across hosts,
  // every host's as the inter all-gather delivers them, and the group's block.
  at::Tensor own_, host_recs_, host_out_, gathered_, all_;
};

}  // namespace cuda_p2p
