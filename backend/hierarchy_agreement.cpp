#include "backend/hierarchy_agreement.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <string>

#include "backend/hierarchical.hpp"
#include "backend/reduce_ops.hpp"
#include "ops/reduction.hpp"

namespace cuda_p2p {

// NOTE [Hierarchical agreement]
// A flat workspace group compares every op's signature before any data moves (NOTE [Op
// signatures] in ops/op_signature.cpp). The steps of a hierarchical collective cannot do that by
// themselves: each intra step compares only its host's ranks (and names them by local index), and
// the inter steps run on Gloo, which does not compare anything - given buffers of different sizes,
// its transport thread throws and the process aborts. So every hierarchical collective first has
// the whole group agree on the call, in a fixed-size exchange that cannot itself mismatch:
//
//  * Each rank encodes its signature - the op's kind and a text naming every argument the ranks
//    must agree on ("1000 x float32 sum"), plus its route when the call goes flat on the wrapped
//    backend ("(flat: dtype)"), or, when its own argument checks failed, the reason (an invalid
//    signature) - as one op descriptor (ops::encode_signature, SymmetricWorkspace::
//    kDescriptorWords words): its AgreementRecord.
//  * Intra: an all-gather of the records on the host's workspace (every host rank gets its
//    host's). Inter: an all-gather of the host's descriptors (padded to the widest host) among the
//    ranks of one local index, on even hosts every local index (each then has all W), on uneven
//    ones the leaders, who hand the W descriptors to their host by an intra broadcast.
//  * Every rank holds the same W descriptors, by group rank, parses each strictly (a malformed
//    one is the same error on every rank, naming its rank) and compares them as a flat group does
//    (ops::signature_disagreement): on any difference every rank throws the same
//    SignatureMismatch naming group ranks, before any step of the op; a rank whose own arguments
//    were invalid throws its own error and its peers name it. Every exchange was of the same size
//    on every rank and completed, so the group stays usable.
//  * The route is part of the signature: ranks that would run a call hierarchically on some ranks
//    and flat on others (a dtype, a device, a reduce op one rank's call cannot take) disagree
//    instead of waiting in different collectives. Every hierarchical entry point therefore agrees,
//    also for calls that then go flat; all_gather_v and barrier too (barrier: the exchange is a
//    barrier of the whole group).
//  * Not agreed: calls whose tensors are all on CUDA when the group wraps NCCL (they keep NCCL
//    without a host round trip per op), so a CUDA call on one rank against a CPU call on another
//    ends in the CPU side's timeout there.
//  * Small all-reduces ride in the agreement: every record has an inline area of kInlineBytes,
//    where an all-reduce of at most that many bytes (in its accumulation type: float32 for
//    float16 and bfloat16) puts its tensor. After the intra all-gather each rank reduces its
//    host's L payloads (host order), sends the host's partial with the host's descriptors, and
//    after the inter all-gather reduces the H partials (host order; AVG divides by W once) -
//    every rank the same bits - and writes the result only once all W descriptors agree. Whether
//    a call rides is a function of its signature, so all ranks that agree decide alike. Such an
//    all-reduce is two exchanges (three on uneven hosts) instead of the agreement's two plus the
//    algorithm's three.
//
// Cost: one intra all-gather of (128 + kInlineBytes) bytes per rank and one inter all-gather of
// a host's descriptors and kInlineBytes per host (and on uneven hosts an intra broadcast) before
// the op's own steps; none for a small all-reduce, which it replaces
// (docs/across_hosts.md).

// --- the record ---------------------------------------------------------------------------------

namespace {

// The descriptor's words as ops::encode_signature lays them out (NOTE [Op signatures]): a stamp
// (the handshake's number + 1), then the kind (bits 0-7), the invalid flag (bit 8) and the text's
// length (bits 16-31), then the text, zero-padded.
constexpr int kDescriptorWords = SymmetricWorkspace::kDescriptorWords;
constexpr int64_t kTextBytes = (kDescriptorWords - 2) * sizeof(uint32_t);
constexpr uint32_t kFirstStamp = 1;
constexpr uint32_t kInvalidFlag = 1u << 8;

std::string malformed(int rank, const std::string& expected) {
  return "cuda_p2p hierarchical agreement: rank " + std::to_string(rank) +
         "'s record is malformed: expected " + expected;
}

std::string hex(uint32_t x) {
  char s[9];
  std::snprintf(s, sizeof(s), "%x", x);
  return s;
}

}  // namespace

AgreementRecord AgreementRecord::of(const ops::OpSignature& signature) {
  return {.descriptor = ops::encode_signature(signature, 0)};
}

void AgreementRecord::encode(uint8_t* dst) const {
  std::memcpy(dst, descriptor.data(), kDescriptorBytes);
}

bool AgreementRecord::same_as(const uint8_t* src) const {
  return std::memcmp(src, descriptor.data(), kDescriptorBytes) == 0;
}

AgreementRecord AgreementRecord::decode(const uint8_t* src, int64_t size, int rank) {
  TORCH_CHECK(size >= kDescriptorBytes, malformed(rank, "a descriptor of "), kDescriptorBytes,
              " bytes, got ", size);
  AgreementRecord r;
  std::memcpy(r.descriptor.data(), src, kDescriptorBytes);
  const auto& w = r.descriptor;
  TORCH_CHECK(w[0] == kFirstStamp, malformed(rank, "stamp "), kFirstStamp, ", got ", w[0]);
  const uint32_t kind = w[1] & 0xff;
  constexpr auto kFirstKind = static_cast<uint32_t>(ops::OpId::kBarrier);
  constexpr auto kEndKind = static_cast<uint32_t>(ops::OpId::kEnd);
  TORCH_CHECK(ops::is_op_id(kind), malformed(rank, "an op kind in ["), kFirstKind, ", ", kEndKind,
              "), got ", kind);
  const uint32_t flags = w[1] & 0xff00;
  TORCH_CHECK((flags & ~kInvalidFlag) == 0, malformed(rank, "no flag but invalid (0x"),
              hex(kInvalidFlag), "), got 0x", hex(flags));
  const int64_t length = w[1] >> 16;
  TORCH_CHECK(length <= kTextBytes, malformed(rank, "a text of at most "), kTextBytes,
              " bytes, got ", length);
  const auto* text = reinterpret_cast<const uint8_t*>(&w[2]);
  for (int64_t i = length; i < kTextBytes; ++i) {
    TORCH_CHECK(text[i] == 0, malformed(rank, "zeros after its text of "), length,
                " bytes, got byte ", static_cast<int>(text[i]), " at ", i);
  }
  return r;
}

// --- the exchanges ------------------------------------------------------------------------------

namespace {

// The rows of `rows` ([k, n]) reduced with `op` (AVG as a sum), in row order.
at::Tensor reduce_rows(const at::Tensor& rows, const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
      return rows.sum(0, false, rows.scalar_type());
    case c10d::ReduceOp::PRODUCT:
      return rows.prod(0, false, rows.scalar_type());
    case c10d::ReduceOp::MIN:
      return rows.amin(0);
    case c10d::ReduceOp::MAX:
      return rows.amax(0);
    case c10d::ReduceOp::BAND:
    case c10d::ReduceOp::BOR:
    case c10d::ReduceOp::BXOR: {
      at::Tensor r = rows[0].clone();
      for (int64_t i = 1; i < rows.size(0); ++i) {
        if (op.op_ == c10d::ReduceOp::BAND) r.bitwise_and_(rows[i]);
        if (op.op_ == c10d::ReduceOp::BOR) r.bitwise_or_(rows[i]);
        if (op.op_ == c10d::ReduceOp::BXOR) r.bitwise_xor_(rows[i]);
      }
      return r;
    }
    default:
      TORCH_CHECK(false, "cuda_p2p hierarchy: no inline reduction for reduce op ",
                  static_cast<int>(op.op_));
  }
}

}  // namespace

