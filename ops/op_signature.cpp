#include "ops/op_signature.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <numeric>
#include <string_view>
#include <utility>
#include <vector>

#include "ops/signature_body.hpp"
#include "ops/signature_kernels.hpp"

namespace cuda_p2p::ops {

// NOTE [Op signatures]
// Ranks that pass different arguments to one op (sizes, dtypes, reduce ops, roots, fused-op
// shapes and dims, an algorithm forced on one rank only) would otherwise read each other's
// buffers with the wrong layout, or run different numbers of phases and signals and leave the
// group out of step. So every workspace op, before any rank reads anything from a peer, has every
// rank publish a descriptor of what it is about to do and compares all of them:
//
//  * The descriptor (SymmetricWorkspace::kDescriptorWords words) is a stamp, the op's kind, a
//    validity bit and a text naming every argument the ranks must agree on, including the
//    algorithm each rank chose ("4194304 x float32 sum (two_shot)"). Texts longer than the slot
//    keep a hash of the rest. Two ranks agree when the words are identical.
//  * Each rank writes it into a descriptor slot of every rank's pad (its own included), so that
//    every comparison reads local memory only, then passes a barrier on the op's channel, whose
//    release stores publish the descriptors; after the barrier each rank compares the W
//    descriptors in its own pad. The collectives whose first communication is a full barrier
//    (one-shot, two-shot, the direct algorithms) publish with that very barrier, at no extra
//    cost; the others (rings, broadcast, zero-size ops) and the fused ops (which run their own
//    barriers on other streams) run a handshake barrier of their own first.
//  * Slots come in pairs per channel, used by alternate handshakes (SignatureState::count), and
//    the stamp is the handshake's number: a rank may write handshake n+1's descriptor before a
//    slower peer has compared handshake n's, but not handshake n+2's, which needs that peer's
//    signal of handshake n+1, sent after its comparison.
//  * Every rank sees the same W descriptors, so if any two differ every rank finds a mismatch and
//    raises the same error naming what each rank passed. The barrier counts the same on every
//    rank, and the collectives then settle their phase counters identically (NOTE [Collective
//    phases]; the fused ops handshake before they touch any phase or buffer), so the group stays
//    usable: the next, correct, op runs.
//  * A rank whose own argument check failed where its peers cannot see it (an output of the
//    wrong size on one rank) publishes an "invalid" descriptor carrying its reason, then raises
//    its own error; its peers raise at once, naming it, instead of waiting for a timeout.
//
// Host: the comparison runs on the caller's thread right after the barrier, and a mismatch is
// raised before anything else is enqueued. CUDA (where it has run: docs/testing.md): publication
// and comparison are two one-block kernels in stream order (ops/cuda/signature_kernel.cu); the
// comparison records a disagreement in host-mapped memory, which check_signature_record turns
// into the same error when the host next looks (the group's next collective or fused op, a
// barrier's synchronize, or the op's Work: NOTE [Mismatches reach the Work] in backend/works.cpp).
// The op itself has then run on mismatched arguments: its results are garbage and, where the ranks'
// signal counts differ, it may also time out. So on CUDA the disagreement fails the group's device
// with that error: every later call raises it, and the group must be recreated. That the group
// stays usable is the host's promise only (a device that is host_synchronous(), NOTE [Synchronous
// host devices]; with CUDA's semantics the host records and fails like CUDA).

// NOTE [A disagreement fails the device at once]
// Why: where the comparison runs in stream order (CUDA; the host with CUDA's semantics) the op
// after it runs anyway, each rank with its own arguments (NOTE [Op signatures]). Where the ranks'
// phases then differ (two ranks that each name themselves the root; a rank that rejected its
// arguments and enqueued nothing more), a wait of the op waits for a signal no peer sends: for the
// group's whole timeout, and then it raises "never arrived" instead of the disagreement.
// How: when a channel's record is first made, compare_signatures registers a probe of it with
// the device (Device::add_failure_probe). The device's watchdog, which scans every max_poll
// (Watchdog::kDefaultMaxPoll) while a wait is tracked, asks it, and once a disagreement is
// recorded fails the device with it, publishes it to the peers and releases every pending wait
// (NOTE [Releasing blocked waits] in p2p_workspace/watchdog.hpp). Each rank's waits so end
// within about max_poll of its comparison, and its Work, its next call and get_error() name the
// disagreement. The probe only reads the record: the caller's check (check_recorded_signature)
// still takes it where it looks first.
// Which failure is named: a peer's failure word set by then comes first, as in
// check_recorded_signature. A stale record (a released peer's stream wrote into this rank's pads)
// always finds its peer's word set, since that peer published first (NOTE [Failure words]); a
// genuine one may too, the peer's own probe having been faster, and then names what the peer
// saw, the odd ranks first (describe()).
// Not done: the data the released streams then move is garbage, as it was before: copy-engine
// copies cannot ask the comparison, so on CUDA the outputs are not left untouched
// (docs/collectives.md).

namespace {

constexpr int kWords = SymmetricWorkspace::kDescriptorWords;
constexpr size_t kTextBytes = (kWords - 2) * sizeof(uint32_t);
using Words = std::array<uint32_t, kWords>;

uint32_t fnv1a(const std::string& s) {
  uint32_t h = 2166136261u;
  for (unsigned char c : s) h = (h ^ c) * 16777619u;
  return h;
}

Words encode(const OpSignature& sig, uint64_t count) {
  Words w{};
  std::string text = sig.text;
  if (text.size() > kTextBytes) {
    // Too long for the slot: shortened at a word's end, with a marker and a hash of the whole
    // text, so that two texts that differ past the cut still differ (NOTE [Op signatures]) and
    // an error quoting it never shows half a word ("got 4026 ... #1a2b3c4d", not "got~1a2b").
    static constexpr char kHex[] = "0123456789abcdef";
    static constexpr const char* kMarker = " ... #";
    const uint32_t h = fnv1a(text);
    const size_t room = kTextBytes - std::strlen(kMarker) - 8;
    size_t cut = room;
    while (cut > room / 2 && text[cut] != ' ') --cut;  // back to a word's end, if one is near
    if (cut == room / 2) cut = room;                   // one long word: cut it
    while (cut > 0 && text[cut - 1] == ' ') --cut;
    text.resize(cut);
    text += kMarker;
    for (int i = 7; i >= 0; --i) text += kHex[(h >> (4 * i)) & 0xf];
  }
  w[0] = static_cast<uint32_t>(count + 1);  // never 0: an unwritten slot is never current
  w[1] = static_cast<uint32_t>(sig.kind) | (sig.invalid ? 1u << 8 : 0u) |
         (static_cast<uint32_t>(text.size()) << 16);
  std::memcpy(&w[2], text.data(), text.size());
  return w;
}

struct Decoded {
  uint32_t stamp;
  OpId kind;
  bool invalid;
  std::string text;
};

Decoded decode(const uint32_t* w) {
  Decoded d;
  d.stamp = w[0];
  d.kind = static_cast<OpId>(w[1] & 0xff);
  d.invalid = (w[1] >> 8) & 1;
  const size_t len = std::min<size_t>(w[1] >> 16, kTextBytes);
  d.text.assign(reinterpret_cast<const char*>(&w[2]), len);
  return d;
}

// What a descriptor's kind byte names: a peer's garbage (a failed rank's pad) names no op.
const char* kind_name(OpId kind) {
  return is_op_id(static_cast<uint32_t>(kind)) ? name(kind) : "an unknown op";
}

// When a rank claimed zero-copy (NOTE [Zero-copy collectives] in ops/zero_copy.cpp), what the user
// can do about a disagreement.
std::string zero_copy_hint(const std::vector<Decoded>& d) {
  for (const auto& x : d) {
    if (x.text.find("zero-copy:") != std::string::npos) {
      return ". A zero-copy claim differs: allocate the op's symmetric inputs alike on every rank "
             "(backend.symmetric_offset tells where each is), or set "
             "Options.zero_copy_agreement / CUDA_P2P_ZERO_COPY_AGREEMENT to 'off' (or "
             "'exchange' on the host)";
    }
  }
  return "";
}

// The error every rank raises, built from the W descriptors (identical on every rank, so the
// text is too); "" when they all equal `mine` or `mine` is itself invalid.
// The descriptors' policy on the host (ops/signature_body.hpp): plain accesses, ordered by the
// barrier's release and acquire.
struct HostSignature {
  uint32_t load(const uint32_t* p) const { return *p; }
  void store(uint32_t* p, uint32_t v) const { *p = v; }
};

// The error every rank raises for the W descriptors `d` (identical on every rank, so the text is
// too), told as an op of kind `kind`: the ranks that rejected their arguments, else what each
// passed.
std::string describe(const std::vector<Decoded>& d, OpId kind) {
  const int W = static_cast<int>(d.size());
  std::string msg = std::string("cuda_p2p ") + kind_name(kind) + ": ";
  std::string rejected;
  for (int r = 0; r < W; ++r) {
    if (!d[r].invalid) continue;
    rejected += (rejected.empty() ? "rank " : "; rank ") + std::to_string(r) +
                " rejected its arguments (" + d[r].text + ")";
  }
  if (!rejected.empty()) return msg + rejected + "; the op did not run on any rank";
  bool same_kind = true, same_stamp = true;
  for (int r = 0; r < W; ++r) {
    same_kind = same_kind && d[r].kind == d[0].kind;
    same_stamp = same_stamp && d[r].stamp == d[0].stamp;
  }
  msg += "ranks disagree: ";
  // The odd ranks first: those whose description fewer ranks share (rank order among equals), so
  // that a text shortened on its way to the peers (NOTE [Failure words]) still names them.
  auto shared_by = [&](int r) {
    int n = 0;
    for (int q = 0; q < W; ++q) n += d[q].kind == d[r].kind && d[q].text == d[r].text;
    return n;
  };
  std::vector<int> order(W);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return shared_by(a) < shared_by(b); });
  for (int i = 0; i < W; ++i) {
    const int r = order[i];
    msg += (i ? ", rank " : "rank ") + std::to_string(r) + " passed ";
    if (!same_kind) msg += std::string(kind_name(d[r].kind)) + (d[r].text.empty() ? "" : " of ");
    msg += d[r].text;
  }
  if (!same_stamp) {  // a protocol error, not a user's: say so
    msg += " (handshake numbers differ:";
    for (int r = 0; r < W; ++r) msg += " " + std::to_string(d[r].stamp);
    msg += ")";
  }
  return msg + "; the op did not run on any rank" + zero_copy_hint(d);
}

