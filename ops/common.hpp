// The vocabulary every op of this layer shares: reduce operations, the type a reduction
// accumulates in, and how a range is split into near-equal parts.
#pragma once

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <utility>

#include "ops/reduce_op.hpp"

namespace cuda_p2p::ops {

// A name table of an enum's values (the settings' vocabularies): the name of a value, and the
// value of a name, where an unknown name raises ValueError naming `what` and every known name.
template <typename E>
struct NamedValue {
  E value;
  const char* name;
};
template <typename E, size_t N>
const char* name_of(const NamedValue<E> (&names)[N], E value) {
  for (const auto& n : names) {
    if (n.value == value) return n.name;
  }
  return "?";
}
template <typename E, size_t N>
E parse_named(const NamedValue<E> (&names)[N], const std::string& name, const std::string& what) {
  std::string known;
  for (const auto& n : names) {
    if (name == n.name) return n.value;
    known += known.empty() ? n.name : std::string("|") + n.name;
  }
  TORCH_CHECK_VALUE(false, "cuda_p2p: ", what, " must be one of ", known, ", got '", name, "'");
}

// How the ranks agree that an op's inputs are symmetric tensors (NOTE [Zero-copy collectives] in
// ops/zero_copy.cpp): kExchange (host workspaces only) or kSignature; kOff never reads them in
// place (they stage); kAuto is exchange on the host, off on CUDA (NOTE [CUDA zero-copy is
// opt-in]).
enum class ZeroCopyAgreement : uint8_t { kAuto, kExchange, kSignature, kOff };
// NOTE [CUDA zero-copy is opt-in]
// Signature agreement trusts that every rank's tensors lie at the same heap offsets. On a GPU
// that fails without a word when pool tensors are freed at different times on different ranks
// (a tensor record-streamed on NCCL's stream is released when that stream gets there), and the
// ranks then read garbage until the host next compares. The exchange, which cannot be wrong, needs
// a host workspace. So until a GPU run has validated it, a CUDA group stages by default ("off");
// "signature" is the user's opt-in (Options.zero_copy_agreement, CUDA_P2P_ZERO_COPY_AGREEMENT).
// kAuto resolved for a workspace on the host (`host`) or on a GPU.
inline ZeroCopyAgreement resolve_agreement(ZeroCopyAgreement a, bool host) {
  if (a != ZeroCopyAgreement::kAuto) return a;
  return host ? ZeroCopyAgreement::kExchange : ZeroCopyAgreement::kOff;
}
const char* to_string(ZeroCopyAgreement a);  // "auto", "exchange", "signature", "off"
// `what` names the option or variable in the error for an unknown name.
ZeroCopyAgreement parse_zero_copy_agreement(const std::string& name, const std::string& what);
// What an op signature carries about the agreement when the group has a heap: "" for the
// device's default, else "zero_copy_agreement <name>" - ranks that agree differently run
// different phases, so they must disagree in the signature.
std::string agreement_text(ZeroCopyAgreement a, bool host);

// ReduceOp and to_string(ReduceOp): ops/reduce_op.hpp.
// "sum", "avg", ... (the names the dispatcher ops take, and op signatures use).
std::string lower_name(ReduceOp op);
// The op named `name` ("sum", "avg", ...) among `allowed`; a ValueError naming `what` and the
// allowed names otherwise.
ReduceOp parse_reduce_op(std::string_view name, std::initializer_list<ReduceOp> allowed,
                         const char* what);

// The type a reduction accumulates in: float32 for float16 and bfloat16, the dtype itself
// otherwise (rounded once, at the end).
inline at::ScalarType accumulate_type(at::ScalarType dtype) {
  return dtype == at::kHalf || dtype == at::kBFloat16 ? at::kFloat : dtype;
}

// [begin, end) of part i of `total` split into `parts` nearly equal parts (the first
// total % parts parts one larger).
inline std::pair<int64_t, int64_t> split_range(int64_t total, int64_t parts, int64_t i) {
  const int64_t q = total / parts, r = total % parts;
  const int64_t begin = i * q + std::min(i, r);
  return {begin, begin + q + (i < r ? 1 : 0)};
}

}  // namespace cuda_p2p::ops
