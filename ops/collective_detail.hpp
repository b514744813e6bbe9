// Helpers shared by the collective algorithms (ops/*.cpp); not a public interface.
#pragma once

#include <c10/util/SmallVector.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>

#include "ops/collectives.hpp"

namespace cuda_p2p::ops::detail {

// Regions and rounds are multiples of a cache line, so that no two ranks' writes share one and
// vectorised loops start aligned.
inline constexpr int64_t kAlign = 64;

inline int64_t align_down(int64_t v, int64_t to) { return v / to * to; }
inline int64_t align_up(int64_t v, int64_t to) { return (v + to - 1) / to * to; }
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

inline char* bytes_of(const at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }
inline int64_t mod(int64_t a, int64_t m) { return ((a % m) + m) % m; }

// Bytes of one phase's region in every rank's buffer: half the buffer (NOTE [Collective phases]).
int64_t phase_bytes(const CollectiveContext& ctx);
// Bytes a rank stages per round: the phase's region, capped by config.chunk_bytes; a multiple of
// `unit` (an element, or an element times the number of slots), at least one unit.
int64_t round_bytes(const CollectiveContext& ctx, int64_t unit, int64_t slots = 1);

// One phase: every rank writes its region, publishes it (a barrier, or signals to the ranks that
// read it), then ranks read each other's regions (NOTE [Collective phases]).
struct Phase {
  c10::SmallVector<char*, 8> region;  // by rank: the start of this phase's region
  int64_t bytes = 0;
  uint64_t index = 0;
  // Begun under capture: guarded by the graph done words (NOTE [Replay-safe signals]).
  bool graph = false;
};
// NOTE [Replay-safe signals] (p2p_workspace/symmetric_workspace.cpp): a collective enqueued
// under capture that keeps the copy engine begins and ends with a barrier of its channel, so
// that no peer still reads this rank's buffer from an earlier op when it begins, nor from this
// one when the next op (eager, another graph, the next replay) begins. The opening one is the
// op's open (NOTE [Graph flags]), enqueued by expect_signature, where the op's tag is known; the
// bracket closes what was opened when it goes (nothing after an op run as one kernel). Nothing
// outside a capture; the closing barrier is not enqueued when the op raises.
class CaptureBracket {
 public:
  explicit CaptureBracket(const CollectiveContext& ctx);
  ~CaptureBracket();
  CaptureBracket(const CaptureBracket&) = delete;
  CaptureBracket& operator=(const CaptureBracket&) = delete;

