#include "backend/config.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <utility>

namespace cuda_p2p {

// NOTE [Configuration rules]
// Every knob is read here and nowhere else, by the rules in config.hpp, so that a typo is an
// error naming the knob rather than a silently different algorithm, and so that the docs table
// (docs/configuration.md, checked against knobs() by tests/python/test_config.py) is complete.
// The lower layers (ops, p2p_workspace) receive the resolved values as plain fields
// (CollectiveConfig, WorkspaceOptions, HostStreams): they never read the environment.

namespace config {

namespace {

constexpr const char* kDisableWorkspaceEnv = "CUDA_P2P_DISABLE_WORKSPACE";
constexpr const char* kWorkspaceCollectivesEnv = "CUDA_P2P_WORKSPACE_COLLECTIVES";
constexpr const char* kCudaWorkspaceCollectivesEnv = "CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES";
constexpr const char* kHierarchicalEnv = "CUDA_P2P_HIERARCHICAL";
constexpr const char* kCrossMemoryEnv = "CUDA_P2P_CROSS_MEMORY";
constexpr const char* kHostStreamsEnv = "CUDA_P2P_HOST_STREAMS";
constexpr const char* kAllGatherAlgoEnv = "CUDA_P2P_ALL_GATHER_ALGO";
constexpr const char* kReduceScatterAlgoEnv = "CUDA_P2P_REDUCE_SCATTER_ALGO";
constexpr const char* kAllReduceAlgoEnv = "CUDA_P2P_ALL_REDUCE_ALGO";
constexpr const char* kAllReduceRoundsEnv = "CUDA_P2P_ALL_REDUCE_ROUNDS";
constexpr const char* kRingStepsEnv = "CUDA_P2P_RING_STEPS";
constexpr const char* kChunkBytesEnv = "CUDA_P2P_CHUNK_BYTES";
constexpr const char* kParallelMinBytesEnv = "CUDA_P2P_PARALLEL_MIN_BYTES";
constexpr const char* kInlineAllReduceEnv = "CUDA_P2P_INLINE_ALL_REDUCE";
constexpr const char* kHostIdEnv = "CUDA_P2P_HOST_ID";
constexpr const char* kDenyCrossMemoryEnv = "CUDA_P2P_TEST_DENY_CROSS_MEMORY";
constexpr const char* kSymmetricHeapSizeEnv = "CUDA_P2P_SYMMETRIC_HEAP_SIZE";
constexpr const char* kMailboxSlotBytesEnv = "CUDA_P2P_MAILBOX_SLOT_BYTES";
constexpr int64_t kMaxMailboxSlotBytes = int64_t{256} << 20;
constexpr const char* kFusedMinFlopsEnv = "CUDA_P2P_FUSED_MIN_FLOPS";
constexpr const char* kWorkspaceDeviceEnv = "CUDA_P2P_WORKSPACE_DEVICE";
constexpr const char* kZeroCopyAgreementEnv = "CUDA_P2P_ZERO_COPY_AGREEMENT";
constexpr const char* kLocalRankEnv = "LOCAL_RANK";  // set by torchrun and most launchers
constexpr const char* kDebugEnv = "CUDA_P2P_DEBUG";

constexpr int64_t kMaxBytes = int64_t{1} << 46;  // 64 TiB: a sanity bound, not a policy
constexpr int64_t kMaxRingSteps = int64_t{1} << 20;
constexpr int64_t kMaxFlops = int64_t{1} << 60;

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

}  // namespace

EnvLookup process_environment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr || *v == '\0') return std::nullopt;
    return std::string(v);
  };
}

bool parse_bool(const std::string& text, const std::string& what) {
  const std::string v = lower(text);
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  TORCH_CHECK(false, "cuda_p2p: ", what,
              " must be a boolean (1/0, true/false, yes/no, on/off), got '", text, "'");
}

