// The configuration rules (backend/config.hpp, NOTE [Configuration rules]): parsing, precedence
// of Options over the environment over the defaults, and the knob table. Single process.
#include <map>
#include <set>
#include <type_traits>

#include "backend/config.hpp"
#include "tests/cpp/harness.hpp"

namespace cuda_p2p::test {
namespace {

config::EnvLookup fake_env(std::map<std::string, std::string> vars) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end() || it->second.empty()) return std::nullopt;
    return it->second;
  };
}

Config resolve(const Options& o, std::map<std::string, std::string> vars, int world = 4) {
  return resolve_config(o, world, fake_env(std::move(vars)));
}

TEST(Config, BooleansFollowOneRule) {
  for (const char* t : {"1", "true", "TRUE", "yes", "On"}) EXPECT_TRUE(config::parse_bool(t, "x"));
  for (const char* f : {"0", "false", "No", "off"}) EXPECT_FALSE(config::parse_bool(f, "x"));
  expect_error([] { config::parse_bool("2", "CUDA_P2P_X"); },
               "CUDA_P2P_X must be a boolean (1/0, true/false, yes/no, on/off), got '2'");
}

TEST(Config, NumbersFollowOneRule) {
  EXPECT_EQ(config::parse_int("4096", "x", 0, 1 << 30), 4096);
  EXPECT_EQ(config::parse_int("64K", "x", 0, 1 << 30), 64 << 10);
  EXPECT_EQ(config::parse_int("2MiB", "x", 0, 1 << 30), 2 << 20);
  EXPECT_EQ(config::parse_int("1g", "x", 0, int64_t{1} << 40), int64_t{1} << 30);
  expect_error([] { config::parse_int("lots", "CUDA_P2P_Y", 0, 10); },
               "CUDA_P2P_Y must be an integer, optionally with a suffix K, M or G");
  expect_error([] { config::parse_int("12x", "CUDA_P2P_Y", 0, 100); }, "got '12x'");
  expect_error([] { config::parse_int("-1", "CUDA_P2P_Y", 0, 10); }, "must be in [0, 10], got -1");
  expect_error([] { config::parse_int("99999999999G", "CUDA_P2P_Y", 0, 10); },
               "must be an integer");
}

TEST(Config, DefaultsWithNothingSet) {
  const Config c = resolve(Options(), {});
  EXPECT_TRUE(c.workspace);
  EXPECT_EQ(c.workspace_options.buffer_size, WorkspaceOptions::kDefaultBufferSize);
  EXPECT_EQ(c.host_streams, HostStreams::kCooperative);
  EXPECT_TRUE(c.collectives);
  EXPECT_FALSE(c.cuda_collectives);
  EXPECT_FALSE(c.cross_memory);
  EXPECT_NE(c.cross_memory_off_reason.find("off by default"), std::string::npos);
  EXPECT_EQ(c.collective.all_reduce, ops::AllReduceAlgo::kAuto);
  EXPECT_EQ(c.collective.chunk_bytes, ops::CollectiveConfig::kDefaultChunkBytes);
  EXPECT_TRUE(c.workspace_options.host_id.empty());
  EXPECT_EQ(c.workspace_device, WorkspaceDevice::kAuto);
  EXPECT_EQ(c.workspace_device_from, "");
  EXPECT_EQ(c.mailbox_slot_bytes, Config::kDefaultMailboxSlotBytes);
}

