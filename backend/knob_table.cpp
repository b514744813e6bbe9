// The knob table: one row per knob (config.hpp, Knob), each built in a few lines by Row: its
// names, its kind with range and default, where it lands in a Config, its flags, its help. A row's
// comment says where the knob's behaviour is explained; its help is the user's text (the docs
// table, the Python docstrings). config.cpp checks, renders and resolves the rows (NOTE
// [Configuration rules] there).
#include "backend/knob_table.hpp"

#include <c10/util/StringUtil.h>

#include <string>
#include <type_traits>
#include <utility>
#include <variant>

namespace cuda_p2p::config {

namespace {

// 64 PiB, the largest address space of an x86-64 process (5-level paging): a sanity bound, not
// a policy (a size above what a rank can map fails when it is allocated, naming the knob).
constexpr int64_t kMaxBytes = int64_t{1} << 56;
constexpr int64_t kMaxRingSteps = int64_t{1} << 20;
constexpr int64_t kMaxFlops = int64_t{1} << 60;
constexpr int64_t kMaxLocalRank = 999999999;  // nine digits (choose_cuda_device)

Value word(const char* n) { return std::string(n); }

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
// A names knob that lands in an enum field through `Parse` and reads back as ops::to_string says.
template <auto Parse, auto... Path>
void store_choice(Config& c, const Resolved& r) {
  (c.*....*Path) = Parse(r.s(), r.from());
}
template <auto Parse, auto... Path>
Value load_choice(const Config& c, const Context&) {
  return std::string(ops::to_string((c.*....*Path)));
}

// A names knob whose "auto" leaves an optional field unset, for the device to decide where the
// value is used, and whose other names land through `Parse`; it reads back as the group's device
// resolves it (`For`), and its documented default is the two devices' (by_device).
template <typename Algorithm>
Default by_device(Algorithm host, Algorithm cuda) {
  return {.rule = Default::Rule::kByDevice,
          .value = word(ops::to_string(host)),
          .other = word(ops::to_string(cuda))};
}
template <auto Parse, auto Field>
void store_unless_auto(Config& c, const Resolved& r) {
  (c.*Field).reset();
  if (!r.unset() && r.s() != "auto") c.*Field = Parse(r.s());
}
template <auto For>
Value load_for_device(const Config& c, const Context& ctx) {
  return word(ops::to_string((c.*For)(ctx.host ? c10::DeviceType::CPU : c10::DeviceType::CUDA)));
}
// The fused ops' algorithms by name (the knob's table has checked the name).
ops::AllGatherAlgorithm fused_all_gather(const std::string& name) {
  return name == "pull_ahead" ? ops::AllGatherAlgorithm::kPullAhead
                              : ops::AllGatherAlgorithm::kPipeline;
}
ops::ReduceScatterAlgorithm fused_reduce_scatter(const std::string& name) {
  return name == "ring" ? ops::ReduceScatterAlgorithm::kRing
                        : ops::ReduceScatterAlgorithm::kPipeline;
}

// One row, built in order: Row(option, field[, env]) or Row::variable(env), then the kind
// (flag, bytes, number, names, text) with its range and default, the flags (aliases, inverted,
// reported), where it lands (at, choice, lands), and last the help, which gives the Knob.
class Row {
 public:
  Row(const char* option, Field field, const char* env = "") {
    k_.option = option;
    k_.field = field;
    k_.env = env;
  }
  static Row variable(const char* env) { return Row("", {}, env); }