 private:
  const CollectiveContext& ctx_;
  bool active_;
  int exceptions_;
};
// Whether the op may read peers' private memory: the workspace offers it, and the stream is not
// being captured (NOTE [Replay-safe signals]).
bool cross_memory_reads(const CollectiveContext& ctx);
// For an op that reads no tensor zero-copy: drops any zero-copy claim an earlier op left
// (NOTE [Zero-copy collectives]).
void staged_only(const CollectiveContext& ctx);
// The tensors of a rooted op (gather: `mine` is the input and `at_root` the outputs, named
// "input" and "output"; scatter the other way round): the root in [0, W), `mine` contiguous, and
// on the root W contiguous tensors of `mine`'s bytes. Returns those bytes.
int64_t check_rooted(const CollectiveContext& ctx, const char* op, int root, const at::Tensor& mine,
                     const char* mine_name, const std::vector<at::Tensor>& at_root,
                     const char* root_name);
// Advances the phase counter and returns the regions of the new phase, once every peer has
// finished reading this rank's region of the same half (phase index-2): the reuse guard.
Phase begin_phase(const CollectiveContext& ctx);
// Tells the peers that this rank has finished reading the phase's regions.
void end_phase(const CollectiveContext& ctx, const Phase& ph);

// Waits until every rank in `ranks` has ended phase `ph` (its done word reached ph.index + 1);
// `why` names the wait in the timeout error.
void wait_phase_ended(const CollectiveContext& ctx, const Phase& ph, c10::ArrayRef<int> ranks,
                      const char* why);

// A barrier on the collective channel: publishes every rank's writes to every rank. The first
// one of a collective also carries its signature (NOTE [Op signatures]): on a disagreement every
// rank ends the open phase and raises SignatureMismatch.
void phase_barrier(const CollectiveContext& ctx);

// Sets the signature the collective compares across ranks, at its first phase barrier or at
// handshake(); nothing with a single rank. Under capture it opens the op instead (its
// CaptureBracket closes it): the flags carry the signature's hash (NOTE [Graph flags]).
void expect_signature(const CollectiveContext& ctx, OpSignature sig);
// Compares the expected signature now, with a barrier of its own, unless it has been compared
// already: the first step of every algorithm whose first communication is not a phase barrier
// (rings, broadcast) and of collectives that move nothing (zero-size). On a disagreement every
// rank runs one empty phase, so that the phase counts stay equal, and raises.
void handshake(const CollectiveContext& ctx);
// The suffix of a signature naming the settings that change the rounds (when not the default).
std::string config_suffix(const CollectiveContext& ctx);
void signal(const CollectiveContext& ctx, int peer);
void wait(const CollectiveContext& ctx, int peer);

// Cross-memory reads (NOTE [Cross-memory reads]). publish_addresses writes this rank's input
// addresses into the header of its region of `ph`; read_input_cross_memory copies n bytes at offset
// `offset` of the input whose address `peer` published at index `index` of its header; wait_readers
// waits until every rank in `readers` has ended phase `ph`.
void publish_addresses(const CollectiveContext& ctx, const Phase& ph,
                       c10::ArrayRef<const void*> ptrs);
void read_input_cross_memory(const CollectiveContext& ctx, void* dst, const Phase& ph, int peer,
                             int index, int64_t offset, int64_t n);
void wait_readers(const CollectiveContext& ctx, const Phase& ph, c10::ArrayRef<int> readers);

// Copies n bytes on the collective's stream; nothing for n == 0 or dst == src.
void copy(const CollectiveContext& ctx, void* dst, const void* src, int64_t n);

// A tensor over `numel` elements at `ptr` on the workspace's device (no ownership).
at::Tensor view(const CollectiveContext& ctx, void* ptr, int64_t numel, at::ScalarType dtype);

// The direct all-gather of a different number of bytes per rank (all_gather_v.cpp): rank q's
// bytes[q] bytes land at out[q]; input holds this rank's.
void gather_direct(const CollectiveContext& ctx, const char* input, c10::ArrayRef<int64_t> bytes,
                   c10::ArrayRef<char*> out);

// Signature agreement on zero-copy (NOTE [Zero-copy collectives] in ops/zero_copy.cpp, step 1'):
// called at the op's entry, before its signature is set. Each drops any earlier claim, then, when
// the group agrees by signature and every input of this rank is in its heap, records this rank's
// prediction of every rank's input offsets and returns the text to append to the op's signature;
// else "". all_gather: the input and the outputs (by rank); reduce_scatter: the W input chunks of
// `bytes` each; all_reduce: only for the two-shot; broadcast: this rank's tensor.
std::string claim_all_gather(const CollectiveContext& ctx, const char* input, int64_t bytes,
                             c10::ArrayRef<char*> out);
std::string claim_reduce_scatter(const CollectiveContext& ctx, c10::ArrayRef<char*> in,
                                 int64_t bytes);
std::string claim_all_reduce(const CollectiveContext& ctx, const char* in, int64_t numel,
                             int64_t esize);
std::string claim_broadcast(const CollectiveContext& ctx, const char* data, int64_t bytes);

// Zero-copy collectives (NOTE [Zero-copy collectives] in ops/zero_copy.cpp): each returns false,
// having run nothing or one empty phase (the same on every rank), when the ranks' inputs are not
// all in their heaps (exchange) or this rank made no claim (signature); the caller then runs its
// staged algorithm. True when they ran.
// all_gather_zero_copy gathers bytes[q] from rank q (all equal for all_gather, any for
// all_gather_v; a rank with 0 bytes may pass any input).
bool all_gather_zero_copy(const CollectiveContext& ctx, const char* input,
                          c10::ArrayRef<int64_t> bytes, c10::ArrayRef<char*> out);
bool reduce_scatter_zero_copy(const CollectiveContext& ctx, c10::ArrayRef<char*> in, char* out,
                              int64_t numel, at::ScalarType dtype, ReduceOp op);
bool all_reduce_zero_copy(const CollectiveContext& ctx, char* in, char* out, int64_t numel,
                          at::ScalarType dtype, ReduceOp op);
// Decided by the root's tensor alone, for a tensor of one staged round at most; after a false
// every rank runs the staged broadcast.
bool broadcast_zero_copy(const CollectiveContext& ctx, char* data, int64_t bytes, int root);

// For ops that decide per sender whether peers read its input zero-copy (the all-to-all: NOTE
// [All-to-all zero-copy] in ops/all_to_all.cpp): the heap offset of [p, p + n) when the group's
// heap may be read zero-copy now (a heap, zero-copy not off, not under capture), else -1; and the
// address of byte `offset` of rank q's heap.
int64_t readable_heap_offset(const CollectiveContext& ctx, const void* p, int64_t n);
const char* peer_heap(const CollectiveContext& ctx, int q, int64_t offset);

// Under capture, runs the op as one kernel (NOTE [Captured collectives in one kernel] in
// ops/captured_collectives.cpp) and returns true; false, having enqueued nothing, where it does
// not fit (not captured, too many ranks, more than the graph region holds): the copy-engine path
// then runs. `sig` is the op's signature, whose hash tags its flags (NOTE [Graph flags]).
bool all_reduce_kernel(const CollectiveContext& ctx, const char* in, char* out, int64_t numel,
                       at::ScalarType dtype, ReduceOp op, AllReduceAlgo algo,
                       const OpSignature& sig);
bool all_gather_kernel(const CollectiveContext& ctx, const char* in, int64_t bytes,
                       c10::ArrayRef<char*> out, const OpSignature& sig);
bool reduce_scatter_kernel(const CollectiveContext& ctx, c10::ArrayRef<char*> in, char* out,
                           int64_t numel, at::ScalarType dtype, ReduceOp op,
                           const OpSignature& sig);

// Runs ops::reduce on the collective's stream.
void reduce_on_stream(const CollectiveContext& ctx, at::Tensor dst, std::vector<at::Tensor> srcs,
                      ReduceOp op, int64_t divisor, at::Tensor also = {});

}  // namespace cuda_p2p::ops::detail