TEST(Config, OptionsWinOverTheEnvironmentWhichWinsOverDefaults) {
  Options o;
  o.all_reduce_algo = "two_shot";
  o.cuda_workspace_collectives = false;
  o.chunk_bytes = 4096;
  const Config c = resolve(o, {{"CUDA_P2P_ALL_REDUCE_ALGO", "one_shot"},
                               {"CUDA_P2P_ALL_GATHER_ALGO", "ring"},
                               {"CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES", "1"},
                               {"CUDA_P2P_CHUNK_BYTES", "1M"},
                               {"CUDA_P2P_RING_STEPS", "8"},
                               {"CUDA_P2P_HOST_STREAMS", "threads"},
                               {"CUDA_P2P_HOST_ID", "host-a"},
                               {"CUDA_P2P_CROSS_MEMORY", "on"}});
  EXPECT_EQ(c.collective.all_reduce, ops::AllReduceAlgo::kTwoShot);  // option
  EXPECT_EQ(c.collective.all_gather, ops::AllGatherAlgo::kRing);     // environment over auto
  EXPECT_FALSE(c.cuda_collectives);                                  // option
  EXPECT_EQ(c.collective.chunk_bytes, 4096);                         // option
  EXPECT_EQ(c.collective.ring_steps, 8);                             // environment
  EXPECT_EQ(c.host_streams, HostStreams::kThreads);                  // environment
  EXPECT_EQ(c.workspace_options.host_id, "host-a");
  EXPECT_TRUE(c.cross_memory);
  EXPECT_TRUE(c.workspace_options.cross_memory_reads);
  Options threads;
  threads.host_streams = "cooperative";
  EXPECT_EQ(resolve(threads, {{"CUDA_P2P_HOST_STREAMS", "threads"}}).host_streams,
            HostStreams::kCooperative);
  EXPECT_TRUE(
      resolve(Options(), {{"CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES", "yes"}}).cuda_collectives);
}

TEST(Config, TheWorkspaceDeviceComesFromTheOptionThenTheEnvironment) {
  const Config env = resolve(Options(), {{"CUDA_P2P_WORKSPACE_DEVICE", "cpu"}});
  EXPECT_EQ(env.workspace_device, WorkspaceDevice::kCpu);
  EXPECT_EQ(env.workspace_device_from, "CUDA_P2P_WORKSPACE_DEVICE");
  Options cuda;
  cuda.workspace_device = "cuda";
  const Config opt = resolve(cuda, {{"CUDA_P2P_WORKSPACE_DEVICE", "cpu"}});
  EXPECT_EQ(opt.workspace_device, WorkspaceDevice::kCuda);
  EXPECT_EQ(opt.workspace_device_from, "Options.workspace_device");
  EXPECT_EQ(resolve(Options(), {{"CUDA_P2P_WORKSPACE_DEVICE", "auto"}}).workspace_device,
            WorkspaceDevice::kAuto);
  expect_error([] { resolve(Options(), {{"CUDA_P2P_WORKSPACE_DEVICE", "gpu"}}); },
               "CUDA_P2P_WORKSPACE_DEVICE must be one of auto|cpu|cuda, got 'gpu'");
  Options upper;
  upper.workspace_device = "CPU";
  expect_error([&] { resolve(upper, {}); },
               "Options.workspace_device must be one of auto|cpu|cuda, got 'CPU'");
}

TEST(Config, TheZeroCopyAgreementComesFromTheOptionThenTheEnvironment) {
  EXPECT_EQ(resolve(Options(), {}).collective.zero_copy_agreement, ops::ZeroCopyAgreement::kAuto);
  const Config env = resolve(Options(), {{"CUDA_P2P_ZERO_COPY_AGREEMENT", "signature"}});
  EXPECT_EQ(env.collective.zero_copy_agreement, ops::ZeroCopyAgreement::kSignature);
  EXPECT_EQ(env.zero_copy_agreement_from, "CUDA_P2P_ZERO_COPY_AGREEMENT");
  Options exchange;
  exchange.zero_copy_agreement = "exchange";
  const Config opt = resolve(exchange, {{"CUDA_P2P_ZERO_COPY_AGREEMENT", "signature"}});
  EXPECT_EQ(opt.collective.zero_copy_agreement, ops::ZeroCopyAgreement::kExchange);
  EXPECT_EQ(opt.zero_copy_agreement_from, "Options.zero_copy_agreement");
  expect_error([] { resolve(Options(), {{"CUDA_P2P_ZERO_COPY_AGREEMENT", "headers"}}); },
               "CUDA_P2P_ZERO_COPY_AGREEMENT must be one of auto|exchange|signature|off, got "
               "'headers'");
  Options off;
  off.zero_copy_agreement = "off";
  EXPECT_EQ(resolve(off, {}).collective.zero_copy_agreement, ops::ZeroCopyAgreement::kOff);
  // The text a signature carries: nothing for the device's default.
  EXPECT_EQ(ops::agreement_text(ops::ZeroCopyAgreement::kAuto, true), "");
  EXPECT_EQ(ops::agreement_text(ops::ZeroCopyAgreement::kExchange, true), "");
  // CUDA's default is off until validated (NOTE [CUDA zero-copy is opt-in]): signature is named.
  EXPECT_EQ(ops::agreement_text(ops::ZeroCopyAgreement::kOff, false), "");
  EXPECT_EQ(ops::agreement_text(ops::ZeroCopyAgreement::kAuto, false), "");
  EXPECT_EQ(ops::agreement_text(ops::ZeroCopyAgreement::kSignature, false),
            "zero_copy_agreement signature");
  EXPECT_EQ(ops::agreement_text(ops::ZeroCopyAgreement::kSignature, true),
            "zero_copy_agreement signature");
  EXPECT_EQ(ops::agreement_text(ops::ZeroCopyAgreement::kOff, true), "zero_copy_agreement off");
  EXPECT_EQ(ops::resolve_agreement(ops::ZeroCopyAgreement::kAuto, false),
            ops::ZeroCopyAgreement::kOff);
}

