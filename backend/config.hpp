// The one place where cuda_p2p's configuration is read: every knob (an Options field, an
// environment variable, or both) is listed once in knobs(), parsed by one set of rules, and
// resolved once per group into a Config (resolve_config) that the lower layers receive as plain
// values. Nothing else in the project reads the environment.
//
// Rules (NOTE [Configuration rules]):
//  * precedence: an Options value that is set wins, else the environment variable, else the
//    default. An Options field that is a plain bool counts as set only when it differs from its
//    default (enable_workspace, workspace_collectives and hierarchical are kill switches: either
//    side turns them off);
//  * an empty environment variable is unset;
//  * booleans: 1/true/yes/on or 0/false/no/off, case-insensitive;
//  * numbers: a decimal integer, optionally with a binary suffix K, M or G (KiB, MiB, GiB:
//    1024-based), within the knob's range;
//  * names (algorithms, modes): one of the listed names, "auto" leaving the choice to the next
//    source;
//  * anything else is an error naming the knob, what it expects and what it got.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "ops/collectives.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p {

inline constexpr const char* kBackendName = "cuda_p2p";

// ProcessGroupCudaP2P.Options: what a user sets per group (pg_options). Every field is a knob of
// knobs() below; resolve_config turns them, with the environment, into a Config.
struct Options : c10d::Backend::Options {
  Options() : c10d::Backend::Options(kBackendName) {}

  // Where the workspace lives (NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp):
  // "cuda" (a GPU: NOTE [The workspace's GPU] in backend/config.cpp), "cpu" (host shared memory)
  // or "auto" (CUDA_P2P_WORKSPACE_DEVICE, else "cuda" when the group wraps a CUDA backend, "cpu"
  // otherwise).
  std::string workspace_device = "auto";
  // Bytes of the symmetric buffer each rank maps for its peers (unset: 32 MiB).
  std::optional<int64_t> buffer_size;
  // Whether to set up the P2P workspace at all (CUDA_P2P_DISABLE_WORKSPACE also turns it off).
  bool enable_workspace = true;
  // Whether the collectives run on the workspace when it is available
  // (CUDA_P2P_WORKSPACE_COLLECTIVES=0 also turns them off): off, they go to the wrapped backend
  // while the workspace stays up for everything else - for comparison and debugging.
  bool workspace_collectives = true;
  // Whether the collectives on CUDA tensors run on a CUDA workspace (NOTE [CUDA collectives are
  // opt-in] in backend/ProcessGroupCudaP2P.cpp): unset defers to
  // CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES, else off. CPU tensors and the fused ops are not affected.
  std::optional<bool> cuda_workspace_collectives;
  // Whether a group whose ranks span hosts runs its collectives hierarchically (intra-host on
  // each host's workspace, inter-host on the wrapped backend: backend/hierarchical.hpp);
  // CUDA_P2P_HIERARCHICAL=0 also turns it off. Off, such a group sends them whole to the wrapped
  // backend.
  bool hierarchical = true;
  // Handed to the wrapped NCCL backend (a ProcessGroupNCCL.Options in Python); may be null.
  c10::intrusive_ptr<c10d::Backend::Options> nccl_options;
  // The largest buffer (bytes) an op may grow the workspace to on its own; an op that needs more
  // processes its payload in rounds (ops/pipeline_common.hpp, plan_rounds).
  int64_t max_buffer_size = WorkspaceOptions::kDefaultMaxBufferSize;
  // How the host device runs the fused pipelines' two streams: "cooperative" (in the waiting
  // thread), "threads" (a thread per stream) or "auto" (CUDA_P2P_HOST_STREAMS, else
  // cooperative). NOTE [Cooperative host streams] in p2p_workspace/host/host_stream.cpp.
  std::string host_streams = "auto";
  // Workspace collectives (docs/collectives.md): "auto" leaves the choice to the environment
  // variable, then to the choice by size; a name forces that algorithm.
  std::string all_gather_algo = "auto";      // auto|direct|ring
  std::string reduce_scatter_algo = "auto";  // auto|direct|ring
  std::string all_reduce_algo = "auto";      // auto|one_shot|two_shot
  // Rounds of a large two-shot all-reduce on a host workspace (NOTE [Rounds chosen by rank 0] in
  // ops/all_reduce.cpp): "auto" (CUDA_P2P_ALL_REDUCE_ROUNDS, else rank 0 chooses by time),
  // "chunked" (chunk_bytes rounds) or "large" (rank 0 always chooses the largest rounds).
  std::string all_reduce_rounds = "auto";
  // Steps of the reduce-scatter ring, a multiple of the world size (unset: the world size).
  std::optional<int64_t> ring_steps;
  // Bytes a rank stages per round; 0: half the buffer.
  std::optional<int64_t> chunk_bytes;
  // Thresholds of the automatic choice, in bytes (unset: the measured defaults).
  std::optional<int64_t> all_reduce_one_shot_max_bytes;
  std::optional<int64_t> all_gather_ring_max_bytes;
  std::optional<int64_t> reduce_scatter_ring_max_bytes;
  // Copy-free reads of peers' tensors on the host (process_vm_readv; NOTE [Copy-free reads]):
  // unset defers to CUDA_P2P_CROSS_MEMORY, else off. On, they run only where the system allows
  // them (probed at rendezvous).
  std::optional<bool> cross_memory;
  // The smallest payload (bytes, as the thresholds above) read copy-free (unset: the default).
  std::optional<int64_t> cross_memory_min_bytes;
  // Host copies and reductions from this many bytes on use the rank's intra-op threads (unset:
  // CUDA_P2P_PARALLEL_MIN_BYTES, else the measured default; 0: never).
  std::optional<int64_t> parallel_min_bytes;
  // How the ranks agree that a collective's inputs are symmetric tensors (NOTE [Zero-copy
  // collectives] in ops/zero_copy.cpp): "exchange" (host workspaces only: every rank publishes its
  // inputs' heap offsets; anything else stages), "signature" (each rank states its offsets in the
  // op signature; ranks that differ raise a mismatch), "off" (they stage like any input) or
  // "auto" (CUDA_P2P_ZERO_COPY_AGREEMENT, else exchange on the host and signature on CUDA).
  std::string zero_copy_agreement = "auto";
  // Bytes of each rank's symmetric heap (cuda_p2p.empty; NOTE [Symmetric heap] in
  // p2p_workspace/symmetric_heap.cpp): unset defers to CUDA_P2P_SYMMETRIC_HEAP_SIZE, else 1 GiB.
  std::optional<int64_t> symmetric_heap_size;
  // Bytes of each slot of the send/recv mailboxes (NOTE [Mailboxes] in
  // p2p_workspace/host/mailboxes.cpp), a multiple of 4096: unset defers to
  // CUDA_P2P_MAILBOX_SLOT_BYTES, else 1 MiB.
  std::optional<int64_t> mailbox_slot_bytes;
  // The inline one-shot all-reduce on a host workspace (NOTE [Inline one-shot] in
  // ops/all_reduce.cpp): unset defers to CUDA_P2P_INLINE_ALL_REDUCE, else on.
  std::optional<bool> inline_all_reduce;
  // The fused ops' "auto" runs the fused pipeline only when the op's GEMM does at least this
  // many flops per rank (2·M·N·K, summed over the Bs); below, the unfused path: our workspace
  // all-gather then the matmul, or the matmul then our reduce-scatter (NOTE [Unfused below a
  // size] in backend/dispatcher_fused_ops.cpp). Unset: CUDA_P2P_FUSED_MIN_FLOPS, else the
  // measured default of the tensors' device (kDefaultHostFusedMinFlops on the host, 0 on CUDA).
  std::optional<int64_t> fused_min_flops;

