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

#include "backend/knob_table.hpp"

namespace cuda_p2p {

// NOTE [Configuration rules]
// Every knob is read here and nowhere else, by the rules in config.hpp, so that a typo is an
// error naming the knob rather than a silently different algorithm. Each knob is one row of the
// table (knob_rows() in knob_table.cpp, which knobs() below checks and renders), and everything
// else about it is derived from that row: the docs table (docs/configuration.md, compared with
// knobs() by tests/python/clients/test_config.py), the resolution, the source reported per knob,
// the Python Options properties with their validation, and the values get_collective_config
// reports. So the text of a default is rendered from its value (render_default), never typed beside
// it, and the Options properties refuse exactly what the resolution refuses, with the same message
// (both call check()); tests/cpp/test_config.cpp checks both for every knob, and that each rendered
// default is what a group with nothing set reads back. The lower layers (ops, p2p_workspace)
// receive the resolved values as plain fields (CollectiveConfig, WorkspaceOptions, HostStreams):
// they never read the environment.

namespace config {

namespace {

std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  return s;
}

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
    auto table = knob_rows();
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