std::string disagreement(const uint32_t* all, int W, const Words& mine, const OpSignature& sig) {
  static_assert(kWords == kSignatureBodyWords, "one descriptor size");
  bool differs = false;
  for (int i = 0; i < kWords && !differs; ++i) {
    differs = signature_word_differs(all, W, mine.data(), i, HostSignature{});
  }
  if (!differs || sig.invalid) return "";
  std::vector<Decoded> d;
  for (int r = 0; r < W; ++r) d.push_back(decode(all + r * kWords));
  return describe(d, sig.kind);
}

}  // namespace

uint32_t graph_tag(const OpSignature& sig, const char* path) {
  const std::string text = std::string(kind_name(sig.kind)) + (sig.invalid ? " rejected: " : ": ") +
                           sig.text + " " + path;
  return cuda_p2p::graph_tag(text.data(), text.size());
}

std::string dtype_name(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat:
      return "float32";
    case at::kDouble:
      return "float64";
    case at::kHalf:
      return "float16";
    case at::kBFloat16:
      return "bfloat16";
    case at::kByte:
      return "uint8";
    case at::kChar:
      return "int8";
    case at::kShort:
      return "int16";
    case at::kInt:
      return "int32";
    case at::kLong:
      return "int64";
    case at::kBool:
      return "bool";
    default:
      return c10::toString(dtype);
  }
}

