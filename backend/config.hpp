// The one place where cuda_p2p's configuration is read. Every knob (an Options field, an
// environment variable, or both) is one row of one declarative table, config::knobs() in
// backend/config.cpp: its name, Options field, variable, kind, range or names, default (a value,
// or a small rule over the group's context, rendered to text by one function), how it lands in a
// Config, its special rule, and its help. From that row come the docs table
// (docs/configuration.md, compared by tests/python/clients/test_config.py), the resolution
// (resolve_config), which Options fields are set and each knob's source (knob_values), the Python
// Options properties and their validation (python/options.cpp: the same check() as the
// resolution, so Python refuses exactly what a group refuses, with the same message), and the
// knob values of get_collective_config. Nothing else in the project reads the environment.
//
// Rules (NOTE [Configuration rules] in backend/config.cpp):
//  * precedence: an Options value that is set wins, else the environment variable, else the
//    default. An optional field is set when it holds a value, a name when it is not "auto", a
//    plain bool or number when it differs from its default; so a plain bool that defaults to
//    True is a kill switch (enable_workspace, workspace_collectives, hierarchical): either side
//    turns it off. CUDA_P2P_DISABLE_WORKSPACE is inverted (1 turns the workspace off);
//  * an empty environment variable is unset;
//  * booleans: 1/true/yes/on or 0/false/no/off, case-insensitive;
//  * numbers: a decimal integer, optionally with a binary suffix K, M or G (KiB, MiB, GiB:
//    1024-based), within the knob's range (and a multiple of its step, where it has one);
//  * names (algorithms, modes): one of the listed names, "auto" leaving the choice to the next
//    source;
//  * anything else is a ValueError naming the knob (the Options field or the variable), what it
//    expects and what it got, raised where the value is given: by the Options property as it is
//    set, by the resolution for a variable. What depends on the group (ring steps against the
//    world size) is checked when the group is created.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <variant>
#include <vector>

#include "ops/collectives.hpp"
#include "ops/pipeline_common.hpp"
#include "p2p_workspace/host/host_device.hpp"
#include "p2p_workspace/symmetric_workspace.hpp"

namespace cuda_p2p {

inline constexpr const char* kBackendName = "cuda_p2p";

// ProcessGroupCudaP2P.Options: what a user sets per group (pg_options). Every field but
// nccl_options is a knob: its row in the knob table (backend/knob_table.cpp) says what it does, its
// default and its environment variable; the initial values here are "unset" (nullopt, "auto") or
// the row's default (plain bools and numbers: a test checks that a fresh Options sets nothing).
struct Options : c10d::Backend::Options {
  Options() : c10d::Backend::Options(kBackendName) {}

  // The workspace and what runs on it.
  std::string workspace_device = "auto";  // auto|cpu|cuda
  std::optional<int64_t> buffer_size;
  bool enable_workspace = true;
  bool workspace_collectives = true;
  std::optional<bool> cuda_workspace_collectives;
  bool hierarchical = true;
  // Handed to the wrapped NCCL backend (a ProcessGroupNCCL.Options in Python); may be null. Not a
  // knob of cuda_p2p's own.
  c10::intrusive_ptr<c10d::Backend::Options> nccl_options;
  int64_t max_buffer_size = WorkspaceOptions::kDefaultMaxBufferSize;
  std::string host_streams = "auto";    // auto|cooperative|threads
  std::string host_semantics = "auto";  // auto|synchronous|cuda
  // The workspace collectives (docs/collectives.md).
  std::string all_gather_algo = "auto";      // auto|direct|ring
  std::string reduce_scatter_algo = "auto";  // auto|direct|ring
  std::string all_reduce_algo = "auto";      // auto|one_shot|two_shot
  std::string all_reduce_rounds = "auto";    // auto|chunked|large
  std::optional<int64_t> ring_steps;
  std::optional<int64_t> chunk_bytes;
  std::optional<int64_t> all_reduce_one_shot_max_bytes;
  std::optional<int64_t> all_gather_ring_max_bytes;
  std::optional<int64_t> reduce_scatter_ring_max_bytes;
  std::optional<bool> cross_memory;
  std::optional<int64_t> cross_memory_min_bytes;
  std::optional<int64_t> parallel_min_bytes;
  std::string zero_copy_agreement = "auto";  // auto|exchange|signature|off
  std::optional<int64_t> symmetric_heap_size;
  std::optional<int64_t> mailbox_slot_bytes;
  std::optional<bool> inline_all_reduce;
  std::optional<int64_t> fused_min_flops;
  std::string fused_all_gather_algo = "auto";      // auto|pipeline|pull_ahead
  std::string fused_reduce_scatter_algo = "auto";  // auto|pipeline|ring
  std::optional<bool> trap_on_peer_failure;