TEST(Config, KillSwitchesTurnOffFromEitherSide) {
  Options off;
  off.enable_workspace = false;
  EXPECT_FALSE(resolve(off, {}).workspace);
  EXPECT_NE(resolve(off, {}).workspace_off_reason.find("Options.enable_workspace"),
            std::string::npos);
  const Config env_off = resolve(Options(), {{"CUDA_P2P_DISABLE_WORKSPACE", "true"}});
  EXPECT_FALSE(env_off.workspace);
  EXPECT_NE(env_off.workspace_off_reason.find("CUDA_P2P_DISABLE_WORKSPACE"), std::string::npos);
  EXPECT_TRUE(resolve(Options(), {{"CUDA_P2P_DISABLE_WORKSPACE", "0"}}).workspace);
  EXPECT_FALSE(resolve(Options(), {{"CUDA_P2P_WORKSPACE_COLLECTIVES", "off"}}).collectives);
  Options coll_off;
  coll_off.workspace_collectives = false;
  EXPECT_FALSE(resolve(coll_off, {{"CUDA_P2P_WORKSPACE_COLLECTIVES", "1"}}).collectives);
}

TEST(Config, BadValuesAreErrorsNamingTheKnob) {
  expect_error([] { resolve(Options(), {{"CUDA_P2P_DISABLE_WORKSPACE", "please"}}); },
               "CUDA_P2P_DISABLE_WORKSPACE must be a boolean");
  expect_error([] { resolve(Options(), {{"CUDA_P2P_ALL_REDUCE_ALGO", "fastest"}}); },
               "CUDA_P2P_ALL_REDUCE_ALGO must be one of auto|one_shot|two_shot, got 'fastest'");
  expect_error([] { resolve(Options(), {{"CUDA_P2P_HOST_STREAMS", "sometimes"}}); },
               "CUDA_P2P_HOST_STREAMS must be one of auto|cooperative|threads, got 'sometimes'");
  expect_error([] { resolve(Options(), {{"CUDA_P2P_CHUNK_BYTES", "lots"}}); },
               "CUDA_P2P_CHUNK_BYTES must be an integer");
  expect_error([] { resolve(Options(), {{"CUDA_P2P_RING_STEPS", "6"}}, 4); },
               "a positive multiple of the world size 4, got 6");
  Options bad;
  bad.all_gather_algo = "fastest";
  expect_error([&] { resolve(bad, {}); }, "Options.all_gather_algo must be one of");
  Options negative;
  negative.buffer_size = 0;
  expect_error([&] { resolve(negative, {}); }, "Options.buffer_size must be in [1, 64 PiB], got 0");
  // The mailboxes' slots: whole pages, from either side.
  expect_error([] { resolve(Options(), {{"CUDA_P2P_MAILBOX_SLOT_BYTES", "5000"}}); },
               "CUDA_P2P_MAILBOX_SLOT_BYTES must be a multiple of 4 KiB in [4 KiB, 256 MiB], got "
               "5000 ('5000')");
  expect_error([] { resolve(Options(), {{"CUDA_P2P_MAILBOX_SLOT_BYTES", "1K"}}); },
               "CUDA_P2P_MAILBOX_SLOT_BYTES must be a multiple of 4 KiB in [4 KiB, 256 MiB], got "
               "1024 ('1K')");
  Options slots;
  slots.mailbox_slot_bytes = 8192;
  EXPECT_EQ(resolve(slots, {{"CUDA_P2P_MAILBOX_SLOT_BYTES", "64K"}}).mailbox_slot_bytes, 8192);
  EXPECT_EQ(resolve(Options(), {{"CUDA_P2P_MAILBOX_SLOT_BYTES", "64K"}}).mailbox_slot_bytes,
            64 << 10);
  slots.mailbox_slot_bytes = 4097;
  expect_error([&] { resolve(slots, {}); },
               "Options.mailbox_slot_bytes must be a multiple of 4 KiB in [4 KiB, 256 MiB], got "
               "4097");
}