std::string describe_tensors(c10::ArrayRef<at::Tensor> tensors) {
  const auto one = [](const at::Tensor& t) {
    if (!t.defined()) return std::string("an undefined tensor");
    std::string s = std::to_string(t.numel()) + " x " + dtype_name(t.scalar_type());
    if (!t.is_cpu()) s += std::string(" on ") + c10::DeviceTypeName(t.device().type(), true);
    if (t.layout() != at::kStrided) s += " (" + c10::str(t.layout()) + ")";
    return s;
  };
  if (tensors.size() == 1) return one(tensors[0]);
  std::string s = std::to_string(tensors.size()) + " tensors [";
  for (size_t i = 0; i < tensors.size(); ++i) s += (i ? ", " : "") + one(tensors[i]);
  return s + "]";
}

void publish_signature(SymmetricWorkspace& ws, Stream& s, int channel, const SignatureState& state,
                       const OpSignature& sig) {
  const Words words = encode(sig, state.count);
  const int W = ws.world_size(), me = ws.rank();
  const int parity = static_cast<int>(state.count % 2);
  std::vector<uint32_t*> slots;
  slots.reserve(W);
  for (int r = 0; r < W; ++r) slots.push_back(ws.descriptor_slot(r, channel, parity, me));
  if (ws.device().host_paths() == nullptr) {  // NOTE [Host fast paths]: the pads are the GPU's
    publish_signature_on_device(ws.device(), s, words, slots);
    return;
  }
  ws.device().host_task(s, [words, slots = std::move(slots)] {
    for (int i = 0; i < kWords; ++i) {
      signature_publish_word(words.data(), slots.data(), static_cast<int>(slots.size()), i,
                             HostSignature{});
    }
  });
}

