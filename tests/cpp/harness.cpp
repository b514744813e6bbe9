#include "tests/cpp/harness.hpp"

#include <ATen/Parallel.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <stdexcept>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <vector>

#include "backend/config.hpp"
#include "p2p_workspace/host/host_device.hpp"

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace cuda_p2p::test {

namespace {

World g_world;  // test-binary state only; the library itself has no globals

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoi(v) : fallback;
}

// The launcher's rank and size: OpenMPI's variables, else torchrun-style RANK/WORLD_SIZE, else a
// single process.
void read_launcher_env(World& w) {
  w.rank = env_int("OMPI_COMM_WORLD_RANK", env_int("PMI_RANK", env_int("RANK", 0)));
  w.size = env_int("OMPI_COMM_WORLD_SIZE", env_int("PMI_SIZE", env_int("WORLD_SIZE", 1)));
  if (w.size < 1 || w.rank < 0 || w.rank >= w.size) {
    throw std::runtime_error("harness: bad rank " + std::to_string(w.rank) + " of " +
                             std::to_string(w.size));
  }
}

// MASTER_PORT if set; otherwise a port derived from the launcher's pid (mpirun is the parent of
// every rank on one host), so concurrent jobs rarely collide. Below Linux's ephemeral range
// (32768-60999 by default), where the kernel hands out the local ports of outgoing connections:
// a port derived into that range was once taken by one (EADDRINUSE at the store's listen).
uint16_t store_port() {
  if (int p = env_int("MASTER_PORT", 0); p > 0) return static_cast<uint16_t>(p);
  return static_cast<uint16_t>(20000 + getppid() % 12000);
}

// On ranks other than 0, print only failures (with the rank), not the whole report.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (r.failed()) {
      std::cerr << "[rank " << rank_ << "] " << (r.file_name() ? r.file_name() : "?") << ":"
                << r.line_number() << ": Failure\n"
                << r.summary() << std::endl;
    }
  }

 private:
  int rank_;
};

// Skipped tests. With CUDA_P2P_TEST_FAIL_ON_SKIP=1 (scripts/gpu_check.sh sets it: there a skip
// means something that should have run did not) a skip fails the run unless its message says the
// test needs more ranks ("needs N ranks"), says it runs in another entry of the binary
// ("elsewhere: ...", tests/cpp/harness.hpp) or starts with one of the '|'-separated prefixes in
// CUDA_P2P_TEST_ALLOWED_SKIPS.
class SkipChecker : public ::testing::EmptyTestEventListener {
 public:
  SkipChecker() {
    const char* strict = std::getenv("CUDA_P2P_TEST_FAIL_ON_SKIP");
    strict_ = strict && std::string(strict) == "1";
    const char* allowed = std::getenv("CUDA_P2P_TEST_ALLOWED_SKIPS");
    std::string list = allowed ? allowed : "";
    for (size_t start = 0; start <= list.size();) {
      size_t end = list.find('|', start);
      if (end == std::string::npos) end = list.size();
      if (end > start) allowed_.push_back(list.substr(start, end - start));
      start = end + 1;
    }
  }
  // The name is taken here: OnTestPartResult runs under GoogleTest's lock, which
  // current_test_info() takes too.
  void OnTestStart(const ::testing::TestInfo& info) override {
    current_ = std::string(info.test_suite_name()) + "." + info.name();
  }
  void OnTestPartResult(const ::testing::TestPartResult& r) override {
    if (!strict_ || !r.skipped()) return;
    const std::string message = r.message() ? r.message() : "";
    if (needs_more_ranks(message) || message.rfind("elsewhere: ", 0) == 0) return;
    for (const auto& prefix : allowed_) {
      if (message.rfind(prefix, 0) == 0) return;
    }
    disallowed_.push_back(current_ + ": " + message);
  }
  const std::vector<std::string>& disallowed() const { return disallowed_; }

 private:
  // "needs <digits> rank...": the world-size requirements of the multi-rank tests.
  static bool needs_more_ranks(const std::string& m) {
    const std::string head = "needs ";
    size_t i = head.size();
    if (m.rfind(head, 0) != 0 || i >= m.size() || !std::isdigit(static_cast<unsigned char>(m[i]))) {
      return false;
    }
    while (i < m.size() && std::isdigit(static_cast<unsigned char>(m[i]))) ++i;
    return m.compare(i, 5, " rank") == 0;
  }

  bool strict_ = false;
  std::vector<std::string> allowed_;
  std::vector<std::string> disallowed_;
  std::string current_;
};

}  // namespace

const World& world() { return g_world; }

c10::intrusive_ptr<c10d::Store> test_store() {
  static std::map<std::string, int> uses;
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = info ? std::string(info->test_suite_name()) + "." + info->name() : "global";
  name += "#" + std::to_string(uses[name]++);
  return c10::make_intrusive<c10d::PrefixStore>(name, g_world.store);
}