TEST(Config, EveryKnobIsDocumentedOnce) {
  std::set<std::string> options, envs;
  for (const auto& k : config::knobs()) {
    EXPECT_FALSE(k.option.empty() && k.env.empty());
    EXPECT_FALSE(k.help.empty()) << k.option << k.env;
    if (!k.option.empty()) {
      EXPECT_TRUE(options.insert(k.option).second) << k.option;
    }
    if (!k.env.empty()) {
      EXPECT_TRUE(envs.insert(k.env).second) << k.env;
    }
  }
  EXPECT_TRUE(envs.count("CUDA_P2P_HOST_ID"));
  EXPECT_TRUE(options.count("cuda_workspace_collectives"));
}

// What python -m cuda_p2p and CUDA_P2P_DEBUG=INFO report: each knob's value and its source.
TEST(Config, KnobValuesSayWhereEachValueCameFrom) {
  Options o;
  o.chunk_bytes = 4096;             // Options, over the environment below
  o.workspace_collectives = false;  // a plain bool counts as set when not at its default
  o.all_reduce_algo = "two_shot";
  const auto values = config::knob_values(o, fake_env({{"CUDA_P2P_CHUNK_BYTES", "2M"},
                                                       {"CUDA_P2P_RING_STEPS", "8"},
                                                       {"CUDA_P2P_ALL_GATHER_ALGO", "auto"},
                                                       {"CUDA_P2P_HOST_ID", "h1"}}));
  ASSERT_EQ(values.size(), config::knobs().size());
  std::map<std::string, std::pair<std::string, std::string>> by_name;
  for (const auto& v : values) {
    by_name[v.knob->option.empty() ? v.knob->env : v.knob->option] = {v.value, v.source};
  }
  using P = std::pair<std::string, std::string>;
  EXPECT_EQ(by_name["chunk_bytes"], P("4096", "Options"));
  EXPECT_EQ(by_name["workspace_collectives"], P("False", "Options"));
  EXPECT_EQ(by_name["all_reduce_algo"], P("two_shot", "Options"));
  EXPECT_EQ(by_name["ring_steps"], P("8", "environment"));
  EXPECT_EQ(by_name["CUDA_P2P_HOST_ID"], P("h1", "environment"));
  // "auto" in the environment leaves a name knob to its default, as resolve_config reads it.
  EXPECT_EQ(by_name["all_gather_algo"], P("auto", "default"));
  EXPECT_EQ(by_name["buffer_size"], P("32 MiB", "default"));
  EXPECT_EQ(by_name["hierarchical"], P("True", "default"));
}

// NOTE [Configuration rules]: one table, so one validator and one rendering. The tests below go
// over every knob of the table, so a knob added later is covered as it is added.

using config::Knob;
using config::Value;