namespace {

// What a disagreement recorded in stream order fails the device with (NOTE [Op signatures]),
// from the text every rank raises on the host, `error` (describe()), without the op's name.
std::string recorded_reason(std::string error) {
  // Recorded in stream order: the op did run, on its mismatched arguments.
  static constexpr std::string_view kDidNotRun = "; the op did not run on any rank";
  if (const size_t at = error.find(kDidNotRun); at != std::string::npos) {
    error.erase(at, kDidNotRun.size());
  }
  return "an op's ranks disagreed (this op or an earlier one: " + error +
         "); its results are not valid, and the ranks may be out of step";
}

// What the comparison's record (ops/signature_kernels.hpp) fails the device with, or "" while it
// holds none; `take`: clears it (the caller raises it). The descriptors are told as the host's
// comparison tells them (describe()), the first valid one naming the op.
std::string device_record_reason(uint32_t* rec, bool take) {
  // The kernel wrote the record's words, then (fenced) its flag.
  std::atomic_ref<uint32_t> flag(rec[0]);
  if (flag.load(std::memory_order_acquire) == 0) return "";
  const int W = static_cast<int>(rec[1]);
  std::vector<Decoded> d;
  for (int r = 0; r < W; ++r) d.push_back(decode(rec + kRecordHeader + r * kWords));
  OpId kind = d.empty() ? OpId{} : d[0].kind;
  for (const Decoded& x : d) {
    if (!x.invalid && is_op_id(static_cast<uint32_t>(x.kind))) {
      kind = x.kind;
      break;
    }
  }
  if (take) flag.store(0, std::memory_order_relaxed);
  return recorded_reason(describe(d, kind));
}

}  // namespace

