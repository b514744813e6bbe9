#include "p2p_workspace/workspace_records.hpp"

#include <c10/util/Exception.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <random>
#include <sstream>

#include "p2p_workspace/symmetric_workspace.hpp"  // host_identity

namespace cuda_p2p::records {

std::string hex(const std::vector<uint8_t>& bytes) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string s;
  for (auto b : bytes) {
    s += kHex[b >> 4];
    s += kHex[b & 0xf];
  }
  return s;
}

std::vector<uint8_t> unhex(const std::string& s) {
  std::vector<uint8_t> out(s.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = std::stoi(s.substr(2 * i, 2), nullptr, 16);
  return out;
}

std::string quoted_record(const std::string& s, size_t max) {
  std::string shown = s.substr(0, max);
  for (auto& c : shown) {
    if (c < 0x20 || c > 0x7e) c = '?';
  }
  return "'" + shown + (s.size() > max ? "...'" : "'");
}

std::string to_string(const std::vector<uint8_t>& v) { return {v.begin(), v.end()}; }
std::vector<uint8_t> to_bytes(const std::string& s) { return {s.begin(), s.end()}; }

// NOTE [CPUs of the ranks]
// Whether the ranks of a host outnumber the CPUs they run on decides how a host wait polls
// (NOTE [Host waits on shared cores] in p2p_workspace/host/futex_wait.cpp). A rank alone sees
// only its own affinity: ranks pinned one per core (as bench/ and `taskset` users do) each see
// one CPU, yet none shares its core. So every rank publishes its affinity mask at rendezvous and
// the device is told how many CPUs the union of all ranks' masks holds: 2 ranks pinned to 2
// cores are not oversubscribed, 2 ranks pinned to one core are, 4 unpinned ranks on 2 cores are.
// Bit i of byte i / 8 is CPU i; bytes past the highest CPU are left out.
std::vector<uint8_t> cpu_mask() {
  std::vector<uint8_t> mask;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    for (int cpu = 0; cpu < CPU_SETSIZE; ++cpu) {
      if (!CPU_ISSET(cpu, &set)) continue;
      if (mask.size() <= static_cast<size_t>(cpu / 8)) mask.resize(cpu / 8 + 1, 0);
      mask[cpu / 8] |= static_cast<uint8_t>(1u << (cpu % 8));
    }
  }
  if (mask.empty()) {  // unknown: every online CPU
    const long n = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
    mask.assign((n + 7) / 8, 0);
    for (long cpu = 0; cpu < n; ++cpu) mask[cpu / 8] |= static_cast<uint8_t>(1u << (cpu % 8));
  }
  return mask;
}

// The number of CPUs in the union of `masks`.
int union_cpus(const std::vector<std::vector<uint8_t>>& masks) {
  std::vector<uint8_t> all;
  for (const auto& m : masks) {
    if (all.size() < m.size()) all.resize(m.size(), 0);
    for (size_t i = 0; i < m.size(); ++i) all[i] |= m[i];
  }
  int n = 0;
  for (uint8_t b : all) n += std::popcount(b);
  return n;
}

// NOTE [Workspace records]
// What a rank publishes at rendezvous travels through the c10d store, which is not
// authenticated: anyone on the machine may have written it. So a record is parsed strictly (a
// version line, a fixed number of lines, every number in range, a printable host id, a bounded
// handle) and a bad one is an error naming the rank, never a half-parsed PeerInfo. Whom a handle
// leads to is checked by the device when it maps the block (NOTE [Authenticated block exchange]
// in p2p_workspace/fd_exchange.cpp).
constexpr const char* kRecordVersion = "cuda_p2p-peer-v5";
constexpr size_t kRecordLines = 12;
constexpr size_t kMaxCpuMaskBytes = 256;  // 2048 CPUs
constexpr size_t kMaxRecordBytes = 4096;
constexpr size_t kMaxHandleBytes = 1024;

std::string PeerInfo::serialize() const {
  std::ostringstream os;
  os << kRecordVersion << '\n'
     << host << '\n'
     << pid << '\n'
     << device << '\n'
     << device_index << '\n'
     << block_size << '\n'
     << hex(handle) << '\n'
     << probe_addr << '\n'
     << probe_token << '\n'
     << uuid << '\n'
     << hex(cpus) << '\n'
     << (failure_area.empty() ? std::string("-") : hex(failure_area)) << '\n';
  return os.str();
}