// Values to try on knob `k`: both bools; around its range and step; each name, a wrong one and
// each in capitals; a string.
std::vector<Value> probes(const Knob& k) {
  std::vector<Value> out;
  switch (k.kind) {
    case config::Kind::kBool:
      return {true, false};
    case config::Kind::kBytes:
    case config::Kind::kInt:
      for (int64_t v : {k.min - 1, k.min, k.min + k.step, k.max - k.step, k.max, k.max + 1,
                        int64_t{-1}, int64_t{0}, int64_t{1}, int64_t{4096}, int64_t{5000}}) {
        out.push_back(v);
      }
      if (k.step > 1) out.push_back(k.min + k.step / 2);
      return out;
    case config::Kind::kNames: {
      std::string names = k.names + "|bogus";
      for (size_t b = 0, e = 0; b <= names.size(); b = e + 1) {
        e = std::min(names.find('|', b), names.size());
        const std::string n = names.substr(b, e - b);
        std::string upper = n;
        for (auto& ch : upper) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
        out.push_back(n);
        out.push_back(upper);
      }
      return out;
    }
    case config::Kind::kString:
      return {std::string("h1")};
  }
  return out;
}

// Sets `k`'s Options field to `v`, bypassing the Python property's check.
void set_field(Options& o, const Knob& k, const Value& v) {
  std::visit(
      [&](auto f) {
        using F = decltype(f);
        if constexpr (std::is_same_v<F, bool Options::*> ||
                      std::is_same_v<F, std::optional<bool> Options::*>) {
          o.*f = std::get<bool>(v);
        } else if constexpr (std::is_same_v<F, int64_t Options::*> ||
                             std::is_same_v<F, std::optional<int64_t> Options::*>) {
          o.*f = std::get<int64_t>(v);
        } else if constexpr (std::is_same_v<F, std::string Options::*>) {
          o.*f = std::get<std::string>(v);
        }
      },
      k.field);
}

// The variable's text for `v` (inverted where the variable is).
std::string env_text(const Knob& k, const Value& v) {
  if (const auto* b = std::get_if<bool>(&v)) return *b != k.env_inverted ? "1" : "0";
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  return std::get<std::string>(v);
}

template <typename Fn>
std::optional<std::string> error_of(Fn&& fn) {
  try {
    fn();
  } catch (const c10::Error& e) {
    return e.what_without_backtrace();
  }
  return std::nullopt;
}

std::string replace(std::string s, const std::string& from, const std::string& to) {
  if (auto at = s.find(from); at != std::string::npos) s.replace(at, from.size(), to);
  return s;
}

std::string show(const Value& v) { return config::render(config::Kind::kInt, v); }

TEST(Config, TheOptionsCheckRefusesWhatTheResolutionRefuses) {
  const config::Context ctx{1, true};  // one rank: ring steps are a multiple of any count
  for (const auto& k : config::knobs()) {
    if (k.option.empty()) continue;
    for (const auto& v : probes(k)) {
      SCOPED_TRACE(k.option + " = " + show(v));
      // What the Python property calls (python/options.cpp), and resolve_config on the field.
      const auto by_check = error_of([&] { config::check(k, v, "Options." + k.option); });
      Options o;
      set_field(o, k, v);
      Config c;
      const auto by_resolution =
          error_of([&] { c = resolve_config(o, ctx.world_size, fake_env({})); });
      EXPECT_EQ(by_check, by_resolution);
      // The same value from the variable: refused alike, the message naming the variable.
      if (!k.env.empty()) {
        const std::string text = env_text(k, v);
        const auto by_env =
            error_of([&] { resolve_config(Options(), ctx.world_size, fake_env({{k.env, text}})); });
        std::optional<std::string> want;
        if (by_check) {
          want = replace(*by_check, "Options." + k.option, k.env);
          if (k.kind != config::Kind::kNames) *want += " ('" + text + "')";
        }
        EXPECT_EQ(by_env, want);
      }
      // A value accepted reads back as set ("auto" and ring steps 0 mean the default's rule).
      if (by_resolution || k.read == nullptr) continue;
      const bool means_default =
          v == Value(std::string("auto")) ||
          (k.default_rule.rule == config::Default::Rule::kWorldSize && v == Value(int64_t{0}));
      EXPECT_EQ(k.read(c, ctx), means_default ? config::default_in(k, ctx) : v);
    }
  }
}