int64_t parse_int(const std::string& text, const std::string& what, int64_t min, int64_t max) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(begin, &end, 10);
  bool ok = errno == 0 && end != begin;
  int64_t scale = 1;
  if (ok) {
    const std::string suffix = lower(end);
    if (suffix == "k" || suffix == "kib") {
      scale = int64_t{1} << 10;
    } else if (suffix == "m" || suffix == "mib") {
      scale = int64_t{1} << 20;
    } else if (suffix == "g" || suffix == "gib") {
      scale = int64_t{1} << 30;
    } else {
      ok = suffix.empty();
    }
  }
  ok = ok && (v == 0 || (v > 0 ? v <= std::numeric_limits<int64_t>::max() / scale
                               : v >= std::numeric_limits<int64_t>::min() / scale));
  TORCH_CHECK(ok, "cuda_p2p: ", what,
              " must be an integer, optionally with a suffix K, M or G (1024-based), got '", text,
              "'");
  const int64_t value = static_cast<int64_t>(v) * scale;
  TORCH_CHECK(value >= min && value <= max, "cuda_p2p: ", what, " must be in [", min, ", ", max,
              "], got ", value, " ('", text, "')");
  return value;
}

std::optional<bool> env_bool(const EnvLookup& env, const std::string& name) {
  auto v = env(name);
  if (!v) return std::nullopt;
  return parse_bool(*v, name);
}

