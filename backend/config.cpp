#include "backend/config.hpp"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <type_traits>
#include <utility>

namespace cuda_p2p {

// NOTE [Configuration rules]
// Every knob is read here and nowhere else, by the rules in config.hpp, so that a typo is an
// error naming the knob rather than a silently different algorithm. Each knob is one row of the
// table in knobs() below, and everything else about it is derived from that row: the docs table
// (docs/configuration.md, compared with knobs() by tests/python/clients/test_config.py), the
// resolution, the source reported per knob, the Python Options properties with their validation,
// and the values get_collective_config reports. So the text of a default is rendered from its value
// (render_default), never typed beside it, and the Options properties refuse exactly what the
// resolution refuses, with the same message (both call check()); tests/cpp/test_config.cpp
// checks both for every knob, and that each rendered default is what a group with nothing set
// reads back. The lower layers (ops, p2p_workspace) receive the resolved values as plain fields
// (CollectiveConfig, WorkspaceOptions, HostStreams): they never read the environment.

namespace config {

namespace {

constexpr int64_t kKiB = int64_t{1} << 10;
constexpr int64_t kMiB = int64_t{1} << 20;
// 64 PiB, the largest address space of an x86-64 process (5-level paging): a sanity bound, not
// a policy (a size above what a rank can map fails when it is allocated, naming the knob).
constexpr int64_t kMaxBytes = int64_t{1} << 56;
constexpr int64_t kMaxRingSteps = int64_t{1} << 20;
constexpr int64_t kMaxFlops = int64_t{1} << 60;
constexpr int64_t kMaxLocalRank = 999999999;         // nine digits (choose_cuda_device)
constexpr const char* kLocalRankEnv = "LOCAL_RANK";  // set by torchrun and most launchers
// CUDA's own: the hardware queues the process's streams share (NOTE [Hardware queues] in
// p2p_workspace/cuda/cuda_device.cpp).
constexpr const char* kCudaMaxConnectionsEnv = "CUDA_DEVICE_MAX_CONNECTIONS";

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

Value word(const char* n) { return std::string(n); }

// The names of a kNames knob, in order.
std::vector<std::string> split_names(const std::string& names) {
  std::vector<std::string> out;
  size_t begin = 0;
  while (begin <= names.size()) {
    const size_t end = std::min(names.find('|', begin), names.size());
    out.push_back(names.substr(begin, end - begin));
    begin = end + 1;
  }
  return out;
}

// Whether "auto" leaves the knob's choice to the next source (a names knob that lists it first).
bool auto_is_unset(const Knob& k) {
  return k.kind == Kind::kNames && k.names.rfind("auto|", 0) == 0;
}

// `v` with the largest exact binary unit: "32 MiB" (bytes) or "8G" (other numbers, as the
// variables take them); else the plain number.
std::string with_unit(int64_t v, bool bytes) {
  struct Unit {
    int shift;
    const char* bytes;
    const char* suffix;
  };
  static constexpr Unit kUnits[] = {{50, " PiB", nullptr},
                                    {40, " TiB", nullptr},
                                    {30, " GiB", "G"},
                                    {20, " MiB", "M"},
                                    {10, " KiB", "K"}};
  if (v != 0) {
    for (const auto& u : kUnits) {
      const int64_t scale = int64_t{1} << u.shift;
      if ((bytes || u.suffix != nullptr) && v % scale == 0) {
        return std::to_string(v / scale) + (bytes ? u.bytes : u.suffix);
      }
    }
  }
  return std::to_string(v);
}

// What an Options value reads as: the number as set, True/False, the name.
std::string option_text(const Value& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b ? "True" : "False";
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  return std::get<std::string>(v);
}

// "in [0, 64 PiB]", "a multiple of 4 KiB in [4 KiB, 256 MiB]": the rule of a number knob.
std::string range_text(const Knob& k) {
  std::string out = k.step > 1 ? "a multiple of " + render(k.kind, k.step) + " in " : "in ";
  return out + "[" + render(k.kind, k.min) + ", " + render(k.kind, k.max) + "]";
}

// The variable's text, unless it is unset, empty, or a names knob's "auto" (unset too).
std::optional<std::string> env_text(const Knob& k, const EnvLookup& env) {
  if (k.env.empty()) return std::nullopt;
  auto text = env(k.env);
  if (text && auto_is_unset(k) && *text == "auto") return std::nullopt;
  return text;
}

// The syntax of a number (NOTE [Configuration rules]), without its range.
int64_t parse_number(const std::string& text, const std::string& what) {
  const char* begin = text.c_str();
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(begin, &end, 10);
  bool ok = errno == 0 && end != begin;
  int64_t scale = 1;
  if (ok) {
    const std::string suffix = lower(end);
    if (suffix == "k" || suffix == "kib") {
      scale = kKiB;
    } else if (suffix == "m" || suffix == "mib") {
      scale = kMiB;
    } else if (suffix == "g" || suffix == "gib") {
      scale = int64_t{1} << 30;
    } else {
      ok = suffix.empty();
    }
  }
  ok = ok && (v == 0 || (v > 0 ? v <= std::numeric_limits<int64_t>::max() / scale
                               : v >= std::numeric_limits<int64_t>::min() / scale));
  TORCH_CHECK_VALUE(ok, "cuda_p2p: ", what,
                    " must be an integer, optionally with a suffix K, M or G (1024-based), got '",
                    text, "'");
  return static_cast<int64_t>(v) * scale;
}

// The variable's text as the knob's value, checked.
Value parse_env(const Knob& k, const std::string& text) {
  switch (k.kind) {
    case Kind::kBool: {
      const bool b = parse_bool(text, k.env);
      return k.env_inverted ? !b : b;
    }
    case Kind::kBytes:
    case Kind::kInt: {
      const Value v = parse_number(text, k.env);
      check(k, v, k.env, text);
      return v;
    }
    case Kind::kNames: {
      std::string n = k.any_case ? lower(text) : text;
      // "alias=name,...": another spelling of a name.
      for (size_t begin = 0; begin < k.aliases.size();) {
        const size_t end = std::min(k.aliases.find(',', begin), k.aliases.size());
        const std::string pair = k.aliases.substr(begin, end - begin);
        const size_t eq = pair.find('=');
        if (pair.substr(0, eq) == n) n = pair.substr(eq + 1);
        begin = end + 1;
      }
      Value v = std::move(n);
      check(k, v, k.env, text);
      return v;
    }
    case Kind::kString:
      return text;
  }
  TORCH_INTERNAL_ASSERT(false, "cuda_p2p: knob ", k.env, " of unknown kind");
}

// The default as it resolves before the group's device is known (std::monostate: left to the
// backend or the op; config.hpp, Default).
Value resolve_default(const Knob& k, int world_size) {
  const auto& d = k.default_rule;
  switch (d.rule) {
    case Default::Rule::kValue:
      return d.value;
    case Default::Rule::kTwoRanks:
      return world_size == 2 ? d.value : d.other;
    case Default::Rule::kByDevice:
    case Default::Rule::kGpuVisible:
    case Default::Rule::kWorldSize:
    case Default::Rule::kComputed:
      return std::monostate{};
  }
  return std::monostate{};
}

// A knob that lands as it is in one field of the Config (bool or int64_t), `Path` member
// pointers deep, and reads back from it.
template <auto... Path>
void store(Config& c, const Resolved& r) {
  auto& field = (c.*....*Path);
  field = std::get<std::remove_reference_t<decltype(field)>>(r.value);
}
template <auto... Path>
Value load(const Config& c, const Context&) {
  return (c.*....*Path);
}

// The rows: one per knob (config.hpp, Knob). A row's comment says where the knob's behaviour is
// explained; its help is the user's text (the docs table, the Python docstrings).
std::vector<Knob> rows() {
  using R = Default::Rule;
  using CC = ops::CollectiveConfig;
  std::vector<Knob> k;
  // --- the workspace and what runs on it ---
  k.push_back({.option = "enable_workspace",
               .field = &Options::enable_workspace,
               .env = "CUDA_P2P_DISABLE_WORKSPACE",
               .kind = Kind::kBool,
               .default_rule = {.value = true},
               .env_inverted = true,
               .land =
                   [](Config& c, const Resolved& r) {
                     c.workspace = r.b();
                     if (!c.workspace) c.workspace_off_reason = "disabled by " + r.setting();
                   },
               .read = [](const Config& c, const Context&) -> Value { return c.workspace; },
               .help = "Set up the P2P workspace."});
  // NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp; the GPU: NOTE [The
  // workspace's GPU] below.
  k.push_back(
      {.option = "workspace_device",
       .field = &Options::workspace_device,
       .env = "CUDA_P2P_WORKSPACE_DEVICE",
       .kind = Kind::kNames,
       .names = "auto|cpu|cuda",
       .default_rule = {.rule = R::kGpuVisible, .value = word("cuda"), .other = word("cpu")},
       .land =
           [](Config& c, const Resolved& r) {
             if (r.unset()) return;  // kAuto: the backend decides
             c.workspace_device = r.s() == "cpu" ? WorkspaceDevice::kCpu : WorkspaceDevice::kCuda;
             c.workspace_device_from = r.from();
           },
       .read = [](const Config& c, const Context& ctx) -> Value {
         if (c.workspace_device == WorkspaceDevice::kAuto) return word(ctx.host ? "cpu" : "cuda");
         return word(c.workspace_device == WorkspaceDevice::kCpu ? "cpu" : "cuda");
       },
       .help = "Where the workspace lives: cuda (a GPU, chosen as LOCAL_RANK says; the "
               "group must wrap NCCL) or cpu (host shared memory). One workspace per "
               "group: CPU tensors on a CUDA workspace, and CUDA tensors on a CPU one, go "
               "to the wrapped backend (Gloo, NCCL)."});
  k.push_back({.option = "buffer_size",
               .field = &Options::buffer_size,
               .kind = Kind::kBytes,
               .min = 1,
               .max = kMaxBytes,
               .default_rule = {.value = WorkspaceOptions::kDefaultBufferSize},
               .land = store<&Config::workspace_options, &WorkspaceOptions::buffer_size>,
               .read = load<&Config::workspace_options, &WorkspaceOptions::buffer_size>,
               .help = "Bytes of the symmetric buffer each rank shares with its peers."});
  // Rounds: ops/pipeline_common.hpp, plan_rounds.
  k.push_back({.option = "max_buffer_size",
               .field = &Options::max_buffer_size,
               .kind = Kind::kBytes,
               .min = 1,
               .max = kMaxBytes,
               .default_rule = {.value = WorkspaceOptions::kDefaultMaxBufferSize},
               .land = store<&Config::max_buffer_size>,
               .read = load<&Config::max_buffer_size>,
               .help = "The largest buffer an op may grow the workspace to on its own; larger "
                       "payloads are processed in rounds."});
  k.push_back({.option = "workspace_collectives",
               .field = &Options::workspace_collectives,
               .env = "CUDA_P2P_WORKSPACE_COLLECTIVES",
               .kind = Kind::kBool,
               .default_rule = {.value = true},
               .land = store<&Config::collectives>,
               .read = load<&Config::collectives>,
               .help = "Run the collectives on the workspace; off, they go to the wrapped backend "
                       "while the workspace stays up for the fused ops."});
  // NOTE [CUDA collectives are opt-in] in backend/ProcessGroupCudaP2P.cpp.
  k.push_back({.option = "cuda_workspace_collectives",
               .field = &Options::cuda_workspace_collectives,
               .env = "CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES",
               .kind = Kind::kBool,
               .default_rule = {.value = false},
               .reported = true,
               .land = store<&Config::cuda_collectives>,
               .read = load<&Config::cuda_collectives>,
               .help = "Run the collectives on CUDA tensors on the CUDA workspace; off, they go "
                       "to NCCL. CPU tensors and the fused ops are not affected."});
  // backend/hierarchical.hpp.
  k.push_back({.option = "hierarchical",
               .field = &Options::hierarchical,
               .env = "CUDA_P2P_HIERARCHICAL",
               .kind = Kind::kBool,
               .default_rule = {.value = true},
               .land = store<&Config::hierarchical>,
               .read = load<&Config::hierarchical>,
               .help = "On a group whose ranks span hosts, run the collectives on CPU tensors "
                       "hierarchically: intra-host on each host's workspace, inter-host on the "
                       "wrapped backend."});
  // NOTE [Cooperative host streams] in p2p_workspace/host/host_stream.cpp.
  k.push_back(
      {.option = "host_streams",
       .field = &Options::host_streams,
       .env = "CUDA_P2P_HOST_STREAMS",
       .kind = Kind::kNames,
       .names = "auto|cooperative|threads",
       .default_rule = {.value = word("cooperative")},
       .land = [](Config& c,
                  const Resolved& r) { c.host_streams = parse_host_streams(r.s(), r.from()); },
       .read = [](const Config& c, const Context&) -> Value {
         return word(c.host_streams == HostStreams::kThreads ? "threads" : "cooperative");
       },
       .help = "How a host workspace runs the fused pipelines' two streams: cooperative "
               "(in the waiting thread) or threads (a thread per stream, the GPU's "
               "concurrency)."});
  // NOTE [Host device with CUDA's semantics] in p2p_workspace/host/host_device.hpp.
  k.push_back(
      {.option = "host_semantics",
       .field = &Options::host_semantics,
       .env = "CUDA_P2P_HOST_SEMANTICS",
       .kind = Kind::kNames,
       .names = "auto|synchronous|cuda",
       .default_rule = {.value = word("synchronous")},
       .land = [](Config& c,
                  const Resolved& r) { c.host_semantics = parse_host_semantics(r.s(), r.from()); },
       .read = [](const Config& c, const Context&) -> Value {
         return word(c.host_semantics == HostSemantics::kCuda ? "cuda" : "synchronous");
       },
       .help = "How a host workspace's ops behave: synchronous (complete when they return) or "
               "cuda (queued on the caller's stream as on a GPU, waits released rather than "
               "raised: tests the GPU's protocol on the CPU)."});
  // --- the workspace collectives (docs/collectives.md) ---
  k.push_back({.option = "all_gather_algo",
               .field = &Options::all_gather_algo,
               .env = "CUDA_P2P_ALL_GATHER_ALGO",
               .kind = Kind::kNames,
               .names = "auto|direct|ring",
               .default_rule = {.value = word("auto")},
               .reported = true,
               .land =
                   [](Config& c, const Resolved& r) {
                     c.collective.all_gather = ops::parse_all_gather_algo(r.s(), r.from());
                   },
               .read = [](const Config& c, const Context&) -> Value {
                 return word(ops::to_string(c.collective.all_gather));
               },
               .help = "Workspace all-gather algorithm (auto: by size)."});
  k.push_back({.option = "reduce_scatter_algo",
               .field = &Options::reduce_scatter_algo,
               .env = "CUDA_P2P_REDUCE_SCATTER_ALGO",
               .kind = Kind::kNames,
               .names = "auto|direct|ring",
               .default_rule = {.value = word("auto")},
               .reported = true,
               .land =
                   [](Config& c, const Resolved& r) {
                     c.collective.reduce_scatter = ops::parse_reduce_scatter_algo(r.s(), r.from());
                   },
               .read = [](const Config& c, const Context&) -> Value {
                 return word(ops::to_string(c.collective.reduce_scatter));
               },
               .help = "Workspace reduce-scatter algorithm (auto: by size)."});
  k.push_back({.option = "all_reduce_algo",
               .field = &Options::all_reduce_algo,
               .env = "CUDA_P2P_ALL_REDUCE_ALGO",
               .kind = Kind::kNames,
               .names = "auto|one_shot|two_shot",
               .default_rule = {.value = word("auto")},
               .reported = true,
               .land =
                   [](Config& c, const Resolved& r) {
                     c.collective.all_reduce = ops::parse_all_reduce_algo(r.s(), r.from());
                   },
               .read = [](const Config& c, const Context&) -> Value {
                 return word(ops::to_string(c.collective.all_reduce));
               },
               .help = "Workspace all-reduce algorithm (auto: by size)."});
  // 0 is the world size (CollectiveConfig::ring_steps); a multiple of it: ops::validate.
  k.push_back({.option = "ring_steps",
               .field = &Options::ring_steps,
               .env = "CUDA_P2P_RING_STEPS",
               .kind = Kind::kInt,
               .min = 0,
               .max = kMaxRingSteps,
               .default_rule = {.rule = R::kWorldSize},
               .reported = true,
               .land =
                   [](Config& c, const Resolved& r) {
                     c.collective.ring_steps = r.unset() ? 0 : static_cast<int>(r.i());
                   },
               .read = [](const Config& c, const Context& ctx) -> Value {
                 return int64_t{c.collective.ring_steps == 0 ? ctx.world_size
                                                             : c.collective.ring_steps};
               },
               .help = "Steps of the reduce-scatter ring, a positive multiple of the world size "
                       "(0: the world size)."});
  k.push_back({.option = "chunk_bytes",
               .field = &Options::chunk_bytes,
               .env = "CUDA_P2P_CHUNK_BYTES",
               .kind = Kind::kBytes,
               .min = 0,
               .max = kMaxBytes,
               .default_rule = {.value = CC::kDefaultChunkBytes},
               .reported = true,
               .land = store<&Config::collective, &CC::chunk_bytes>,
               .read = load<&Config::collective, &CC::chunk_bytes>,
               .help = "Bytes a rank stages per round of a workspace collective (0: half the "
                       "buffer)."});
  // NOTE [Rounds chosen by rank 0] in ops/all_reduce.cpp.
  k.push_back(
      {.option = "all_reduce_rounds",
       .field = &Options::all_reduce_rounds,
       .env = "CUDA_P2P_ALL_REDUCE_ROUNDS",
       .kind = Kind::kNames,
       .names = "auto|chunked|large",
       .default_rule = {.value = word("auto")},
       .reported = true,
       .land =
           [](Config& c, const Resolved& r) {
             c.collective.all_reduce_rounds = ops::parse_all_reduce_rounds(r.s(), r.from());
           },
       .read = [](const Config& c, const Context&) -> Value {
         return word(ops::to_string(c.collective.all_reduce_rounds));
       },
       .help = "Rounds of a two-shot all-reduce of more than one chunk_bytes round on a host "
               "workspace: auto lets rank 0 choose, one op ahead, from the times of its recent "
               "ops, between chunk_bytes rounds and the largest the buffer holds; large makes it "
               "choose the latter (from the second op of each size class); chunked keeps "
               "chunk_bytes. Equal on every rank (auto and large may mix)."});
  // The thresholds of the choice by size: CollectiveConfig.
  k.push_back({.option = "all_reduce_one_shot_max_bytes",
               .field = &Options::all_reduce_one_shot_max_bytes,
               .kind = Kind::kBytes,
               .min = 0,
               .max = kMaxBytes,
               .default_rule = {.rule = R::kTwoRanks,
                                .value = CC::kDefaultTwoRankAllReduceOneShotMaxBytes,
                                .other = CC::kDefaultAllReduceOneShotMaxBytes},
               .reported = true,
               .land = store<&Config::collective, &CC::all_reduce_one_shot_max_bytes>,
               .read = load<&Config::collective, &CC::all_reduce_one_shot_max_bytes>,
               .help = "Largest all-reduce that auto runs one-shot."});
  // NOTE [Inline one-shot] in ops/all_reduce.cpp.
  k.push_back({.option = "inline_all_reduce",
               .field = &Options::inline_all_reduce,
               .env = "CUDA_P2P_INLINE_ALL_REDUCE",
               .kind = Kind::kBool,
               .default_rule = {.value = true},
               .reported = true,
               .land = store<&Config::collective, &CC::inline_all_reduce>,
               .read = load<&Config::collective, &CC::inline_all_reduce>,
               .help = "On a host workspace, run a one-shot all-reduce that fits one round on the "
                       "calling thread without enqueueing (the same protocol; off: the generic "
                       "path, for comparison)."});
  k.push_back({.option = "all_gather_ring_max_bytes",
               .field = &Options::all_gather_ring_max_bytes,
               .kind = Kind::kBytes,
               .min = 0,
               .max = kMaxBytes,
               .default_rule = {.value = CC::kDefaultAllGatherRingMaxBytes},
               .reported = true,
               .land = store<&Config::collective, &CC::all_gather_ring_max_bytes>,
               .read = load<&Config::collective, &CC::all_gather_ring_max_bytes>,
               .help = "Largest all-gather output that auto runs as a ring on 3+ ranks."});
  k.push_back({.option = "reduce_scatter_ring_max_bytes",
               .field = &Options::reduce_scatter_ring_max_bytes,
               .kind = Kind::kBytes,
               .min = 0,
               .max = kMaxBytes,
               .default_rule = {.value = CC::kDefaultReduceScatterRingMaxBytes},
               .reported = true,
               .land = store<&Config::collective, &CC::reduce_scatter_ring_max_bytes>,
               .read = load<&Config::collective, &CC::reduce_scatter_ring_max_bytes>,
               .help = "Largest reduce-scatter input that auto runs as a ring."});
  // NOTE [Cross-memory reads] in ops/collectives.cpp: off unless asked for (why:
  // docs/collectives.md, "Cross-memory reads"). The workspace still probes whether the system
  // allows them.
  k.push_back({.option = "cross_memory",
               .field = &Options::cross_memory,
               .env = "CUDA_P2P_CROSS_MEMORY",
               .kind = Kind::kBool,
               .default_rule = {.value = false},
               .land =
                   [](Config& c, const Resolved& r) {
                     c.cross_memory = r.b();
                     c.workspace_options.cross_memory_reads = r.b();
                     if (r.b()) return;
                     c.cross_memory_off_reason =
                         r.source != Source::kDefault
                             ? r.setting()
                             : c10::str("off by default; Options.", r.knob->option, " = True or ",
                                        r.knob->env, "=1 turns it on");
                   },
               .read = [](const Config& c, const Context&) -> Value { return c.cross_memory; },
               .help = "Cross-memory reads of peers' tensors on the host (process_vm_readv), where "
                       "the system allows them."});
  k.push_back({.option = "cross_memory_min_bytes",
               .field = &Options::cross_memory_min_bytes,
               .kind = Kind::kBytes,
               .min = 0,
               .max = kMaxBytes,
               .default_rule = {.value = CC::kDefaultCrossMemoryMinBytes},
               .reported = true,
               .land = store<&Config::collective, &CC::cross_memory_min_bytes>,
               .read = load<&Config::collective, &CC::cross_memory_min_bytes>,
               .help = "Smallest payload that cross-memory reads take, when they are on."});
  // NOTE [Intra-op threads] in ops/collectives.cpp.
  k.push_back({.option = "parallel_min_bytes",
               .field = &Options::parallel_min_bytes,
               .env = "CUDA_P2P_PARALLEL_MIN_BYTES",
               .kind = Kind::kBytes,
               .min = 0,
               .max = kMaxBytes,
               .default_rule = {.value = CC::kDefaultParallelMinBytes},
               .reported = true,
               .land = store<&Config::collective, &CC::parallel_min_bytes>,
               .read = load<&Config::collective, &CC::parallel_min_bytes>,
               .help = "On the host, copies and reductions of a workspace collective of at least "
                       "this many bytes are split across the rank's intra-op threads "
                       "(torch.get_num_threads()) when it has two or more; 0: never. One thread "
                       "per rank (the default) never splits."});
  // NOTE [Symmetric heap] in p2p_workspace/symmetric_heap.cpp.
  k.push_back({.option = "symmetric_heap_size",
               .field = &Options::symmetric_heap_size,
               .env = "CUDA_P2P_SYMMETRIC_HEAP_SIZE",
               .kind = Kind::kBytes,
               .min = 1,
               .max = kMaxBytes,
               .default_rule = {.value = Config::kDefaultSymmetricHeapSize},
               .land = store<&Config::symmetric_heap_size>,
               .read = load<&Config::symmetric_heap_size>,
               .help = "Bytes of each rank's symmetric heap (cuda_p2p.empty, "
                       "use_symmetric_memory), created on first use; host: a sparse mapping "
                       "(touched pages cost memory); CUDA: committed device memory, all of it at "
                       "creation. It does not grow."});
  // NOTE [Mailboxes] in p2p_workspace/messages/mailboxes.cpp: whole pages.
  k.push_back({.option = "mailbox_slot_bytes",
               .field = &Options::mailbox_slot_bytes,
               .env = "CUDA_P2P_MAILBOX_SLOT_BYTES",
               .kind = Kind::kBytes,
               .min = 4 * kKiB,
               .max = 256 * kMiB,
               .step = 4 * kKiB,
               .default_rule = {.value = Config::kDefaultMailboxSlotBytes},
               .reported = true,
               .land = store<&Config::mailbox_slot_bytes>,
               .read = load<&Config::mailbox_slot_bytes>,
               .help = "Bytes of each slot of the send/recv mailboxes on a host workspace (two per "
                       "pair of ranks, in the sender's memory): a message up to two slots is sent "
                       "eagerly, a larger one streams through them."});
  // NOTE [Zero-copy collectives] in ops/zero_copy.cpp; CUDA's default: NOTE [CUDA zero-copy is
  // opt-in] in ops/common.hpp (ops::resolve_agreement).
  k.push_back(
      {.option = "zero_copy_agreement",
       .field = &Options::zero_copy_agreement,
       .env = "CUDA_P2P_ZERO_COPY_AGREEMENT",
       .kind = Kind::kNames,
       .names = "auto|exchange|signature|off",
       .default_rule = {.rule = R::kByDevice, .value = word("exchange"), .other = word("off")},
       .reported = true,
       .land =
           [](Config& c, const Resolved& r) {
             if (r.unset()) return;  // kAuto: by the workspace's device
             c.collective.zero_copy_agreement = ops::parse_zero_copy_agreement(r.s(), r.from());
             c.zero_copy_agreement_from = r.from();
           },
       .read = [](const Config& c, const Context& ctx) -> Value {
         return word(
             ops::to_string(ops::resolve_agreement(c.collective.zero_copy_agreement, ctx.host)));
       },
       .help = "How the ranks agree that a collective's inputs are symmetric tensors. exchange "
               "(host only): each rank publishes its inputs' heap offsets, which may differ; if "
               "any input is not in its heap, all stage (one barrier more for a group with a "
               "heap). signature: each rank states its offsets in the op signature, assuming its "
               "peers allocated alike; a group with a heap pays nothing for ordinary inputs, and "
               "ranks whose tensors differ raise a signature mismatch. off: symmetric inputs "
               "stage like any other. CUDA's default stays off until signature has been "
               "validated on GPUs."});
  // NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp.
  k.push_back({.option = "trap_on_peer_failure",
               .field = &Options::trap_on_peer_failure,
               .env = "CUDA_P2P_TRAP_ON_PEER_FAILURE",
               .kind = Kind::kBool,
               .default_rule = {.value = false},
               .reported = true,
               .land = store<&Config::workspace_options, &WorkspaceOptions::trap_on_peer_failure>,
               .read = load<&Config::workspace_options, &WorkspaceOptions::trap_on_peer_failure>,
               .help = "A CUDA workspace's kernels (captured collectives, replayed waits) trap "
                       "when a peer's failure reaches them, losing this process's CUDA context, "
                       "for jobs that prefer to die fast under an elastic launcher; off: they end "
                       "quietly and the next cuda_p2p call or cuda_p2p.check(group) raises."});
  // NOTE [Unfused below a size] in backend/dispatcher_fused_ops.cpp.
  k.push_back({.option = "fused_min_flops",
               .field = &Options::fused_min_flops,
               .env = "CUDA_P2P_FUSED_MIN_FLOPS",
               .kind = Kind::kInt,
               .min = 0,
               .max = kMaxFlops,
               .default_rule = {.rule = R::kByDevice,
                                .value = Config::kDefaultHostFusedMinFlops,
                                .other = int64_t{0}},
               .reported = true,
               .land =
                   [](Config& c, const Resolved& r) {
                     if (!r.unset()) c.fused_min_flops = r.i();
                   },
               .read = [](const Config& c, const Context& ctx) -> Value {
                 return c.fused_min_flops_for(ctx.host ? c10::DeviceType::CPU
                                                       : c10::DeviceType::CUDA);
               },
               .help = "The fused ops' \"auto\" runs the fused pipeline from this many GEMM flops "
                       "per rank (2*M*N*K) on; below, the unfused workspace collective and matmul "
                       "(K, M, G: 1024-based)."});
  // --- environment variables only ---
  // NOTE [Debug lines] below.
  k.push_back({.env = "CUDA_P2P_DEBUG",
               .kind = Kind::kNames,
               .names = "off|info",
               .aliases = "0=off",
               .any_case = true,
               .default_rule = {.value = word("off")},
               .land = [](Config& c, const Resolved& r) { c.debug = r.s() == "info"; },
               .read = [](const Config& c, const Context&) -> Value {
                 return word(c.debug ? "info" : "off");
               },
               .help = "INFO: one line on stderr per group at its creation (the workspace, its "
                       "device, the collectives' path, each knob that is not at its default) and "
                       "one per fallback to the wrapped backend the first time it happens on the "
                       "group (python -m cuda_p2p reports the same facts)."});
  k.push_back({.env = "CUDA_P2P_HOST_ID",
               .kind = Kind::kString,
               .default_rule = {.rule = R::kComputed, .text = "hostname/boot id"},
               .land =
                   [](Config& c, const Resolved& r) {
                     if (!r.unset()) c.workspace_options.host_id = r.s();
                   },
               .read = [](const Config& c, const Context&) -> Value {
                 if (c.workspace_options.host_id.empty()) return std::monostate{};
                 return c.workspace_options.host_id;
               },
               .help = "This process's host identity; ranks with different identities do not "
                       "share a workspace (tests simulate several hosts with it)."});
  k.push_back(
      {.env = "CUDA_P2P_TEST_DENY_CROSS_MEMORY",
       .kind = Kind::kBool,
       .default_rule = {.value = false},
       .land = store<&Config::workspace_options, &WorkspaceOptions::deny_cross_memory_reads>,
       .read = load<&Config::workspace_options, &WorkspaceOptions::deny_cross_memory_reads>,
       .help = "Test hook: this process's cross-memory reads fail as under Yama "
               "ptrace_scope (EPERM)."});
  // Read by choose_cuda_device (NOTE [The workspace's GPU]), only for a CUDA workspace.
  k.push_back({.env = kLocalRankEnv,
               .kind = Kind::kInt,
               .min = 0,
               .max = kMaxLocalRank,
               .help = "This process's rank on its host (torchrun sets it). A CUDA workspace goes "
                       "on the device bound by init_process_group(device_id=...), else on the "
                       "current GPU if torch.cuda.set_device chose one other than cuda:0, else on "
                       "GPU LOCAL_RANK mod the visible GPUs, else on cuda:0."});
  // Read by cuda_hardware_queues (NOTE [Hardware queues]), only for a CUDA workspace.
  k.push_back({.env = kCudaMaxConnectionsEnv,
               .kind = Kind::kInt,
               .min = 1,
               .max = 32,
               .help = "CUDA's own variable: how many hardware queues the process's CUDA streams "
                       "share (the driver's default: 8). Below 4 a CUDA workspace waits with its "
                       "wait kernel instead of stream memory operations, since a released wait "
                       "could queue behind itself."});
  // NOTE [Blocks that outlive their exporter] in p2p_workspace/cuda/vmm_blocks.cpp.
  k.push_back(
      {.env = "CUDA_P2P_CUDA_BLOCKS",
       .kind = Kind::kNames,
       .names = "auto|vmm|ipc",
       .default_rule = {.value = word("auto")},
       .land = [](Config& c, const Resolved& r) { c.cuda_blocks = r.unset() ? "auto" : r.s(); },
       .read = [](const Config& c, const Context&) -> Value { return c.cuda_blocks; },
       .help = "How a CUDA workspace makes its blocks: vmm (cuMem allocations shared as "
               "file descriptors: a dead rank's block stays valid for the survivors), "
               "ipc (legacy cudaMalloc and CUDA IPC), auto (vmm where the driver and the "
               "GPU offer it). The same on every rank."});
  return k;
}

// The docs' type column: the kind, and a number's range.
std::string type_text(const Knob& k) {
  switch (k.kind) {
    case Kind::kBool:
      return "bool";
    case Kind::kBytes:
      return (k.step > 1 ? "bytes, " : "bytes ") + range_text(k);
    case Kind::kInt:
      return (k.step > 1 ? "int, " : "int ") + range_text(k);
    case Kind::kNames:
      return k.names;
    case Kind::kString:
      return "string";
  }
  return "?";
}

// The special rules, said once for every knob that has them.
std::string rule_text(const Knob& k) {
  std::string out;
  if (k.env_inverted) out += c10::str(" The variable is inverted: ", k.env, "=1 turns it off.");
  if (k.kill_switch()) out += " Either side turns it off.";
  return out;
}

// The invariants the generic code relies on (NOTE [Configuration rules]).
void check_row(const Knob& k) {
  const std::string name = k.option.empty() ? k.env : k.option;
  TORCH_INTERNAL_ASSERT(!name.empty() && !k.help.empty(), "cuda_p2p: a knob without name or help");
  const auto& d = k.default_rule;
  if (std::holds_alternative<std::string Options::*>(k.field)) {
    TORCH_INTERNAL_ASSERT(auto_is_unset(k), "cuda_p2p: knob ", name, ": names without auto");
  }
  if (std::holds_alternative<bool Options::*>(k.field)) {
    TORCH_INTERNAL_ASSERT(d.rule == Default::Rule::kValue && std::holds_alternative<bool>(d.value),
                          "cuda_p2p: knob ", name, ": a plain bool needs a bool default");
  }
  if (std::holds_alternative<int64_t Options::*>(k.field)) {
    TORCH_INTERNAL_ASSERT(
        d.rule == Default::Rule::kValue && std::holds_alternative<int64_t>(d.value),
        "cuda_p2p: knob ", name, ": a plain number needs a number default");
  }
  if (k.kind == Kind::kBytes || k.kind == Kind::kInt) {
    TORCH_INTERNAL_ASSERT(k.min <= k.max && k.step >= 1, "cuda_p2p: knob ", name, ": range");
  }
  TORCH_INTERNAL_ASSERT(k.land != nullptr || k.option.empty(), "cuda_p2p: knob ", name,
                        ": an Options field must land in the Config");
  TORCH_INTERNAL_ASSERT(!k.reported || (k.read != nullptr && !k.option.empty()), "cuda_p2p: knob ",
                        name, ": reported without a reader");
}

}  // namespace

std::vector<std::string> Knob::name_list() const { return split_names(names); }

bool Knob::kill_switch() const {
  return std::holds_alternative<bool Options::*>(field) &&
         std::get_if<bool>(&default_rule.value) != nullptr && std::get<bool>(default_rule.value);
}

std::string Resolved::from() const {
  switch (source) {
    case Source::kOptions:
      return "Options." + knob->option;
    case Source::kEnvironment:
      return knob->env;
    case Source::kDefault:
      return "";
  }
  return "";
}

std::string Resolved::setting() const {
  switch (source) {
    case Source::kOptions:
      return c10::str("Options.", knob->option, " = ", text);
    case Source::kEnvironment:
      return c10::str(knob->env, "=", text);
    case Source::kDefault:
      return "";
  }
  return "";
}

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
  TORCH_CHECK_VALUE(false, "cuda_p2p: ", what,
                    " must be a boolean (1/0, true/false, yes/no, on/off), got '", text, "'");
}

int64_t parse_int(const std::string& text, const std::string& what, int64_t min, int64_t max) {
  const int64_t value = parse_number(text, what);
  TORCH_CHECK_VALUE(value >= min && value <= max, "cuda_p2p: ", what, " must be in [", min, ", ",
                    max, "], got ", value, " ('", text, "')");
  return value;
}

const std::vector<Knob>& knobs() {
  static const std::vector<Knob> kKnobs = [] {
    auto table = rows();
    for (auto& k : table) {
      check_row(k);
      k.type = type_text(k);
      k.default_value = render_default(k);
      k.help += rule_text(k);
    }
    return table;
  }();
  return kKnobs;
}

const Knob* find_knob(const std::string& name) {
  for (const auto& k : knobs()) {
    if (k.option == name || (k.option.empty() && k.env == name)) return &k;
  }
  return nullptr;
}

std::string render(Kind kind, const Value& value) {
  if (std::holds_alternative<std::monostate>(value)) return "unset";
  if (const auto* i = std::get_if<int64_t>(&value)) return with_unit(*i, kind == Kind::kBytes);
  return option_text(value);
}

std::string render_default(const Knob& k) {
  const auto& d = k.default_rule;
  const auto r = [&k](const Value& v) { return render(k.kind, v); };
  switch (d.rule) {
    case Default::Rule::kValue:
      return r(d.value);
    case Default::Rule::kByDevice:
      return c10::str("host: ", r(d.value), "; CUDA: ", r(d.other));
    case Default::Rule::kGpuVisible:
      return c10::str(r(d.value), " with a visible GPU, else ", r(d.other));
    case Default::Rule::kTwoRanks:
      return c10::str(r(d.value), " on 2 ranks, else ", r(d.other));
    case Default::Rule::kWorldSize:
      return "the world size";
    case Default::Rule::kComputed:
      return d.text;
  }
  return "?";
}

Value default_in(const Knob& k, const Context& ctx) {
  const auto& d = k.default_rule;
  switch (d.rule) {
    case Default::Rule::kValue:
      return d.value;
    case Default::Rule::kByDevice:
      return ctx.host ? d.value : d.other;
    case Default::Rule::kGpuVisible:
      return ctx.host ? d.other : d.value;
    case Default::Rule::kTwoRanks:
      return ctx.world_size == 2 ? d.value : d.other;
    case Default::Rule::kWorldSize:
      return int64_t{ctx.world_size};
    case Default::Rule::kComputed:
      return std::monostate{};
  }
  return std::monostate{};
}

void check(const Knob& k, const Value& value, const std::string& what, const std::string& text) {
  const std::string got = text.empty() ? "" : c10::str(" ('", text, "')");
  switch (k.kind) {
    case Kind::kBytes:
    case Kind::kInt: {
      const int64_t v = std::get<int64_t>(value);
      TORCH_CHECK_VALUE(v >= k.min && v <= k.max && v % k.step == 0, "cuda_p2p: ", what,
                        " must be ", range_text(k), ", got ", v, got);
      return;
    }
    case Kind::kNames: {
      const std::string& v = std::get<std::string>(value);
      const auto names = split_names(k.names);
      TORCH_CHECK_VALUE(std::find(names.begin(), names.end(), v) != names.end(), "cuda_p2p: ", what,
                        " must be one of ", k.names, k.any_case ? " (any case)" : "", ", got '",
                        text.empty() ? v : text, "'");
      return;
    }
    case Kind::kBool:
    case Kind::kString:
      return;
  }
}

std::optional<Value> option_value(const Knob& k, const Options& o) {
  return std::visit(
      [&](auto field) -> std::optional<Value> {
        if constexpr (std::is_same_v<decltype(field), std::monostate>) {
          return std::nullopt;
        } else {
          const auto& v = o.*field;
          using T = std::remove_cvref_t<decltype(v)>;
          if constexpr (std::is_same_v<T, std::string>) {
            if (v == "auto") return std::nullopt;
            return v;
          } else if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, int64_t>) {
            // A plain field counts as set when it differs from its default.
            if (Value(v) == k.default_rule.value) return std::nullopt;
            return v;
          } else {
            if (!v) return std::nullopt;
            return *v;
          }
        }
      },
      k.field);
}

