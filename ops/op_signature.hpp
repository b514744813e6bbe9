// Cross-rank agreement on what a workspace op is about to do (NOTE [Op signatures] in
// ops/op_signature.cpp): every collective and fused op publishes a small descriptor of its
// arguments with a barrier it runs anyway (or a handshake barrier of its own), and every rank
// compares all ranks' descriptors before any data is read from a peer.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "ops/op_spec.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p::ops {

// "float32", "bfloat16", ... (the torch names users write).
std::string dtype_name(at::ScalarType dtype);
// What a signature says of the tensors of a call that no workspace algorithm describes (a route to
// the wrapped backend, a hierarchical collective): "1000 x float32", "4 x float32 on cuda",
// "2 tensors [3 x int64, 3 x int64]".
std::string describe_tensors(c10::ArrayRef<at::Tensor> tensors);

// What one rank passed to one op: its kind and a text that names every argument the ranks must
// agree on ("4194304 x float32 sum (two_shot)"), or, when the rank's own argument check failed,
// the reason. Two ranks agree when kind, validity and text are identical.
struct OpSignature {
  OpId kind = OpId::kBarrier;
  bool invalid = false;
  std::string text;

  static OpSignature of(OpId kind, std::string text) { return {kind, false, std::move(text)}; }
  static OpSignature rejected(OpId kind, std::string reason) {
    return {kind, true, std::move(reason)};
  }
};

// The tag of a captured op's flags (NOTE [Graph flags] in p2p_workspace/graph_flags.hpp): a hash
// of its signature, so that under capture, where no descriptor is compared, a rank that meets
// another op at a flag barrier raises (on the device) instead of pairing the two. `path` tells
// the ways an op can run apart ("kernel").
uint32_t graph_tag(const OpSignature& sig, const char* path = "");

// The exception every rank raises when the ranks disagree (or a peer rejected its arguments):
// the op did not run, and the group stays usable. Its what() is one line.
class SignatureMismatch : public c10::Error {
 public:
  explicit SignatureMismatch(std::string msg) : c10::Error(std::move(msg)) {}
};

// Per-channel bookkeeping of the handshakes (owned by the collective or pipeline state: one
// channel is driven by one stream at a time).
struct SignatureState {
  // Handshakes so far on the channel: picks the descriptor slot pair (NOTE [Op signatures]).
  uint64_t count = 0;
  // Where a comparison in stream order records the first disagreement not yet raised
  // (ops/signature_kernels.hpp): the kernel's on CUDA, the same logic as a host task on a host
  // device with CUDA's semantics (NOTE [Synchronous host devices] in p2p_workspace/device.hpp).
  // Words of the device's pool taken on first use (Device::host_words, never freed: NOTE
  // [Pinned pools]); none on a host-synchronous device, whose comparisons report at once.
  HostWords device_record;
};

// Writes this rank's descriptor of handshake `state.count` into every rank's pad (its own
// included), in the order of stream `s`. The barrier that follows on `channel` publishes it.
void publish_signature(SymmetricWorkspace& ws, Stream& s, int channel, const SignatureState& state,
                       const OpSignature& sig);
// After that barrier: compares every rank's descriptor. On a host-synchronous device (NOTE
// [Synchronous host devices]) now, on the caller's thread: returns the one-line error every rank
// raises, or "" when they agree. Elsewhere (CUDA; the host with CUDA's semantics) the comparison
// runs in stream order and records a disagreement in state.device_record (see
// check_signature_record); returns "". Advances state.count either way.
std::string compare_signatures(SymmetricWorkspace& ws, Stream& s, int channel,
                               SignatureState& state, const OpSignature& mine);
// The whole handshake: publish, barrier on `channel`, compare. Throws SignatureMismatch (or, on
// this rank's own invalid signature, nothing: the caller raises its own error) on the host.
std::string handshake(SymmetricWorkspace& ws, Stream& s, int channel, SignatureState& state,
                      const OpSignature& mine);
// The descriptor of `sig` for handshake number `count` (what publish_signature writes), and the
// error every rank raises given the W descriptors `all` of a handshake in its own pad ("" when
// all equal `mine` or `sig` is itself invalid: what compare_signatures checks). For a caller that
// writes and compares the pads itself, on the host (NOTE [Inline one-shot] in ops/all_reduce.cpp).
using DescriptorWords = std::array<uint32_t, SymmetricWorkspace::kDescriptorWords>;
DescriptorWords encode_signature(const OpSignature& sig, uint64_t count);
std::string signature_disagreement(const uint32_t* all, int world_size, const DescriptorWords& mine,
                                   const OpSignature& sig);
// Where the comparison runs in stream order (CUDA; the host with CUDA's semantics): throws the
// SignatureMismatch a comparison recorded, if any, after failing `device` (the group's) with it:
// the ranks ran that op on their own arguments, and may be out of step (NOTE [Op signatures]). A
// device that had failed already raises its own failure instead (a released stream compares
// whatever the pads hold).
// A no-op on a host-synchronous device, whose comparisons report at once (no record: the test is
// inline, on every op's path).
void check_recorded_signature(SignatureState& state, const char* what, Device* device);
inline void check_signature_record(SignatureState& state, const char* what,
                                   Device* device = nullptr) {
  if (state.device_record.host != nullptr) {
    check_recorded_signature(state, what, device);
  }
}

}  // namespace cuda_p2p::ops