  // Not marked override: older torch releases have no Options::clone().
  virtual c10::intrusive_ptr<c10d::Backend::Options> clone() const {
    return c10::make_intrusive<Options>(*this);
  }
};

// Where a group's workspace lives: Options.workspace_device resolved (kAuto: by the wrapped
// backends, NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp).
enum class WorkspaceDevice { kAuto, kCpu, kCuda };
// "auto", "cpu" or "cuda"; anything else is a ValueError naming `what`.
WorkspaceDevice parse_workspace_device(const std::string& value, const std::string& what);

namespace config {
// One configuration knob, for the docs table (docs/configuration.md is checked against it) and
// for error messages.
struct Knob {
  std::string option;  // the ProcessGroupCudaP2P.Options field ("" for environment only)
  std::string env;     // the environment variable ("" for Options only)
  std::string type;    // "bool", "bytes", "int", "string", or the names "a|b|c"
  std::string default_value;
  std::string help;
};

// Each knob's value for a group with `options`, and where it came from: "Options" (set there),
// "environment" (the variable), or "default" (the knob's default, as the table says). The value
// is the text of that source: what `python -m cuda_p2p` and CUDA_P2P_DEBUG=INFO report.
struct KnobValue {
  const Knob* knob;
  std::string value;
  std::string source;
};
}  // namespace config