std::optional<int64_t> env_int(const EnvLookup& env, const std::string& name, int64_t min,
                               int64_t max) {
  auto v = env(name);
  if (!v) return std::nullopt;
  return parse_int(*v, name, min, max);
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> kKnobs = {
      {"enable_workspace", kDisableWorkspaceEnv, "bool", "True (variable: unset)",
       "Set up the P2P workspace. The variable is inverted: CUDA_P2P_DISABLE_WORKSPACE=1 turns "
       "the workspace off; either side turns it off."},
      {"workspace_device", kWorkspaceDeviceEnv, "auto|cpu|cuda",
       "cuda with a visible GPU, else cpu",
       "Where the workspace lives: cuda (a GPU, chosen as LOCAL_RANK says; the group must wrap "
       "NCCL) or cpu (host shared memory). One workspace per group: CPU tensors on a CUDA "
       "workspace, and CUDA tensors on a CPU one, go to the wrapped backend (Gloo, NCCL)."},
      {"buffer_size", "", "bytes", "32 MiB",
       "Bytes of the symmetric buffer each rank shares with its peers."},
      {"max_buffer_size", "", "bytes", "256 MiB",
       "The largest buffer an op may grow the workspace to on its own; larger payloads are "
       "processed in rounds."},
      {"workspace_collectives", kWorkspaceCollectivesEnv, "bool", "True",
       "Run the collectives on the workspace; off, they go to the wrapped backend while the "
       "workspace stays up for the fused ops (either side turns them off)."},
      {"cuda_workspace_collectives", kCudaWorkspaceCollectivesEnv, "bool", "False",
       "Run the collectives on CUDA tensors on the CUDA workspace; off, they go to NCCL. CPU "
       "tensors and the fused ops are not affected."},
      {"hierarchical", kHierarchicalEnv, "bool", "True",
       "On a group whose ranks span hosts, run the collectives on CPU tensors hierarchically: "
       "intra-host on each host's workspace, inter-host on the wrapped backend (either side "
       "turns it off)."},
      {"host_streams", kHostStreamsEnv, "auto|cooperative|threads", "cooperative",
       "How a host workspace runs the fused pipelines' two streams."},
      {"all_gather_algo", kAllGatherAlgoEnv, "auto|direct|ring", "auto",
       "Workspace all-gather algorithm (auto: by size)."},
      {"reduce_scatter_algo", kReduceScatterAlgoEnv, "auto|direct|ring", "auto",
       "Workspace reduce-scatter algorithm (auto: by size)."},
      {"all_reduce_algo", kAllReduceAlgoEnv, "auto|one_shot|two_shot", "auto",
       "Workspace all-reduce algorithm (auto: by size)."},
      {"ring_steps", kRingStepsEnv, "int", "the world size",
       "Steps of the reduce-scatter ring, a positive multiple of the world size (0: the world "
       "size)."},
      {"chunk_bytes", kChunkBytesEnv, "bytes", "1 MiB",
       "Bytes a rank stages per round of a workspace collective (0: half the buffer)."},
      {"all_reduce_rounds", kAllReduceRoundsEnv, "auto|chunked|large", "auto",
       "Rounds of a two-shot all-reduce of more than one chunk_bytes round on a host workspace: "
       "auto lets rank 0 choose, one op ahead, from the times of its recent ops, between "
       "chunk_bytes rounds and the largest the buffer holds; large makes it choose the latter "
       "(from the second op of each size class); chunked keeps chunk_bytes. Equal on every rank "
       "(auto and large may mix)."},
      {"all_reduce_one_shot_max_bytes", "", "bytes", "64 KiB on 2 ranks, else 8 KiB",
       "Largest all-reduce that auto runs one-shot."},
      {"inline_all_reduce", kInlineAllReduceEnv, "bool", "True",
       "On a host workspace, run a one-shot all-reduce that fits one round on the calling thread "
       "without enqueueing (the same protocol; off: the generic path, for comparison)."},
      {"all_gather_ring_max_bytes", "", "bytes", "256 KiB",
       "Largest all-gather output that auto runs as a ring on 3+ ranks."},
      {"reduce_scatter_ring_max_bytes", "", "bytes", "256 KiB",
       "Largest reduce-scatter input that auto runs as a ring."},
      {"cross_memory", kCrossMemoryEnv, "bool", "False",
       "Copy-free reads of peers' tensors on the host (process_vm_readv), where the system allows "
       "them."},
      {"cross_memory_min_bytes", "", "bytes", "64 KiB",
       "Smallest payload read copy-free when copy-free reads are on."},
      {"parallel_min_bytes", kParallelMinBytesEnv, "bytes", "1 MiB",
       "On the host, copies and reductions of a workspace collective of at least this many bytes "
       "are split across the rank's intra-op threads (torch.get_num_threads()) when it has two "
       "or more; 0: never. One thread per rank (the default) never splits."},
      {"symmetric_heap_size", kSymmetricHeapSizeEnv, "bytes", "1 GiB",
       "Bytes of each rank's symmetric heap (cuda_p2p.empty, use_symmetric_memory), created on "
       "first use; host: a sparse mapping (touched pages cost memory); CUDA: committed device "
       "memory, all of it at creation. It does not grow."},
      {"mailbox_slot_bytes", kMailboxSlotBytesEnv, "bytes", "1 MiB",
       "Bytes of each slot of the send/recv mailboxes on a host workspace (two per pair of "
       "ranks, in the sender's memory): a message up to two slots is sent eagerly, a larger one "
       "streams through them. A multiple of 4096, at most 256 MiB."},
      {"zero_copy_agreement", kZeroCopyAgreementEnv, "auto|exchange|signature|off",
       "host: exchange; CUDA: off (signature is opt-in until validated on GPUs)",
       "How the ranks agree that a collective's inputs are symmetric tensors. exchange (host "
       "only): each rank publishes its inputs' heap offsets, which may differ; if any input is "
       "not in its heap, all stage (one barrier more for a group with a heap). signature: each "
       "rank states its offsets in the op signature, assuming its peers allocated alike; a group "
       "with a heap pays nothing for ordinary inputs, and ranks whose tensors differ raise a "
       "signature mismatch. off: symmetric inputs stage like any other."},
      {"fused_min_flops", kFusedMinFlopsEnv, "int", "host: 8G; CUDA: 0",
       "The fused ops' \"auto\" runs the fused pipeline from this many GEMM flops per rank "
       "(2*M*N*K) on; below, the unfused workspace collective and matmul (K, M, G: 1024-based)."},
      {"", kDebugEnv, "off|info", "off",
       "INFO: one line on stderr per group at its creation (the workspace, its device, the "
       "collectives' path, each knob that is not at its default) and one per fallback to the "
       "wrapped backend the first time it happens on the group (python -m cuda_p2p reports the "
       "same facts)."},
      {"", kHostIdEnv, "string", "hostname/boot id",
       "This process's host identity; ranks with different identities do not share a workspace "
       "(tests simulate several hosts with it)."},
      {"", kDenyCrossMemoryEnv, "bool", "False",
       "Test hook: this process's copy-free reads fail as under Yama ptrace_scope (EPERM)."},
      {"", kLocalRankEnv, "int", "unset",
       "This process's rank on its host (torchrun sets it). A CUDA workspace goes on the device "
       "bound by init_process_group(device_id=...), else on the current GPU if "
       "torch.cuda.set_device chose one other than cuda:0, else on GPU LOCAL_RANK mod the visible "
       "GPUs, else on cuda:0."},
  };
  return kKnobs;
}