  // Not marked override: older torch releases have no Options::clone().
  virtual c10::intrusive_ptr<c10d::Backend::Options> clone() const {
    return c10::make_intrusive<Options>(*this);
  }
};

// Where a group's workspace lives: Options.workspace_device resolved (kAuto: by the wrapped
// backends, NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp).
enum class WorkspaceDevice { kAuto, kCpu, kCuda };

struct Config;

namespace config {

// What a knob holds, which fixes how its text is parsed and rendered (NOTE [Configuration rules]).
enum class Kind : uint8_t { kBool, kBytes, kInt, kNames, kString };

// A knob's value. std::monostate: none yet - a default that depends on what only the backend or
// an op knows (the workspace's device, the world size), or a variable that is unset.
using Value = std::variant<std::monostate, bool, int64_t, std::string>;

// The Options field a knob reads (std::monostate: an environment variable only).
using Field =
    std::variant<std::monostate, bool Options::*, int64_t Options::*, std::string Options::*,
                 std::optional<bool> Options::*, std::optional<int64_t> Options::*>;

// A knob's default: a value, or a small rule over the group's context whose text is rendered
// from its values (render_default).
struct Default {
  enum class Rule : uint8_t {
    kValue,       // `value` (std::monostate: "unset")
    kByDevice,    // `value` on a host workspace (CPU tensors), `other` on a CUDA one
    kGpuVisible,  // `value` when the group has a GPU, `other` otherwise
    kTwoRanks,    // `value` on 2 ranks, `other` on any other world size
    kWorldSize,   // the world size
    kComputed,    // computed where it is used, as `text` says (the host identity)
  };
  Rule rule = Rule::kValue;
  Value value = {};
  Value other = {};
  const char* text = "";
};

// Where a knob's value came from.
enum class Source : uint8_t { kOptions, kEnvironment, kDefault };

struct Knob;

// One knob resolved for a group: its value (std::monostate for a default left to the backend or
// the op, Default), its source and that source's text.
struct Resolved {
  const Knob* knob = nullptr;
  Value value;
  Source source = Source::kDefault;
  std::string text;  // the variable's text, the Options value rendered, or the default rendered