// A group's configuration, resolved once (resolve_config) from its Options and the environment.
struct Config {
  bool workspace = true;             // set up the workspace
  std::string workspace_off_reason;  // why not ("" when it is set up)
  WorkspaceDevice workspace_device = WorkspaceDevice::kAuto;
  std::string workspace_device_from;     // the knob that chose it ("" for auto)
  std::string zero_copy_agreement_from;  // the knob that set collective.zero_copy_agreement
  WorkspaceOptions workspace_options;    // buffer size, timeout, host id, copy-free reads
  int64_t max_buffer_size = 0;
  HostStreams host_streams = HostStreams::kCooperative;
  bool collectives = true;        // the collectives run on the workspace
  bool cuda_collectives = false;  // ... also on a CUDA workspace
  bool hierarchical = true;       // ... and hierarchically on a group spanning hosts
  ops::CollectiveConfig collective;
  bool cross_memory = false;            // offer copy-free reads
  std::string cross_memory_off_reason;  // the knob that turned them off ("" when on)
  // Bytes of each rank's symmetric heap, created on the group's first cuda_p2p.empty or
  // use_symmetric_memory. Host: a sparse mapping, only the pages tensors touch cost memory.
  // CUDA: a cudaMalloc'd block, all of it committed at creation; the same 1 GiB default is
  // NVSHMEM's default symmetric heap per GPU (NVSHMEM_SYMMETRIC_SIZE), 1.25% of an 80 GiB GPU,
  // and a too-large size fails on every rank with an OutOfMemoryError naming this knob.
  int64_t symmetric_heap_size = kDefaultSymmetricHeapSize;
  static constexpr int64_t kDefaultSymmetricHeapSize = int64_t{1} << 30;
  // Options.mailbox_slot_bytes, else CUDA_P2P_MAILBOX_SLOT_BYTES, else 1 MiB: a message up to two
  // slots is sent eagerly, a larger one streams through them.
  int64_t mailbox_slot_bytes = kDefaultMailboxSlotBytes;
  static constexpr int64_t kDefaultMailboxSlotBytes = int64_t{1} << 20;
  // Options.fused_min_flops, else CUDA_P2P_FUSED_MIN_FLOPS; nullopt: fused_min_flops(device)
  // takes the device's default.
  std::optional<int64_t> fused_min_flops;
  // CUDA_P2P_DEBUG=INFO: one line on stderr per group at creation (python/cuda_p2p/_diagnose.py)
  // and one per fallback the first time it happens (NOTE [Debug lines] in backend/config.cpp).
  bool debug = false;
  // Every knob's value and source when the group was created (config::knob_values).
  std::vector<config::KnobValue> knobs;

  // The fused ops' threshold for tensors on `device` (docs/pipelines.md, measured results):
  // 8 GFLOP (8·2^30) on the host, where the pipelines at best tie the unfused path; 0 on CUDA
  // (never measured on a GPU: the fused path always runs).
  static constexpr int64_t kDefaultHostFusedMinFlops = int64_t{8} << 30;
  int64_t fused_min_flops_for(c10::DeviceType device) const {
    if (fused_min_flops) return *fused_min_flops;
    return device == c10::DeviceType::CPU ? kDefaultHostFusedMinFlops : 0;
  }
};

namespace config {

// Reads one environment variable (nullopt when unset or empty). process_environment() reads
// the process's; tests pass their own.
using EnvLookup = std::function<std::optional<std::string>(const std::string& name)>;
EnvLookup process_environment();

// The parsing rules above; `what` names the knob in the error.
bool parse_bool(const std::string& text, const std::string& what);
int64_t parse_int(const std::string& text, const std::string& what, int64_t min, int64_t max);

const std::vector<Knob>& knobs();

// Each knob's value for a group with `options`, and where it came from (KnobValue).
std::vector<KnobValue> knob_values(const Options& options,
                                   const EnvLookup& env = process_environment());

// Writes one line to stderr, whole (NOTE [Debug lines]).
void debug_line(const std::string& line);

// A knob's value from the environment, by the rules above (nullopt: unset).
std::optional<bool> env_bool(const EnvLookup& env, const std::string& name);
std::optional<int64_t> env_int(const EnvLookup& env, const std::string& name, int64_t min,
                               int64_t max);

}  // namespace config

// The GPU of a group's CUDA workspace (NOTE [The workspace's GPU] in backend/config.cpp): `index`
// and the rule that chose it, for messages.
struct CudaDeviceChoice {
  int index = 0;
  std::string from;
};
// `bound_device`: the index of the device bound by init_process_group(device_id=...) (nullopt:
// none); `device_count`: the GPUs this process sees; `current_device`: torch's current one.
// TORCH_CHECKs a bound device out of range and a LOCAL_RANK that is not a non-negative integer.
CudaDeviceChoice choose_cuda_device(std::optional<int64_t> bound_device, int device_count,
                                    int current_device,
                                    const config::EnvLookup& env = config::process_environment());

// Resolves `options` (its timeout included) and the environment into a group's Config for
// `world_size` ranks; TORCH_CHECKs every value against its knob's rules.
Config resolve_config(const Options& options, int world_size,
                      const config::EnvLookup& env = config::process_environment());

}  // namespace cuda_p2p