namespace {

std::string bool_text(bool b) { return b ? "True" : "False"; }

// The text of the Options field `field` when it is set (NOTE [Configuration rules]: an optional
// that holds a value, a name other than "auto", a plain bool or number that differs from its
// default), else nullopt.
std::optional<std::string> option_text(const Options& o, const std::string& field) {
  const Options d;
  auto opt_int = [](const std::optional<int64_t>& v) -> std::optional<std::string> {
    if (!v) return std::nullopt;
    return std::to_string(*v);
  };
  auto opt_bool = [](const std::optional<bool>& v) -> std::optional<std::string> {
    if (!v) return std::nullopt;
    return bool_text(*v);
  };
  auto name = [](const std::string& v) -> std::optional<std::string> {
    if (v == "auto") return std::nullopt;
    return v;
  };
  auto plain_bool = [](bool v, bool def) -> std::optional<std::string> {
    if (v == def) return std::nullopt;
    return bool_text(v);
  };
  if (field == "enable_workspace") return plain_bool(o.enable_workspace, d.enable_workspace);
  if (field == "workspace_device") return name(o.workspace_device);
  if (field == "buffer_size") return opt_int(o.buffer_size);
  if (field == "max_buffer_size") {
    if (o.max_buffer_size == d.max_buffer_size) return std::nullopt;
    return std::to_string(o.max_buffer_size);
  }
  if (field == "workspace_collectives") {
    return plain_bool(o.workspace_collectives, d.workspace_collectives);
  }
  if (field == "cuda_workspace_collectives") return opt_bool(o.cuda_workspace_collectives);
  if (field == "hierarchical") return plain_bool(o.hierarchical, d.hierarchical);
  if (field == "host_streams") return name(o.host_streams);
  if (field == "all_gather_algo") return name(o.all_gather_algo);
  if (field == "reduce_scatter_algo") return name(o.reduce_scatter_algo);
  if (field == "all_reduce_algo") return name(o.all_reduce_algo);
  if (field == "all_reduce_rounds") return name(o.all_reduce_rounds);
  if (field == "ring_steps") return opt_int(o.ring_steps);
  if (field == "chunk_bytes") return opt_int(o.chunk_bytes);
  if (field == "all_reduce_one_shot_max_bytes") return opt_int(o.all_reduce_one_shot_max_bytes);
  if (field == "inline_all_reduce") return opt_bool(o.inline_all_reduce);
  if (field == "all_gather_ring_max_bytes") return opt_int(o.all_gather_ring_max_bytes);
  if (field == "reduce_scatter_ring_max_bytes") return opt_int(o.reduce_scatter_ring_max_bytes);
  if (field == "cross_memory") return opt_bool(o.cross_memory);
  if (field == "cross_memory_min_bytes") return opt_int(o.cross_memory_min_bytes);
  if (field == "symmetric_heap_size") return opt_int(o.symmetric_heap_size);
  if (field == "mailbox_slot_bytes") return opt_int(o.mailbox_slot_bytes);
  if (field == "zero_copy_agreement") return name(o.zero_copy_agreement);
  if (field == "fused_min_flops") return opt_int(o.fused_min_flops);
  if (field == "parallel_min_bytes") return opt_int(o.parallel_min_bytes);
  TORCH_INTERNAL_ASSERT(false, "cuda_p2p: knob_values: no Options field ", field);
}

}  // namespace