// NOTE [Workspace records]
PeerInfo PeerInfo::parse(const std::string& s, int rank) {
  auto fail = [&](const std::string& what) {
    TORCH_CHECK(false, "cuda_p2p: rank ", rank, "'s workspace record in the store is invalid (",
                what,
                "); was it written by another job or process? Record: ", quoted_record(s, 200));
  };
  if (s.size() > kMaxRecordBytes) fail("longer than " + std::to_string(kMaxRecordBytes) + " bytes");
  std::vector<std::string> lines;
  size_t begin = 0;
  while (begin < s.size()) {
    const size_t nl = s.find('\n', begin);
    if (nl == std::string::npos) fail("not newline-terminated");
    lines.push_back(s.substr(begin, nl - begin));
    begin = nl + 1;
  }
  if (lines.empty() || lines[0] != kRecordVersion) {
    fail(std::string("expected version '") + kRecordVersion + "'");
  }
  if (lines.size() != kRecordLines) {
    fail("expected " + std::to_string(kRecordLines) + " lines, got " +
         std::to_string(lines.size()));
  }
  auto printable = [](const std::string& v) {
    return std::all_of(v.begin(), v.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
  };
  auto number = [&](const std::string& v, const char* field, int64_t lo, int64_t hi) {
    const bool digits =
        !v.empty() && v.size() <= 19 &&
        v.find_first_not_of("0123456789", v[0] == '-' ? 1 : 0) == std::string::npos && v != "-";
    if (!digits) fail(std::string(field) + " is not an integer");
    const int64_t x = std::stoll(v);
    if (x < lo || x > hi) {
      fail(std::string(field) + " " + v + " is outside [" + std::to_string(lo) + ", " +
           std::to_string(hi) + "]");
    }
    return x;
  };
  auto unsigned_number = [&](const std::string& v, const char* field) {
    if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos) {
      fail(std::string(field) + " is not an unsigned integer");
    }
    try {
      return static_cast<uint64_t>(std::stoull(v));
    } catch (const std::out_of_range&) {
      fail(std::string(field) + " is out of range");
    }
    return uint64_t{0};
  };
  PeerInfo p;
  p.host = lines[1];
  if (p.host.empty() || p.host.size() > 512 || !printable(p.host)) {
    fail("the host id must be 1-512 printable characters");
  }
  p.pid = number(lines[2], "pid", 1, (int64_t{1} << 22));  // PID_MAX_LIMIT
  p.device = lines[3];
  if (p.device.empty() || p.device.size() > 64 || !printable(p.device)) {
    fail("the device name must be 1-64 printable characters");
  }
  p.device_index = static_cast<int>(number(lines[4], "device index", -1, 1 << 16));
  p.block_size = number(lines[5], "block size", 1, int64_t{1} << 50);
  const std::string& h = lines[6];
  if (h.empty() || h.size() % 2 != 0 || h.size() > 2 * kMaxHandleBytes ||
      h.find_first_not_of("0123456789abcdef") != std::string::npos) {
    fail("the handle must be 1-" + std::to_string(kMaxHandleBytes) + " bytes in lower-case hex");
  }
  p.handle = unhex(h);
  p.probe_addr = unsigned_number(lines[7], "probe address");
  p.probe_token = unsigned_number(lines[8], "probe token");
  p.uuid = lines[9];
  if (p.uuid.empty() || p.uuid.size() > 128 || !printable(p.uuid)) {
    fail("the device uuid must be 1-128 printable characters");
  }
  const std::string& c = lines[10];
  if (c.empty() || c.size() % 2 != 0 || c.size() > 2 * kMaxCpuMaskBytes ||
      c.find_first_not_of("0123456789abcdef") != std::string::npos) {
    fail("the CPU mask must be 1-" + std::to_string(kMaxCpuMaskBytes) + " bytes in lower-case hex");
  }
  p.cpus = unhex(c);
  const std::string& f = lines[11];
  if (f != "-") {
    if (f.empty() || f.size() % 2 != 0 || f.size() > 2 * kMaxHandleBytes ||
        f.find_first_not_of("0123456789abcdef") != std::string::npos) {
      fail("the failure area's handle must be '-' or 1-" + std::to_string(kMaxHandleBytes) +
           " bytes in lower-case hex");
    }
    p.failure_area = unhex(f);
  }
  return p;
}

// NOTE [Allocation failures at rendezvous]
// A rank whose block cannot be allocated or exported (a symmetric heap larger than the GPU's free
// memory, a growth beyond what the host can map) must not leave its peers waiting for its record
// until the rendezvous times out. It publishes a failure record in place of its info, and every
// rank, having read all records, raises the same error, naming each rank that failed and why: an
// OutOfMemoryError when one of them ran out of memory, else a RuntimeError. Every rank took part
// in the exchange, so the generation counts stay in step, and nothing was mapped: a growth keeps
// the current generation mapped and usable, a construction fails on every rank. A failure record
// is parsed as strictly as an info record (the store is not trusted); a forged one can only make
// the ranks fail, which anyone who can write the store can do anyway.
constexpr const char* kFailureVersion = "cuda_p2p-peer-failed-v1";
constexpr size_t kMaxFailureReason = 1000;