  bool b() const { return std::get<bool>(value); }
  int64_t i() const { return std::get<int64_t>(value); }
  const std::string& s() const { return std::get<std::string>(value); }
  bool unset() const { return std::holds_alternative<std::monostate>(value); }
  // "Options.<field>", the variable's name, or "" for the default: for messages.
  std::string from() const;
  // "Options.<field> = <text>" or "<VAR>=<text>": for messages saying what turned a path off.
  std::string setting() const;
};

// What a resolved value is read back in: the world size and whether the workspace (or, without
// one, the tensors) is on the host.
struct Context {
  int world_size = 1;
  bool host = true;
};

// One row of the knob table (backend/knob_table.cpp). The rows set the fields up to `help`; knobs()
// renders `type` and `default_value` from them and appends the special rules to `help`.
struct Knob {
  std::string option = {};  // the Options field ("" for an environment variable only)
  Field field = {};
  std::string env = {};  // the environment variable ("" for an Options field only)
  Kind kind = Kind::kString;
  int64_t min = 0, max = 0, step = 1;  // numbers: the range, and a step the value is a multiple of
  std::string names = {};              // kNames: "a|b|c"; "auto" first: leaves the choice
  std::string aliases = {};            // kNames: "alias=name,..." also accepted from the variable
  bool any_case = false;               // kNames: the variable's name in any case
  Default default_rule = {};
  bool env_inverted = false;  // the variable says the opposite of the field (DISABLE_...)
  bool reported = false;      // get_collective_config reports its value (read)
  // Sets the knob's part of a Config (null: read elsewhere, e.g. LOCAL_RANK).
  void (*land)(Config&, const Resolved&) = nullptr;
  // The value the knob has in a resolved Config (null: none to read back).
  Value (*read)(const Config&, const Context&) = nullptr;
  std::string help = {};
  // Rendered by knobs():
  std::string type = {};           // the docs' column: "bool", "bytes in [0, 64 PiB]", "a|b|c"
  std::string default_value = {};  // render_default
  bool kill_switch() const;  // a plain bool field that defaults to True: either side turns it off
  std::vector<std::string> name_list() const;  // kNames: `names` split, in order
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
// Each knob lands in its fields as its row says; the rest is derived from them.
struct Config {
  bool workspace = true;             // set up the workspace
  std::string workspace_off_reason;  // why not ("" when it is set up)
  WorkspaceDevice workspace_device = WorkspaceDevice::kAuto;
  std::string workspace_device_from;     // the knob that chose it ("" for auto)
  std::string zero_copy_agreement_from;  // the knob that set collective.zero_copy_agreement
  WorkspaceOptions workspace_options;    // buffer size, timeout, host id, cross-memory reads
  int64_t max_buffer_size = 0;
  HostStreams host_streams = HostStreams::kCooperative;
  HostSemantics host_semantics = HostSemantics::kSynchronous;
  bool collectives = true;        // the collectives run on the workspace
  bool cuda_collectives = false;  // ... also on a CUDA workspace
  bool hierarchical = true;       // ... and hierarchically on a group spanning hosts
  ops::CollectiveConfig collective;
  bool cross_memory = false;            // offer cross-memory reads
  std::string cross_memory_off_reason;  // the knob that turned them off ("" when on)
  // Bytes of each rank's symmetric heap, created on the group's first cuda_p2p.empty or
  // use_symmetric_memory. Host: a sparse mapping, only the pages tensors touch cost memory.
  // CUDA: a cudaMalloc'd block, all of it committed at creation; the default is NVSHMEM's default
  // symmetric heap per GPU (NVSHMEM_SYMMETRIC_SIZE), and a too-large size fails on every rank
  // with an OutOfMemoryError naming this knob.
  int64_t symmetric_heap_size = kDefaultSymmetricHeapSize;
  static constexpr int64_t kDefaultSymmetricHeapSize = int64_t{1} << 30;
  // A message up to two slots is sent eagerly, a larger one streams through them.
  int64_t mailbox_slot_bytes = kDefaultMailboxSlotBytes;
  static constexpr int64_t kDefaultMailboxSlotBytes = int64_t{1} << 20;
  // nullopt: fused_min_flops_for(device) takes the device's default.
  std::optional<int64_t> fused_min_flops;
  // CUDA_P2P_DEBUG=INFO: one line on stderr per group at creation (python/cuda_p2p/_diagnose.py)
  // and one per fallback the first time it happens (NOTE [Debug lines] in backend/config.cpp).
  bool debug = false;
  // How a CUDA workspace makes its blocks: auto, vmm or ipc (make_cuda_device).
  std::string cuda_blocks = "auto";
  // Every knob's value and source when the group was created (config::knob_values).
  std::vector<config::KnobValue> knobs;

  // The fused ops' threshold for tensors on `device` (docs/pipelines.md, "Small ops"): the host's
  // default below which the unfused pair runs; 0 on CUDA, where the fused path always runs.
  static constexpr int64_t kDefaultHostFusedMinFlops = int64_t{8} << 30;
  int64_t fused_min_flops_for(c10::DeviceType device) const {
    if (fused_min_flops) return *fused_min_flops;
    return device == c10::DeviceType::CPU ? kDefaultHostFusedMinFlops : 0;
  }