std::vector<KnobValue> knob_values(const Options& o, const EnvLookup& env) {
  std::vector<KnobValue> out;
  for (const auto& k : knobs()) {
    KnobValue v{&k, k.default_value, "default"};
    if (!k.option.empty()) {
      if (auto text = option_text(o, k.option)) {
        out.push_back({&k, *text, "Options"});
        continue;
      }
    }
    if (!k.env.empty()) {
      // A name knob's "auto" leaves the choice to the default, as resolve_config reads it.
      if (auto text = env(k.env);
          text && !(k.type.find('|') != std::string::npos && lower(*text) == "auto")) {
        v = {&k, *text, "environment"};
      }
    }
    out.push_back(std::move(v));
  }
  return out;
}

// NOTE [Debug lines]
// CUDA_P2P_DEBUG=INFO is this backend's NCCL_DEBUG=INFO: a user sees which path a job is on
// without reading counters. A line is written with one fwrite of the whole line (stderr is
// unbuffered), so the lines of the ranks of a job sharing a terminal interleave by lines, not
// by characters. The group's line is written by the Python layer when it has created the group
// (python/cuda_p2p/_backend.py: it knows the hierarchy, attached after construction); the
// fallback lines by the group's Counters (backend/counters.cpp), once per counter and group.
void debug_line(const std::string& line) {
  std::string whole = line;
  if (whole.empty() || whole.back() != '\n') whole.push_back('\n');
  std::fwrite(whole.data(), 1, whole.size(), stderr);
  std::fflush(stderr);
}

}  // namespace config

WorkspaceDevice parse_workspace_device(const std::string& value, const std::string& what) {
  if (value == "auto") return WorkspaceDevice::kAuto;
  if (value == "cpu") return WorkspaceDevice::kCpu;
  if (value == "cuda") return WorkspaceDevice::kCuda;
  TORCH_CHECK_VALUE(false, "cuda_p2p: ", what, " must be 'auto', 'cpu' or 'cuda', got '", value,
                    "'");
}