  Row&& flag(bool value) && { return kind(Kind::kBool, {.value = value}); }
  Row&& bytes(int64_t min, int64_t max, Default d, int64_t step = 1) && {
    k_.min = min;
    k_.max = max;
    k_.step = step;
    return kind(Kind::kBytes, std::move(d));
  }
  Row&& bytes(int64_t min, int64_t max, int64_t value, int64_t step = 1) && {
    return std::move(*this).bytes(min, max, Default{.value = value}, step);
  }
  Row&& number(int64_t min, int64_t max, Default d) && {
    k_.min = min;
    k_.max = max;
    return kind(Kind::kInt, std::move(d));
  }
  Row&& names(const char* names, Default d) && {
    k_.names = names;
    return kind(Kind::kNames, std::move(d));
  }
  Row&& names(const char* names, Value value) && {
    return std::move(*this).names(names, Default{.value = std::move(value)});
  }
  Row&& text(Default d) && { return kind(Kind::kString, std::move(d)); }

  // Other spellings the variable takes ("alias=name,..."), and whether in any case.
  Row&& aliases(const char* aliases, bool any_case) && {
    k_.aliases = aliases;
    k_.any_case = any_case;
    return std::move(*this);
  }
  Row&& inverted() && {
    k_.env_inverted = true;
    return std::move(*this);
  }
  Row&& reported() && {
    k_.reported = true;
    return std::move(*this);
  }

  template <auto... Path>
  Row&& at() && {
    return std::move(*this).lands(store<Path...>, load<Path...>);
  }
  template <auto Parse, auto... Path>
  Row&& choice() && {
    return std::move(*this).lands(store_choice<Parse, Path...>, load_choice<Parse, Path...>);
  }
  Row&& lands(void (*land)(Config&, const Resolved&),
              Value (*read)(const Config&, const Context&)) && {
    k_.land = land;
    k_.read = read;
    return std::move(*this);
  }

  Knob help(std::string help) && {
    k_.help = std::move(help);
    return std::move(k_);
  }

 private:
  Row&& kind(Kind kind, Default d) {
    k_.kind = kind;
    k_.default_rule = std::move(d);
    return std::move(*this);
  }