  // NOTE [The fused ops' auto by device]
  // What a fused op's algorithm="auto" runs (above fused_min_flops, and for a reduce-scatter
  // without ring_steps, which ask for the ring): the knob's value, else the device's default.
  //  * On the host, all-gather→matmul pulls ahead and matmul→reduce-scatter runs the ring: their
  //    GEMMs run back to back on one stream and never wait behind a barrier, what matters when the
  //    cores that run the GEMMs also do the copies and are shared with the peers
  //    (docs/measurements/fused-measured-results.md).
  //  * On CUDA both run the pipeline: its two streams' GEMMs fill a GPU, its pulls use the copy
  //    engine.
  // The backend hands the choice for the op's tensors' device to the op
  // (ops::pipeline::Group::auto_all_gather, auto_reduce_scatter).
  std::optional<ops::AllGatherAlgorithm> fused_all_gather_algo;          // nullopt: by device
  std::optional<ops::ReduceScatterAlgorithm> fused_reduce_scatter_algo;  // nullopt: by device
  static constexpr auto kHostFusedAllGather = ops::AllGatherAlgorithm::kPullAhead;
  static constexpr auto kCudaFusedAllGather = ops::AllGatherAlgorithm::kPipeline;
  static constexpr auto kHostFusedReduceScatter = ops::ReduceScatterAlgorithm::kRing;
  static constexpr auto kCudaFusedReduceScatter = ops::ReduceScatterAlgorithm::kPipeline;
  ops::AllGatherAlgorithm fused_all_gather_algo_for(c10::DeviceType device) const {
    if (fused_all_gather_algo) return *fused_all_gather_algo;
    return device == c10::DeviceType::CPU ? kHostFusedAllGather : kCudaFusedAllGather;
  }
  ops::ReduceScatterAlgorithm fused_reduce_scatter_algo_for(c10::DeviceType device) const {
    if (fused_reduce_scatter_algo) return *fused_reduce_scatter_algo;
    return device == c10::DeviceType::CPU ? kHostFusedReduceScatter : kCudaFusedReduceScatter;
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

// The knob table, rendered (Knob).
const std::vector<Knob>& knobs();
// The knob whose Options field or, without one, whose variable is `name`; null if none.
const Knob* find_knob(const std::string& name);

// `value` as text, by `kind`: True/False, bytes as "32 MiB", numbers with K/M/G where exact.
std::string render(Kind kind, const Value& value);
// The knob's default as text ("64 KiB on 2 ranks, else 8 KiB").
std::string render_default(const Knob& knob);
// The knob's default where it has a value in `ctx` (what a group with nothing set reads back).
Value default_in(const Knob& knob, const Context& ctx);

// The one validator: throws a ValueError "cuda_p2p: <what> must be <the rule>, got <value>" when
// `value` is not one of the knob's values. The Options properties and the resolution both call
// it (`what`: "Options.<field>"; for a variable its name, `text` what it said).
void check(const Knob& knob, const Value& value, const std::string& what,
           const std::string& text = "");

// The Options field's value when it is set (NOTE [Configuration rules]), else nullopt.
std::optional<Value> option_value(const Knob& knob, const Options& options);

// The knob for a group with `options` and the environment, checked (check), by the precedence
// of the rules; world_size for the defaults that depend on it.
Resolved resolve(const Knob& knob, const Options& options, const EnvLookup& env, int world_size);

// Each knob's value for a group with `options`, and where it came from (KnobValue).
std::vector<KnobValue> knob_values(const Options& options,
                                   const EnvLookup& env = process_environment());

// Writes one line to stderr, whole (NOTE [Debug lines]).
void debug_line(const std::string& line);

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

// CUDA_DEVICE_MAX_CONNECTIONS as the process set it (0: unset or not a number), for
// make_cuda_device (NOTE [Hardware queues] in p2p_workspace/cuda/cuda_device.cpp).
int cuda_hardware_queues(const config::EnvLookup& env = config::process_environment());

// Resolves `options` (its timeout included) and the environment into a group's Config for
// `world_size` ranks; raises for any value outside its knob's rules.
Config resolve_config(const Options& options, int world_size,
                      const config::EnvLookup& env = config::process_environment());

}  // namespace cuda_p2p