// NOTE [The workspace's GPU]
// init_process_group before torch.cuda.set_device is common, and torch's current device is then
// cuda:0 in every rank: a workspace put on the current device would put every rank's context,
// block and heap on one GPU, and the fused ops would fall back to the wrapped backend whenever
// the tensors live elsewhere. So a CUDA workspace goes, in this order, on
//  1. the device bound by init_process_group(device_id=...) (every group of the process inherits
//     it: torch passes it to new_group), the user's explicit choice;
//  2. the current device when it is not cuda:0: only torch.cuda.set_device makes it so, the
//     user's explicit choice, which a launcher's variable must not override;
//  3. GPU LOCAL_RANK mod the visible GPUs (torchrun's convention, the one NCCL users follow with
//     torch.cuda.set_device(local_rank); "mod" keeps one-GPU-per-process launches, where every
//     process sees only its own GPU, on that GPU);
//  4. the current device, cuda:0 (no launcher told us anything).
// The one choice rule 2 cannot see is set_device(0) on a rank whose LOCAL_RANK is not 0: a job
// that maps ranks to GPUs that way passes device_id= (rule 1).
// A LOCAL_RANK that is not a non-negative integer and a bound device out of range are errors,
// not a silent fall-through to the next rule. When every rank of a group still lands on one GPU
// while the host has a GPU per rank, python/cuda_p2p/_backend.py warns, naming the fix.
CudaDeviceChoice choose_cuda_device(std::optional<int64_t> bound_device, int device_count,
                                    int current_device, const config::EnvLookup& env) {
  TORCH_CHECK(device_count >= 1, "cuda_p2p: a CUDA workspace needs a visible GPU, got ",
              device_count, " visible");
  if (bound_device) {
    TORCH_CHECK_VALUE(*bound_device >= 0 && *bound_device < device_count,
                      "cuda_p2p: the device bound by init_process_group(device_id=...) is cuda:",
                      *bound_device, ", but this process sees ", device_count, " GPU",
                      device_count == 1 ? "" : "s", " (cuda:0 to cuda:", device_count - 1, ")");
    return {static_cast<int>(*bound_device), "init_process_group(device_id=...)"};
  }
  TORCH_CHECK(current_device >= 0 && current_device < device_count,
              "cuda_p2p: the current CUDA device is ", current_device, ", but this process sees ",
              device_count, " GPUs");
  if (current_device != 0) {
    return {current_device, "the current device (torch.cuda.set_device)"};
  }
  if (auto text = env(config::kLocalRankEnv)) {
    const std::string& t = *text;
    // Digits only (no sign, space or suffix: parse_int's "1K" is no local rank), at most 9.
    const bool digits = !t.empty() && t.size() <= 9 && std::all_of(t.begin(), t.end(), [](char c) {
      return std::isdigit(static_cast<unsigned char>(c)) != 0;
    });
    TORCH_CHECK_VALUE(digits, "cuda_p2p: ", config::kLocalRankEnv,
                      " must be a non-negative integer (this process's rank on its host, as "
                      "torchrun sets it), got '",
                      t.substr(0, 64), "'");
    const int local_rank = std::stoi(t);
    return {local_rank % device_count,
            c10::str(config::kLocalRankEnv, "=", local_rank, " (mod ", device_count, " visible GPU",
                     device_count == 1 ? "" : "s", ")")};
  }
  return {current_device, "the current device (torch.cuda.current_device())"};
}

namespace {

// The value of an optional Options field, else of the environment variable, else `fallback`.
template <typename T>
T pick(const std::optional<T>& option, const std::optional<T>& env, T fallback) {
  if (option) return *option;
  if (env) return *env;
  return fallback;
}

// The Options value unless it is "auto", else the environment variable's unless that is "auto":
// {value, the knob it came from}, or nullopt when both leave the choice to the default.
std::optional<std::pair<std::string, std::string>> chosen(const std::string& option,
                                                          const std::string& field,
                                                          const config::EnvLookup& env,
                                                          const std::string& var) {
  if (option != "auto") return std::make_pair(option, c10::str("Options.", field));
  if (auto v = env(var); v && *v != "auto") return std::make_pair(*v, var);
  return std::nullopt;
}

}  // namespace