std::string compare_signatures(SymmetricWorkspace& ws, Stream& s, int channel,
                               SignatureState& state, const OpSignature& mine) {
  const Words words = encode(mine, state.count);
  const int W = ws.world_size(), me = ws.rank();
  const int parity = static_cast<int>(state.count % 2);
  ++state.count;
  const uint32_t* slots = ws.descriptor_slot(me, channel, parity, 0);
  Device& dev = ws.device();
  HostPaths* host = dev.host_paths();
  if (host == nullptr || !host->synchronous()) {
    if (state.device_record.host == nullptr) {
      state.device_record = dev.host_words(signature_record_words(W));
      // NOTE [A disagreement fails the device at once]. The words are never freed (NOTE [Pinned
      // pools]).
      dev.add_failure_probe(
          [rec = state.device_record.host] { return device_record_reason(rec, /*take=*/false); });
    }
    if (host == nullptr) {  // NOTE [Host fast paths]: a kernel compares the GPU's pads
      compare_signatures_on_device(dev, s, slots, W, words, state.device_record.device);
      return "";
    }
    // NOTE [Synchronous host devices]: CUDA's comparison, the kernel's logic as a host task in
    // stream order (ops/cuda/signature_kernel.cu), into a record of the same layout.
    dev.host_task(s, [rec = state.device_record.host, slots, W, words] {
      bool differs = false;
      for (int i = 0; i < kWords; ++i) {
        differs |= signature_word_differs(slots, W, words.data(), i, HostSignature{});
      }
      std::atomic_ref<uint32_t> flag(rec[0]);
      if (!differs || flag.load(std::memory_order_acquire) != 0) return;  // the first one stays
      for (int i = 0; i < kWords; ++i) {
        signature_record_word(slots, W, i, rec + kRecordHeader, HostSignature{});
      }
      rec[1] = static_cast<uint32_t>(W);
      flag.store(1, std::memory_order_release);
    });
    return "";
  }
  // The caller's inline stream: the barrier's waits have run (acquiring the peers' stores), and
  // so does this, now. A host caller on a stream of its own (host::set_current_stream) is
  // waited for: the host decides here whether the op goes on.
  if (host->runs_inline(s)) {
    std::string error;
    dev.host_task(s, [&] { error = disagreement(slots, W, words, mine); });
    return error;
  }
  auto error = std::make_shared<std::string>();
  dev.host_task(s,
                [error, slots, W, words, mine] { *error = disagreement(slots, W, words, mine); });
  dev.synchronize(s);
  return *error;
}

std::string handshake(SymmetricWorkspace& ws, Stream& s, int channel, SignatureState& state,
                      const OpSignature& mine) {
  publish_signature(ws, s, channel, state, mine);
  ws.barrier(s, channel);
  return compare_signatures(ws, s, channel, state, mine);
}

DescriptorWords encode_signature(const OpSignature& sig, uint64_t count) {
  return encode(sig, count);
}

std::string signature_disagreement(const uint32_t* all, int world_size, const DescriptorWords& mine,
                                   const OpSignature& sig) {
  return disagreement(all, world_size, mine, sig);
}

void check_recorded_signature(SignatureState& state, const char* what, Device* device) {
  // NOTE [Op signatures]: a disagreement found in stream order fails the group - unless it
  // failed before: then a released stream compared stale descriptors, and the first failure is
  // the one to name (the watchdog's probe of this record, NOTE [A disagreement fails the device
  // at once], may have been first: it failed the device with the same reason).
  if (state.device_record.host == nullptr) return;
  const std::string why = device_record_reason(state.device_record.host, /*take=*/true);
  if (why.empty()) return;
  const std::string msg = std::string("cuda_p2p ") + what + ": " + why;
  if (device != nullptr) {
    device->check_healthy(what);
    device->abort(msg);
  }
  throw SignatureMismatch(msg);
}

}  // namespace cuda_p2p::ops