HierarchyAgreement::HierarchyAgreement(const HostLayout& layout, int rank)
    : world_(static_cast<int>(layout.host.size())),
      local_(layout.local.at(rank)),
      even_(layout.even()),
      crosses_(local_ < layout.min_host_size() && (even_ || local_ == 0)),
      hosts_(layout.hosts),
      host_ranks_(static_cast<int64_t>(layout.hosts[layout.host.at(rank)].size())) {
  for (const auto& h : hosts_) widest_ = std::max<int64_t>(widest_, h.size());
}

bool HierarchyAgreement::fits_inline(const at::Tensor& t) {
  return t.numel() > 0 &&
         t.numel() *
                 static_cast<int64_t>(c10::elementSize(ops::accumulate_type(t.scalar_type()))) <=
             AgreementRecord::kInlineBytes;
}

bool HierarchyAgreement::agree(const ops::OpSignature& mine, const AgreementSteps& steps,
                               const at::Tensor& payload, const c10d::ReduceOp& op) {
  constexpr int64_t R = AgreementRecord::kDescriptorBytes;
  const AgreementBlock rank_block{1}, host_block{widest_}, group_block{world_};
  const int H = static_cast<int>(hosts_.size());
  const int64_t L = host_ranks_;
  if (!own_.defined()) {
    const auto bytes = at::TensorOptions().dtype(at::kByte);
    own_ = at::empty({rank_block.bytes()}, bytes);
    host_recs_ = at::zeros({widest_ * rank_block.bytes()}, bytes);  // the padding stays zero
    host_out_ = at::zeros({host_block.bytes()}, bytes);
    gathered_ = at::empty({H * host_block.bytes()}, bytes);
    all_ = at::empty({group_block.bytes()}, bytes);
  }
  const AgreementRecord record = AgreementRecord::of(mine);
  const bool carry = payload.defined();
  const at::ScalarType acc = carry ? ops::accumulate_type(payload.scalar_type()) : at::kByte;
  const int64_t acc_bytes =
      carry ? payload.numel() * static_cast<int64_t>(c10::elementSize(acc)) : 0;
  auto* own = own_.data_ptr<uint8_t>();
  record.encode(own + rank_block.descriptor_offset(0));
  if (carry) std::memcpy(own + rank_block.inline_offset(), payload.data_ptr(), payload.nbytes());

  // Intra: the host's records; its descriptors and partial go across hosts.
  steps.intra_all_gather(host_recs_.narrow(0, 0, L * rank_block.bytes()), own_);
  const auto* recs = host_recs_.data_ptr<uint8_t>();
  auto* out = host_out_.data_ptr<uint8_t>();
  bool host_agrees = true;
  for (int64_t k = 0; k < L; ++k) {
    const uint8_t* theirs = recs + k * rank_block.bytes() + rank_block.descriptor_offset(0);
    std::memcpy(out + host_block.descriptor_offset(k), theirs, R);
    host_agrees = host_agrees && record.same_as(theirs);
  }
  if (carry && host_agrees) {  // the host's partial, accumulated (AVG: a sum so far)
    const at::Tensor rows =
        host_recs_.view({widest_, rank_block.bytes()})
            .narrow(0, 0, L)
            .narrow(1, rank_block.inline_offset(), static_cast<int64_t>(payload.nbytes()))
            .view(payload.scalar_type())
            .to(acc);
    host_out_.narrow(0, host_block.inline_offset(), acc_bytes)
        .view(acc)
        .copy_(reduce_rows(rows, op));
  }

  // Inter: every host's block; the group's descriptors by rank, and the result.
  auto* all = all_.data_ptr<uint8_t>();
  if (crosses_) {
    steps.inter_all_gather(gathered_, host_out_);
    const auto* from = gathered_.data_ptr<uint8_t>();
    bool agreed = true;
    for (int h = 0; h < H; ++h) {
      const auto& ranks = hosts_[h];
      for (size_t k = 0; k < ranks.size(); ++k) {
        const uint8_t* theirs =
            from + h * host_block.bytes() + host_block.descriptor_offset(static_cast<int64_t>(k));
        std::memcpy(all + group_block.descriptor_offset(ranks[k]), theirs, R);
        agreed = agreed && record.same_as(theirs);
      }
    }
    if (carry && agreed) {  // the hosts' partials, in host order on every rank: the same bits
      at::Tensor result = reduce_rows(gathered_.view({H, host_block.bytes()})
                                          .narrow(1, host_block.inline_offset(), acc_bytes)
                                          .view(acc),
                                      op);
      if (is_avg(op)) result.div_(world_);
      all_.narrow(0, group_block.inline_offset(), acc_bytes).view(acc).copy_(result);
    }
  }
  if (!even_) steps.intra_broadcast(all_, 0);

  // Every rank parses and compares the same W descriptors: the same verdict everywhere.
  std::vector<uint32_t> words(static_cast<size_t>(world_) * kDescriptorWords);
  for (int r = 0; r < world_; ++r) {
    const AgreementRecord theirs =
        AgreementRecord::decode(all + group_block.descriptor_offset(r), R, r);
    std::copy(theirs.descriptor.begin(), theirs.descriptor.end(),
              words.begin() + static_cast<std::ptrdiff_t>(r) * kDescriptorWords);
  }
  const std::string error =
      ops::signature_disagreement(words.data(), world_, record.descriptor, mine);
  if (!error.empty()) throw ops::SignatureMismatch(error);
  if (!carry) return false;
  payload.copy_(all_.narrow(0, group_block.inline_offset(), acc_bytes).view(acc));
  return true;
}

}  // namespace cuda_p2p