Config resolve_config(const Options& o, int world_size, const config::EnvLookup& env) {
  using namespace config;
  Config c;
  // Workspace.
  TORCH_CHECK(!o.buffer_size || *o.buffer_size > 0,
              "cuda_p2p: Options.buffer_size must be positive (bytes), got ", *o.buffer_size);
  TORCH_CHECK(o.max_buffer_size > 0,
              "cuda_p2p: Options.max_buffer_size must be positive (bytes), got ",
              o.max_buffer_size);
  const bool env_disables = env_bool(env, kDisableWorkspaceEnv).value_or(false);
  if (!o.enable_workspace) {
    c.workspace = false;
    c.workspace_off_reason = "disabled by Options.enable_workspace = False";
  } else if (env_disables) {
    c.workspace = false;
    // (c10::str rather than std::string operator+: GCC 12 reports a false -Warray-bounds there.)
    c.workspace_off_reason = c10::str("disabled by ", kDisableWorkspaceEnv, "=",
                                      env(kDisableWorkspaceEnv).value_or("1"));
  }
  if (auto v = chosen(o.workspace_device, "workspace_device", env, kWorkspaceDeviceEnv)) {
    c.workspace_device = parse_workspace_device(v->first, v->second);
    c.workspace_device_from = v->second;
  }
  c.workspace_options.buffer_size = o.buffer_size.value_or(WorkspaceOptions::kDefaultBufferSize);
  c.workspace_options.timeout = o.timeout;
  c.max_buffer_size = o.max_buffer_size;
  if (auto id = env(kHostIdEnv)) c.workspace_options.host_id = *id;
  c.workspace_options.deny_private_reads = env_bool(env, kDenyCrossMemoryEnv).value_or(false);

  // Host streams.
  if (auto v = chosen(o.host_streams, "host_streams", env, kHostStreamsEnv)) {
    c.host_streams = parse_host_streams(v->first, v->second);
  }
  if (c.host_streams == HostStreams::kDefault) c.host_streams = HostStreams::kCooperative;

  // Which collectives run on the workspace (kill switches: either side turns them off).
  c.collectives = o.workspace_collectives && env_bool(env, kWorkspaceCollectivesEnv).value_or(true);
  c.hierarchical = o.hierarchical && env_bool(env, kHierarchicalEnv).value_or(true);
  c.cuda_collectives =
      pick(o.cuda_workspace_collectives, env_bool(env, kCudaWorkspaceCollectivesEnv), false);

  // Algorithms and their knobs.
  auto& k = c.collective;
  if (auto a = chosen(o.all_gather_algo, "all_gather_algo", env, kAllGatherAlgoEnv)) {
    k.all_gather = ops::parse_all_gather_algo(a->first, a->second);
  }
  if (auto a = chosen(o.reduce_scatter_algo, "reduce_scatter_algo", env, kReduceScatterAlgoEnv)) {
    k.reduce_scatter = ops::parse_reduce_scatter_algo(a->first, a->second);
  }
  if (auto a = chosen(o.all_reduce_algo, "all_reduce_algo", env, kAllReduceAlgoEnv)) {
    k.all_reduce = ops::parse_all_reduce_algo(a->first, a->second);
  }
  if (auto a = chosen(o.all_reduce_rounds, "all_reduce_rounds", env, kAllReduceRoundsEnv)) {
    k.all_reduce_rounds = ops::parse_all_reduce_rounds(a->first, a->second);
  }
  TORCH_CHECK(!o.ring_steps || (*o.ring_steps >= 0 && *o.ring_steps <= kMaxRingSteps),
              "cuda_p2p: Options.ring_steps must be a positive multiple of the world size, got ",
              *o.ring_steps);
  k.ring_steps = static_cast<int>(
      pick(o.ring_steps, env_int(env, kRingStepsEnv, 0, kMaxRingSteps), int64_t{0}));
  TORCH_CHECK(!o.chunk_bytes || *o.chunk_bytes >= 0,
              "cuda_p2p: Options.chunk_bytes must be >= 0 (0: half the buffer), got ",
              *o.chunk_bytes);
  k.chunk_bytes = pick(o.chunk_bytes, env_int(env, kChunkBytesEnv, 0, kMaxBytes),
                       ops::CollectiveConfig::kDefaultChunkBytes);
  k.all_reduce_one_shot_max_bytes = o.all_reduce_one_shot_max_bytes.value_or(
      world_size == 2 ? ops::CollectiveConfig::kDefaultTwoRankAllReduceOneShotMaxBytes
                      : ops::CollectiveConfig::kDefaultAllReduceOneShotMaxBytes);
  k.all_gather_ring_max_bytes = o.all_gather_ring_max_bytes.value_or(k.all_gather_ring_max_bytes);
  k.reduce_scatter_ring_max_bytes =
      o.reduce_scatter_ring_max_bytes.value_or(k.reduce_scatter_ring_max_bytes);
  k.cross_memory_min_bytes = o.cross_memory_min_bytes.value_or(k.cross_memory_min_bytes);
  TORCH_CHECK(!o.parallel_min_bytes || *o.parallel_min_bytes >= 0,
              "cuda_p2p: Options.parallel_min_bytes must be >= 0 (0: never split), got ",
              *o.parallel_min_bytes);
  k.parallel_min_bytes =
      pick(o.parallel_min_bytes, env_int(env, kParallelMinBytesEnv, 0, kMaxBytes),
           ops::CollectiveConfig::kDefaultParallelMinBytes);
  k.inline_all_reduce = pick(o.inline_all_reduce, env_bool(env, kInlineAllReduceEnv), true);
  if (auto a = chosen(o.zero_copy_agreement, "zero_copy_agreement", env, kZeroCopyAgreementEnv)) {
    k.zero_copy_agreement = ops::parse_zero_copy_agreement(a->first, a->second);
    c.zero_copy_agreement_from = a->second;
  }
  ops::validate(k, world_size);

  // Copy-free reads (NOTE [Copy-free reads] in ops/collectives.cpp): off unless asked for - on
  // the machines measured so far staging is faster (docs/collectives.md). The workspace still
  // probes whether the system allows them.
  const auto env_cross = env_bool(env, kCrossMemoryEnv);
  c.cross_memory = pick(o.cross_memory, env_cross, false);
  if (!c.cross_memory) {
    c.cross_memory_off_reason = o.cross_memory ? std::string("Options.cross_memory = False")
                                : env_cross
                                    ? c10::str(kCrossMemoryEnv, "=", *env(kCrossMemoryEnv))
                                    : c10::str("off by default; Options.cross_memory = True or ",
                                               kCrossMemoryEnv, "=1 turns it on");
  }
  c.workspace_options.private_reads = c.cross_memory;

  // The symmetric heap (NOTE [Symmetric heap] in p2p_workspace/symmetric_heap.cpp).
  TORCH_CHECK(!o.symmetric_heap_size || *o.symmetric_heap_size > 0,
              "cuda_p2p: Options.symmetric_heap_size must be positive (bytes), got ",
              *o.symmetric_heap_size);
  c.symmetric_heap_size =
      pick(o.symmetric_heap_size, env_int(env, kSymmetricHeapSizeEnv, 1, kMaxBytes),
           Config::kDefaultSymmetricHeapSize);
  // The send/recv mailboxes (NOTE [Mailboxes] in p2p_workspace/host/mailboxes.cpp).
  c.mailbox_slot_bytes =
      pick(o.mailbox_slot_bytes, env_int(env, kMailboxSlotBytesEnv, 4096, kMaxMailboxSlotBytes),
           Config::kDefaultMailboxSlotBytes);
  TORCH_CHECK(c.mailbox_slot_bytes >= 4096 && c.mailbox_slot_bytes <= kMaxMailboxSlotBytes &&
                  c.mailbox_slot_bytes % 4096 == 0,
              "cuda_p2p: mailbox_slot_bytes (Options.mailbox_slot_bytes or ", kMailboxSlotBytesEnv,
              ") must be a multiple of 4096 in [4096, ", kMaxMailboxSlotBytes, "], got ",
              c.mailbox_slot_bytes);
  // The fused ops' choice between fused and unfused (NOTE [Unfused below a size]).
  TORCH_CHECK(!o.fused_min_flops || (*o.fused_min_flops >= 0 && *o.fused_min_flops <= kMaxFlops),
              "cuda_p2p: Options.fused_min_flops must be in [0, ", kMaxFlops, "] (flops), got ",
              *o.fused_min_flops);
  c.fused_min_flops =
      o.fused_min_flops ? o.fused_min_flops : env_int(env, kFusedMinFlopsEnv, 0, kMaxFlops);
  // NOTE [Debug lines].
  if (auto v = env(kDebugEnv)) {
    const std::string level = lower(*v);
    TORCH_CHECK(level == "info" || level == "off" || level == "0", "cuda_p2p: ", kDebugEnv,
                " must be INFO or OFF (any case), got '", *v, "'");
    c.debug = level == "info";
  }
  c.knobs = knob_values(o, env);
  return c;
}

}  // namespace cuda_p2p