std::string failure_record(bool out_of_memory, const std::string& reason) {
  std::string r = reason.substr(0, kMaxFailureReason);
  for (auto& c : r) {
    if (c < 0x20 || c > 0x7e) c = ' ';
  }
  if (r.empty()) r = "(no reason given)";
  return std::string(kFailureVersion) + '\n' + (out_of_memory ? "oom" : "error") + '\n' + r + '\n';
}

// A rank's failure record: {out of memory, reason}; nullopt when `s` is not one (an info record,
// which PeerInfo::parse then checks).
std::optional<std::pair<bool, std::string>> parse_failure(const std::string& s, int rank) {
  const std::string head = std::string(kFailureVersion) + '\n';
  if (s.rfind(head, 0) != 0) return std::nullopt;
  const size_t kind_end = s.find('\n', head.size());
  const size_t reason_end = kind_end == std::string::npos ? kind_end : s.find('\n', kind_end + 1);
  const std::string kind =
      kind_end == std::string::npos ? "" : s.substr(head.size(), kind_end - head.size());
  const std::string reason =
      reason_end == std::string::npos ? "" : s.substr(kind_end + 1, reason_end - kind_end - 1);
  const bool valid =
      reason_end != std::string::npos && reason_end + 1 == s.size() &&
      (kind == "oom" || kind == "error") && !reason.empty() && reason.size() <= kMaxFailureReason &&
      std::all_of(reason.begin(), reason.end(), [](char c) { return c >= 0x20 && c <= 0x7e; });
  TORCH_CHECK(valid, "cuda_p2p: rank ", rank,
              "'s workspace failure record in the store is invalid; was it written by another "
              "job or process? (NOTE [Workspace records])");
  return std::make_pair(kind == "oom", reason);
}

// Publishes `value` under prefix/<rank> and returns every rank's value, in rank order: an
// all-gather over the store, read back in one multiGet (one round trip on a TCPStore), as c10d's
// own store exchanges do. Unlike theirs, which copy a struct's bytes, what travels here is a text
// record parsed strictly (NOTE [Workspace records]): the store is not trusted.
std::vector<std::string> exchange(c10d::Store& store, const std::string& prefix, int rank,
                                  int world_size, const std::string& value, Millis timeout) {
  store.set(prefix + std::to_string(rank), to_bytes(value));
  std::vector<std::string> keys;
  for (int r = 0; r < world_size; ++r) keys.push_back(prefix + std::to_string(r));
  try {
    store.wait(keys, timeout);
  } catch (const std::exception& e) {
    std::ostringstream missing;
    int count = 0;
    for (int r = 0; r < world_size; ++r) {
      if (!store.check({keys[r]})) missing << (count++ ? ", " : "") << r;
    }
    TORCH_CHECK(false, "cuda_p2p: workspace rendezvous (", prefix, ") timed out after ",
                timeout.count(), " ms on rank ", rank, ": rank", count > 1 ? "s " : " ",
                missing.str(), " never arrived");
  }
  std::vector<std::string> out;
  for (const auto& v : store.multiGet(keys)) out.push_back(to_string(v));
  return out;
}

// NOTE [One job per store]
// A second job started with the same init_method port as a running one reaches the first job's
// store (only its rank 0 fails, to bind the port) and would overwrite the first job's records. So
// before publishing anything each rank claims its rank's slot with compare_set: the first
// process to claim a slot holds it, and any later claimant fails at once, naming the holder,
// without having written anything else. The Python creator claims the group's slots the same
// way before the wrapped backends rendezvous (python/cuda_p2p/_backend.py).
void claim_rank_slot(c10d::Store& store, int rank) {
  std::random_device rd;
  std::ostringstream value;
  const std::string me = "pid " + std::to_string(::getpid()) + " on " + host_identity() + " token ";
  value << me << std::hex << rd() << rd() << rd() << rd();
  const std::string key = "cuda_p2p/workspace/owner/" + std::to_string(rank);
  std::string got = to_string(store.compareSet(key, {}, to_bytes(value.str())));
  if (got != value.str() && got.rfind(me, 0) == 0) {
    // This very process held the slot: it re-creates a group it destroyed on the same store.
    store.set(key, to_bytes(value.str()));
    got = value.str();
  }
  TORCH_CHECK(got == value.str(), "cuda_p2p: another job already uses this store: rank ", rank,
              "'s workspace slot is held by another process (",
              got.substr(0, std::min<size_t>(got.find(" token"), 200)), "), so this process (pid ",
              ::getpid(),
              ") is not joining it; was a second job started with the same init_method / "
              "MASTER_PORT?");
}

}  // namespace cuda_p2p::records