  Knob k_;
};

}  // namespace

std::vector<Knob> knob_rows() {
  using R = Default::Rule;
  using CC = ops::CollectiveConfig;
  std::vector<Knob> k;
  // --- the workspace and what runs on it ---
  k.push_back(Row("enable_workspace", &Options::enable_workspace, "CUDA_P2P_DISABLE_WORKSPACE")
                  .flag(true)
                  .inverted()
                  .lands(
                      [](Config& c, const Resolved& r) {
                        c.workspace = r.b();
                        if (!c.workspace) c.workspace_off_reason = "disabled by " + r.setting();
                      },
                      [](const Config& c, const Context&) -> Value { return c.workspace; })
                  .help("Set up the P2P workspace."));
  // NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp; the GPU: NOTE [The
  // workspace's GPU] in config.cpp.
  k.push_back(
      Row("workspace_device", &Options::workspace_device, "CUDA_P2P_WORKSPACE_DEVICE")
          .names("auto|cpu|cuda",
                 Default{.rule = R::kGpuVisible, .value = word("cuda"), .other = word("cpu")})
          .lands(
              [](Config& c, const Resolved& r) {
                if (r.unset()) return;  // kAuto: the backend decides
                c.workspace_device =
                    r.s() == "cpu" ? WorkspaceDevice::kCpu : WorkspaceDevice::kCuda;
                c.workspace_device_from = r.from();
              },
              [](const Config& c, const Context& ctx) -> Value {
                if (c.workspace_device == WorkspaceDevice::kAuto)
                  return word(ctx.host ? "cpu" : "cuda");
                return word(c.workspace_device == WorkspaceDevice::kCpu ? "cpu" : "cuda");
              })
          .help("Where the workspace lives: cuda (a GPU, chosen as LOCAL_RANK says; the "
                "group must wrap NCCL) or cpu (host shared memory). One workspace per "
                "group: CPU tensors on a CUDA workspace, and CUDA tensors on a CPU one, go "
                "to the wrapped backend (Gloo, NCCL)."));
  k.push_back(Row("buffer_size", &Options::buffer_size)
                  .bytes(1, kMaxBytes, WorkspaceOptions::kDefaultBufferSize)
                  .at<&Config::workspace_options, &WorkspaceOptions::buffer_size>()
                  .help("Bytes of the symmetric buffer each rank shares with its peers."));
  // Rounds: ops/pipeline_common.hpp, plan_rounds.
  k.push_back(Row("max_buffer_size", &Options::max_buffer_size)
                  .bytes(1, kMaxBytes, WorkspaceOptions::kDefaultMaxBufferSize)
                  .at<&Config::max_buffer_size>()
                  .help("The largest buffer an op may grow the workspace to on its own; larger "
                        "payloads are processed in rounds."));
  k.push_back(Row("workspace_collectives", &Options::workspace_collectives,
                  "CUDA_P2P_WORKSPACE_COLLECTIVES")
                  .flag(true)
                  .at<&Config::collectives>()
                  .help("Run the collectives on the workspace; off, they go to the wrapped backend "
                        "while the workspace stays up for the fused ops."));
  // NOTE [CUDA collectives are opt-in] in backend/ProcessGroupCudaP2P.cpp.
  k.push_back(Row("cuda_workspace_collectives", &Options::cuda_workspace_collectives,
                  "CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES")
                  .flag(false)
                  .reported()
                  .at<&Config::cuda_collectives>()
                  .help("Run the collectives on CUDA tensors on the CUDA workspace; off, they go "
                        "to NCCL. CPU tensors and the fused ops are not affected."));
  // backend/hierarchical.hpp.
  k.push_back(Row("hierarchical", &Options::hierarchical, "CUDA_P2P_HIERARCHICAL")
                  .flag(true)
                  .at<&Config::hierarchical>()
                  .help("On a group whose ranks span hosts, run the collectives on CPU tensors "
                        "hierarchically: intra-host on each host's workspace, inter-host on the "
                        "wrapped backend."));
  // NOTE [Cooperative host streams] in p2p_workspace/host/host_stream.cpp.
  k.push_back(
      Row("host_streams", &Options::host_streams, "CUDA_P2P_HOST_STREAMS")
          .names("auto|cooperative|threads", word("cooperative"))
          .lands([](Config& c,
                    const Resolved& r) { c.host_streams = parse_host_streams(r.s(), r.from()); },
                 [](const Config& c, const Context&) -> Value {
                   return word(c.host_streams == HostStreams::kThreads ? "threads" : "cooperative");
                 })
          .help("How a host workspace runs the fused pipelines' two streams: cooperative "
                "(in the waiting thread) or threads (a thread per stream, the GPU's "
                "concurrency)."));
  // NOTE [Host device with CUDA's semantics] in p2p_workspace/host/host_device.hpp.
  k.push_back(
      Row("host_semantics", &Options::host_semantics, "CUDA_P2P_HOST_SEMANTICS")
          .names("auto|synchronous|cuda", word("synchronous"))
          .lands(
              [](Config& c, const Resolved& r) {
                c.host_semantics = parse_host_semantics(r.s(), r.from());
              },
              [](const Config& c, const Context&) -> Value {
                return word(c.host_semantics == HostSemantics::kCuda ? "cuda" : "synchronous");
              })
          .help("How a host workspace's ops behave: synchronous (complete when they return) or "
                "cuda (queued on the caller's stream as on a GPU, waits released rather than "
                "raised: tests the GPU's protocol on the CPU)."));
  // --- the workspace collectives (docs/collectives.md) ---
  k.push_back(Row("all_gather_algo", &Options::all_gather_algo, "CUDA_P2P_ALL_GATHER_ALGO")
                  .names("auto|direct|ring", word("auto"))
                  .reported()
                  .choice<ops::parse_all_gather_algo, &Config::collective, &CC::all_gather>()
                  .help("Workspace all-gather algorithm (auto: by size)."));
  k.push_back(
      Row("reduce_scatter_algo", &Options::reduce_scatter_algo, "CUDA_P2P_REDUCE_SCATTER_ALGO")
          .names("auto|direct|ring", word("auto"))
          .reported()
          .choice<ops::parse_reduce_scatter_algo, &Config::collective, &CC::reduce_scatter>()
          .help("Workspace reduce-scatter algorithm (auto: by size)."));
  k.push_back(Row("all_reduce_algo", &Options::all_reduce_algo, "CUDA_P2P_ALL_REDUCE_ALGO")
                  .names("auto|one_shot|two_shot", word("auto"))
                  .reported()
                  .choice<ops::parse_all_reduce_algo, &Config::collective, &CC::all_reduce>()
                  .help("Workspace all-reduce algorithm (auto: by size)."));
  // 0 is the world size (CollectiveConfig::ring_steps); a multiple of it: ops::validate.
  k.push_back(Row("ring_steps", &Options::ring_steps, "CUDA_P2P_RING_STEPS")
                  .number(0, kMaxRingSteps, Default{.rule = R::kWorldSize})
                  .reported()
                  .lands(
                      [](Config& c, const Resolved& r) {
                        c.collective.ring_steps = r.unset() ? 0 : static_cast<int>(r.i());
                      },
                      [](const Config& c, const Context& ctx) -> Value {
                        return int64_t{c.collective.ring_steps == 0 ? ctx.world_size
                                                                    : c.collective.ring_steps};
                      })
                  .help("Steps of the reduce-scatter ring, a positive multiple of the world size "
                        "(0: the world size)."));
  k.push_back(Row("chunk_bytes", &Options::chunk_bytes, "CUDA_P2P_CHUNK_BYTES")
                  .bytes(0, kMaxBytes, CC::kDefaultChunkBytes)
                  .reported()
                  .at<&Config::collective, &CC::chunk_bytes>()
                  .help("Bytes a rank stages per round of a workspace collective (0: half the "
                        "buffer)."));
  // NOTE [Rounds chosen by rank 0] in ops/all_reduce.cpp.
  k.push_back(
      Row("all_reduce_rounds", &Options::all_reduce_rounds, "CUDA_P2P_ALL_REDUCE_ROUNDS")
          .names("auto|chunked|large", word("auto"))
          .reported()
          .choice<ops::parse_all_reduce_rounds, &Config::collective, &CC::all_reduce_rounds>()
          .help("Rounds of a two-shot all-reduce of more than one chunk_bytes round on a host "
                "workspace: auto lets rank 0 choose, one op ahead, from the times of its recent "
                "ops, between chunk_bytes rounds and the largest the buffer holds; large makes it "
                "choose the latter (from the second op of each size class); chunked keeps "
                "chunk_bytes. Equal on every rank (auto and large may mix)."));
  // The thresholds of the choice by size: CollectiveConfig.
  k.push_back(Row("all_reduce_one_shot_max_bytes", &Options::all_reduce_one_shot_max_bytes)
                  .bytes(0, kMaxBytes,
                         Default{.rule = R::kTwoRanks,
                                 .value = CC::kDefaultTwoRankAllReduceOneShotMaxBytes,
                                 .other = CC::kDefaultAllReduceOneShotMaxBytes})
                  .reported()
                  .at<&Config::collective, &CC::all_reduce_one_shot_max_bytes>()
                  .help("Largest all-reduce that auto runs one-shot."));
  // NOTE [Inline one-shot] in ops/all_reduce.cpp.
  k.push_back(Row("inline_all_reduce", &Options::inline_all_reduce, "CUDA_P2P_INLINE_ALL_REDUCE")
                  .flag(true)
                  .reported()
                  .at<&Config::collective, &CC::inline_all_reduce>()
                  .help("On a host workspace, run a one-shot all-reduce that fits one round on the "
                        "calling thread without enqueueing (the same protocol; off: the generic "
                        "path, for comparison)."));
  k.push_back(Row("all_gather_ring_max_bytes", &Options::all_gather_ring_max_bytes)
                  .bytes(0, kMaxBytes, CC::kDefaultAllGatherRingMaxBytes)
                  .reported()
                  .at<&Config::collective, &CC::all_gather_ring_max_bytes>()
                  .help("Largest all-gather output that auto runs as a ring on 3+ ranks."));
  k.push_back(Row("reduce_scatter_ring_max_bytes", &Options::reduce_scatter_ring_max_bytes)
                  .bytes(0, kMaxBytes, CC::kDefaultReduceScatterRingMaxBytes)
                  .reported()
                  .at<&Config::collective, &CC::reduce_scatter_ring_max_bytes>()
                  .help("Largest reduce-scatter input that auto runs as a ring."));
  // NOTE [Cross-memory reads] in ops/collectives.cpp: off unless asked for (why:
  // docs/collectives.md, "Cross-memory reads"). The workspace still probes whether the system
  // allows them.
  k.push_back(
      Row("cross_memory", &Options::cross_memory, "CUDA_P2P_CROSS_MEMORY")
          .flag(false)
          .lands(
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
              [](const Config& c, const Context&) -> Value { return c.cross_memory; })
          .help("Cross-memory reads of peers' tensors on the host (process_vm_readv), where "
                "the system allows them."));
  k.push_back(Row("cross_memory_min_bytes", &Options::cross_memory_min_bytes)
                  .bytes(0, kMaxBytes, CC::kDefaultCrossMemoryMinBytes)
                  .reported()
                  .at<&Config::collective, &CC::cross_memory_min_bytes>()
                  .help("Smallest payload that cross-memory reads take, when they are on."));
  // NOTE [Intra-op threads] in ops/collectives.cpp.
  k.push_back(Row("parallel_min_bytes", &Options::parallel_min_bytes, "CUDA_P2P_PARALLEL_MIN_BYTES")
                  .bytes(0, kMaxBytes, CC::kDefaultParallelMinBytes)
                  .reported()
                  .at<&Config::collective, &CC::parallel_min_bytes>()
                  .help("On the host, copies and reductions of a workspace collective of at least "
                        "this many bytes are split across the rank's intra-op threads "
                        "(torch.get_num_threads()) when it has two or more; 0: never. One thread "
                        "per rank (the default) never splits."));
  // NOTE [Symmetric heap] in p2p_workspace/symmetric_heap.cpp.
  k.push_back(
      Row("symmetric_heap_size", &Options::symmetric_heap_size, "CUDA_P2P_SYMMETRIC_HEAP_SIZE")
          .bytes(1, kMaxBytes, Config::kDefaultSymmetricHeapSize)
          .at<&Config::symmetric_heap_size>()
          .help("Bytes of each rank's symmetric heap (cuda_p2p.empty, "
                "use_symmetric_memory), created on first use; host: a sparse mapping "
                "(touched pages cost memory); CUDA: committed device memory, all of it at "
                "creation. It does not grow."));
  // NOTE [Mailboxes] in p2p_workspace/messages/mailboxes.cpp: whole pages.
  k.push_back(
      Row("mailbox_slot_bytes", &Options::mailbox_slot_bytes, "CUDA_P2P_MAILBOX_SLOT_BYTES")
          .bytes(4 * kKiB, 256 * kMiB, Config::kDefaultMailboxSlotBytes, 4 * kKiB)
          .reported()
          .at<&Config::mailbox_slot_bytes>()
          .help("Bytes of each slot of the send/recv mailboxes on a host workspace (two per "
                "pair of ranks, in the sender's memory): a message up to two slots is sent "
                "eagerly, a larger one streams through them."));
  // NOTE [Zero-copy collectives] in ops/zero_copy.cpp; CUDA's default: NOTE [CUDA zero-copy is
  // opt-in] in ops/common.hpp (ops::resolve_agreement).
  k.push_back(
      Row("zero_copy_agreement", &Options::zero_copy_agreement, "CUDA_P2P_ZERO_COPY_AGREEMENT")
          .names("auto|exchange|signature|off",
                 Default{.rule = R::kByDevice, .value = word("exchange"), .other = word("off")})
          .reported()
          .lands(
              [](Config& c, const Resolved& r) {
                if (r.unset()) return;  // kAuto: by the workspace's device
                c.collective.zero_copy_agreement = ops::parse_zero_copy_agreement(r.s(), r.from());
                c.zero_copy_agreement_from = r.from();
              },
              [](const Config& c, const Context& ctx) -> Value {
                return word(ops::to_string(
                    ops::resolve_agreement(c.collective.zero_copy_agreement, ctx.host)));
              })
          .help("How the ranks agree that a collective's inputs are symmetric tensors. exchange "
                "(host only): each rank publishes its inputs' heap offsets, which may differ; if "
                "any input is not in its heap, all stage (one barrier more for a group with a "
                "heap). signature: each rank states its offsets in the op signature, assuming its "
                "peers allocated alike; a group with a heap pays nothing for ordinary inputs, and "
                "ranks whose tensors differ raise a signature mismatch. off: symmetric inputs "
                "stage like any other. CUDA's default stays off until signature has been "
                "validated on GPUs."));
  // NOTE [Who traps] in p2p_workspace/flag_barrier_body.hpp.
  k.push_back(
      Row("trap_on_peer_failure", &Options::trap_on_peer_failure, "CUDA_P2P_TRAP_ON_PEER_FAILURE")
          .flag(false)
          .reported()
          .at<&Config::workspace_options, &WorkspaceOptions::trap_on_peer_failure>()
          .help("A CUDA workspace's kernels (captured collectives, replayed waits) trap "
                "when a peer's failure reaches them, losing this process's CUDA context, "
                "for jobs that prefer to die fast under an elastic launcher; off: they end "
                "quietly and the next cuda_p2p call or cuda_p2p.check(group) raises."));
  // NOTE [Unfused below a size] in backend/dispatcher_fused_ops.cpp.
  k.push_back(Row("fused_min_flops", &Options::fused_min_flops, "CUDA_P2P_FUSED_MIN_FLOPS")
                  .number(0, kMaxFlops,
                          Default{.rule = R::kByDevice,
                                  .value = Config::kDefaultHostFusedMinFlops,
                                  .other = int64_t{0}})
                  .reported()
                  .lands(
                      [](Config& c, const Resolved& r) {
                        if (!r.unset()) c.fused_min_flops = r.i();
                      },
                      [](const Config& c, const Context& ctx) -> Value {
                        return c.fused_min_flops_for(ctx.host ? c10::DeviceType::CPU
                                                              : c10::DeviceType::CUDA);
                      })
                  .help("The fused ops' \"auto\" runs the fused pipeline from this many GEMM flops "
                        "per rank (2*M*N*K) on; below, the unfused workspace collective and matmul "
                        "(K, M, G: 1024-based)."));
  // NOTE [The fused ops' auto by device] in backend/config.hpp.
  k.push_back(Row("fused_all_gather_algo", &Options::fused_all_gather_algo,
                  "CUDA_P2P_FUSED_ALL_GATHER_ALGO")
                  .names("auto|pipeline|pull_ahead",
                         by_device(Config::kHostFusedAllGather, Config::kCudaFusedAllGather))
                  .reported()
                  .lands(store_unless_auto<fused_all_gather, &Config::fused_all_gather_algo>,
                         load_for_device<&Config::fused_all_gather_algo_for>)
                  .help("What the fused all-gather→matmul's algorithm=\"auto\" runs above "
                        "fused_min_flops."));
  k.push_back(
      Row("fused_reduce_scatter_algo", &Options::fused_reduce_scatter_algo,
          "CUDA_P2P_FUSED_REDUCE_SCATTER_ALGO")
          .names("auto|pipeline|ring",
                 by_device(Config::kHostFusedReduceScatter, Config::kCudaFusedReduceScatter))
          .reported()
          .lands(store_unless_auto<fused_reduce_scatter, &Config::fused_reduce_scatter_algo>,
                 load_for_device<&Config::fused_reduce_scatter_algo_for>)
          .help("What the fused matmul→reduce-scatter's algorithm=\"auto\" runs (plain and "
                "scaled) above fused_min_flops and without ring_steps (which ask for the ring)."));
  // --- environment variables only ---
  // NOTE [Debug lines] in config.cpp.
  k.push_back(Row::variable("CUDA_P2P_DEBUG")
                  .names("off|info", word("off"))
                  .aliases("0=off", true)
                  .lands([](Config& c, const Resolved& r) { c.debug = r.s() == "info"; },
                         [](const Config& c, const Context&) -> Value {
                           return word(c.debug ? "info" : "off");
                         })
                  .help("INFO: one line on stderr per group at its creation (the workspace, its "
                        "device, the collectives' path, each knob that is not at its default) and "
                        "one per fallback to the wrapped backend the first time it happens on the "
                        "group (python -m cuda_p2p reports the same facts)."));
  k.push_back(Row::variable("CUDA_P2P_HOST_ID")
                  .text(Default{.rule = R::kComputed, .text = "hostname/boot id"})
                  .lands(
                      [](Config& c, const Resolved& r) {
                        if (!r.unset()) c.workspace_options.host_id = r.s();
                      },
                      [](const Config& c, const Context&) -> Value {
                        if (c.workspace_options.host_id.empty()) return std::monostate{};
                        return c.workspace_options.host_id;
                      })
                  .help("This process's host identity; ranks with different identities do not "
                        "share a workspace (tests simulate several hosts with it)."));
  k.push_back(Row::variable("CUDA_P2P_TEST_DENY_CROSS_MEMORY")
                  .flag(false)
                  .at<&Config::workspace_options, &WorkspaceOptions::deny_cross_memory_reads>()
                  .help("Test hook: this process's cross-memory reads fail as under Yama "
                        "ptrace_scope (EPERM)."));
  // Read by choose_cuda_device (NOTE [The workspace's GPU] in config.cpp), only for a CUDA
  // workspace.
  k.push_back(Row::variable(kLocalRankEnv)
                  .number(0, kMaxLocalRank, Default{})
                  .help("This process's rank on its host (torchrun sets it). A CUDA workspace goes "
                        "on the device bound by init_process_group(device_id=...), else on the "
                        "current GPU if torch.cuda.set_device chose one other than cuda:0, else on "
                        "GPU LOCAL_RANK mod the visible GPUs, else on cuda:0."));
  // Read by cuda_hardware_queues (NOTE [Hardware queues] in p2p_workspace/cuda/cuda_device.cpp),
  // only for a CUDA workspace.
  k.push_back(Row::variable(kCudaMaxConnectionsEnv)
                  .number(1, 32, Default{})
                  .help("CUDA's own variable: how many hardware queues the process's CUDA streams "
                        "share (the driver's default: 8). Below 4 a CUDA workspace waits with its "
                        "wait kernel instead of stream memory operations, since a released wait "
                        "could queue behind itself."));
  // NOTE [Blocks that outlive their exporter] in p2p_workspace/cuda/vmm_blocks.cpp.
  k.push_back(
      Row::variable("CUDA_P2P_CUDA_BLOCKS")
          .names("auto|vmm|ipc", word("auto"))
          .lands([](Config& c, const Resolved& r) { c.cuda_blocks = r.unset() ? "auto" : r.s(); },
                 [](const Config& c, const Context&) -> Value { return c.cuda_blocks; })
          .help("How a CUDA workspace makes its blocks: vmm (cuMem allocations shared as "
                "file descriptors: a dead rank's block stays valid for the survivors), "
                "ipc (legacy cudaMalloc and CUDA IPC), auto (vmm where the driver and the "
                "GPU offer it). The same on every rank."));

  return k;
}

}  // namespace cuda_p2p::config