TEST(Config, EveryDefaultIsWhatAGroupWithNothingSetReadsBack) {
  for (const int world : {1, 2, 4}) {
    for (const bool host : {true, false}) {
      const config::Context ctx{world, host};
      const Config c = resolve(Options(), {}, world);
      for (const auto& k : config::knobs()) {
        if (k.read == nullptr) continue;
        SCOPED_TRACE((k.option.empty() ? k.env : k.option) + " on " + std::to_string(world) +
                     (host ? " host" : " CUDA") + " ranks");
        EXPECT_EQ(k.read(c, ctx), config::default_in(k, ctx));
      }
    }
  }
}

TEST(Config, AFreshOptionsSetsNoKnob) {
  const Options fresh;
  for (const auto& k : config::knobs()) {
    EXPECT_FALSE(config::option_value(k, fresh).has_value()) << k.option;
  }
  for (const auto& v : config::knob_values(fresh, fake_env({}))) {
    EXPECT_EQ(v.source, "default") << v.knob->option << v.knob->env;
    EXPECT_EQ(v.value, v.knob->default_value);
  }
}

TEST(Config, DefaultsAreRenderedFromTheirValues) {
  EXPECT_EQ(config::render(config::Kind::kBytes, int64_t{32} << 20), "32 MiB");
  EXPECT_EQ(config::render(config::Kind::kBytes, int64_t{5000}), "5000");
  EXPECT_EQ(config::render(config::Kind::kBytes, int64_t{1} << 46), "64 TiB");
  EXPECT_EQ(config::render(config::Kind::kInt, int64_t{8} << 30), "8G");
  EXPECT_EQ(config::render(config::Kind::kBool, true), "True");
  EXPECT_EQ(config::render(config::Kind::kInt, Value()), "unset");
  auto default_of = [](const std::string& name) {
    const Knob* k = config::find_knob(name);
    EXPECT_NE(k, nullptr) << name;
    return k == nullptr ? std::string() : k->default_value;
  };
  EXPECT_EQ(default_of("buffer_size"), "32 MiB");
  EXPECT_EQ(default_of("all_reduce_one_shot_max_bytes"), "64 KiB on 2 ranks, else 8 KiB");
  EXPECT_EQ(default_of("zero_copy_agreement"), "host: exchange; CUDA: off");
  EXPECT_EQ(default_of("fused_min_flops"), "host: 8G; CUDA: 0");
  EXPECT_EQ(default_of("ring_steps"), "the world size");
  EXPECT_EQ(default_of("workspace_device"), "cuda with a visible GPU, else cpu");
  EXPECT_EQ(default_of("LOCAL_RANK"), "unset");
  // The special rules are said by the table, once.
  const Knob* ws = config::find_knob("enable_workspace");
  ASSERT_NE(ws, nullptr);
  EXPECT_TRUE(ws->kill_switch());
  EXPECT_NE(ws->help.find("CUDA_P2P_DISABLE_WORKSPACE=1 turns it off"), std::string::npos);
  EXPECT_NE(ws->help.find("Either side turns it off"), std::string::npos);
}

TEST(Config, TheDebugLevelIsInfoOrOff) {
  EXPECT_FALSE(resolve(Options(), {}).debug);
  EXPECT_TRUE(resolve(Options(), {{"CUDA_P2P_DEBUG", "INFO"}}).debug);
  EXPECT_TRUE(resolve(Options(), {{"CUDA_P2P_DEBUG", "info"}}).debug);
  EXPECT_FALSE(resolve(Options(), {{"CUDA_P2P_DEBUG", "OFF"}}).debug);
  EXPECT_FALSE(resolve(Options(), {{"CUDA_P2P_DEBUG", "0"}}).debug);
  expect_error([] { resolve(Options(), {{"CUDA_P2P_DEBUG", "trace"}}); },
               "CUDA_P2P_DEBUG must be one of off|info (any case), got 'trace'");
}

}  // namespace
}  // namespace cuda_p2p::test