bool names_rank(const std::string& what, int rank) {
  // The numbers after each word "rank" or "ranks": "rank 2 never arrived", "ranks 1, 2 never ...".
  for (size_t at = what.find("rank"); at != std::string::npos; at = what.find("rank", at + 4)) {
    if (at > 0 && std::isalnum(static_cast<unsigned char>(what[at - 1]))) continue;
    size_t i = at + 4;
    if (i < what.size() && what[i] == 's') ++i;
    while (i < what.size() && what[i] == ' ') {
      size_t j = ++i;
      while (j < what.size() && std::isdigit(static_cast<unsigned char>(what[j]))) ++j;
      if (j == i || (j < what.size() && std::isalpha(static_cast<unsigned char>(what[j])))) break;
      if (std::stoi(what.substr(i, j - i)) == rank) return true;
      i = j;
      if (i < what.size() && what[i] == ',') ++i;
    }
  }
  return false;
}

void store_barrier(const std::string& tag) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string key = std::string("barrier/") + (info ? info->name() : "") + "/" + tag;
  g_world.store->add(key, 1);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  while (g_world.store->add(key, 0) < g_world.size) {
    if (std::chrono::steady_clock::now() > deadline) {
      throw std::runtime_error("store_barrier '" + key + "' timed out");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
}

int gpu_count() {
#ifdef CUDA_P2P_WITH_CUDA
  try {
    return c10::cuda::device_count();
  } catch (const std::exception&) {
    return 0;
  }
#else
  return 0;
#endif
}

bool cuda_semantics() {
  const char* v = std::getenv("CUDA_P2P_TEST_SEMANTICS");
  const std::string value = v ? v : "";
  if (value.empty() || value == "synchronous") return false;
  if (value == "cuda") return true;
  throw std::runtime_error(
      "harness: CUDA_P2P_TEST_SEMANTICS must be 'synchronous' or 'cuda', got '" + value + "'");
}

std::shared_ptr<Device> test_host_device(int processes) {
  Options options;  // host_streams "auto": the environment decides, as for a group
  return make_host_device(processes, resolve_config(options, 1).host_streams,
                          cuda_semantics() ? HostSemantics::kCuda : HostSemantics::kSynchronous);
}

bool groupless_test_runs_here() { return world().size == 1 && !cuda_semantics(); }

void apply_test_semantics(Device& device) {
  if (cuda_semantics()) use_cuda_semantics(device);
}

}  // namespace cuda_p2p::test

// ctest's SKIP_RETURN_CODE for these binaries (tests/cpp/CMakeLists.txt, tests/cpp/launch.py).
constexpr int kSkipStatus = 77;

int main(int argc, char** argv) {
  using namespace cuda_p2p::test;
  // Line-buffered into launch.py's pipe: a rank killed at the time limit has said what it got
  // to (the GPU run of 2026-11-27 lost a hung rank's whole output in its stdio buffer).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  ::testing::InitGoogleTest(&argc, argv);
  read_launcher_env(g_world);
  // One intra-op thread per rank unless OMP_NUM_THREADS says otherwise, as the Python harness's
  // ranks run (tests/python/_harness.py) and as ranks under mpirun get anyway: the ranks share
  // the cores, and ATen's OpenMP workers spin after each parallel region (started by hand or by
  // launch.py, test_kernel_matrix spent 14% of its samples in libgomp's spin wait, 2026-12-04).
  if (std::getenv("OMP_NUM_THREADS") == nullptr) at::set_num_threads(1);

  c10d::TCPStoreOptions opts;
  opts.port = store_port();
  opts.isServer = g_world.rank == 0;
  opts.numWorkers = g_world.size;
  opts.waitWorkers = true;
  opts.timeout = std::chrono::seconds(60);
  const char* host = std::getenv("MASTER_ADDR");
  g_world.store = c10::make_intrusive<c10d::TCPStore>(host && *host ? host : "127.0.0.1", opts);

  if (g_world.rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new FailurePrinter(g_world.rank));
  }
  auto* skips = new SkipChecker();  // owned by the listener list
  ::testing::UnitTest::GetInstance()->listeners().Append(skips);
  int rc = RUN_ALL_TESTS();
  for (const auto& what : skips->disallowed()) {
    std::cerr << "[rank " << g_world.rank << "] SKIPPED counts as a failure here "
              << "(CUDA_P2P_TEST_FAIL_ON_SKIP=1): " << what << std::endl;
    rc = 1;
  }
  // Every test skipped itself (e.g. the CUDA tests without a GPU): exit with kSkipStatus, which
  // ctest reports as "Not Run (Skipped)" rather than as a pass - but only when every rank agrees.
  const auto* unit = ::testing::UnitTest::GetInstance();
  const bool all_skipped =
      unit->test_to_run_count() > 0 && unit->skipped_test_count() == unit->test_to_run_count();
  g_world.store->add("harness/skipped", all_skipped ? 1 : 0);

  // Leave together: rank 0 hosts the store and must outlive every other rank's last use of it.
  g_world.store->add("harness/failed", rc != 0);
  store_barrier("exit");
  if (g_world.store->add("harness/failed", 0) > 0 && rc == 0) rc = 1;
  if (rc == 0 && g_world.store->add("harness/skipped", 0) == g_world.size) {
    if (g_world.rank == 0) std::cout << "harness: every test skipped itself" << std::endl;
    rc = kSkipStatus;
  }
  g_world.store->add("harness/left", 1);
  if (g_world.rank == 0) {
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (g_world.store->add("harness/left", 0) < g_world.size &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  return rc;
}