Resolved resolve(const Knob& k, const Options& o, const EnvLookup& env, int world_size) {
  Resolved r;
  r.knob = &k;
  if (auto v = option_value(k, o)) {
    check(k, *v, "Options." + k.option);
    r.value = std::move(*v);
    r.source = Source::kOptions;
    r.text = option_text(r.value);
  } else if (auto text = env_text(k, env)) {
    r.value = parse_env(k, *text);
    r.source = Source::kEnvironment;
    r.text = std::move(*text);
  } else {
    r.value = resolve_default(k, world_size);
    r.text = k.default_value;
  }
  return r;
}

std::vector<KnobValue> knob_values(const Options& o, const EnvLookup& env) {
  std::vector<KnobValue> out;
  for (const auto& k : knobs()) {
    if (auto v = option_value(k, o)) {
      out.push_back({&k, option_text(*v), "Options"});
    } else if (auto text = env_text(k, env)) {
      out.push_back({&k, *text, "environment"});
    } else {
      out.push_back({&k, k.default_value, "default"});
    }
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

int cuda_hardware_queues(const config::EnvLookup& env) {
  const auto text = env(config::kCudaMaxConnectionsEnv);
  // CUDA's to validate: anything but a small number counts as unset here.
  if (!text || text->empty() || text->size() > 4 ||
      !std::all_of(text->begin(), text->end(),
                   [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; })) {
    return 0;
  }
  return std::stoi(*text);
}

Config resolve_config(const Options& o, int world_size, const config::EnvLookup& env) {
  Config c;
  c.workspace_options.timeout = o.timeout;
  for (const auto& k : config::knobs()) {
    if (k.land != nullptr) k.land(c, config::resolve(k, o, env, world_size));
  }
  // What depends on the group: ring steps against the world size.
  ops::validate(c.collective, world_size);
  c.knobs = config::knob_values(o, env);
  return c;
}

}  // namespace cuda_p2p
