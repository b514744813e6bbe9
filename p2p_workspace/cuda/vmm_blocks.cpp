// CUDA blocks through the driver's virtual memory API. Compiled where CUDA is; runs only on a GPU
// (docs/status.md says whether it has).
//
// NOTE [Blocks that outlive their exporter]
// With legacy CUDA IPC (cudaIpcGetMemHandle / cudaIpcOpenMemHandle) freeing an exported region
// before every importer closed it is undefined, and a process that dies frees it: a survivor's
// read of a dead rank's block in flight (a one-shot reduction, a copy-engine pull, a zero-copy
// tensor kept) would likely fault and lose the survivor's context. So where the driver and the
// GPU offer it (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED and
// ..._HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED) a block is a cuMemCreate allocation, as NCCL's
// cuMem path and PyTorch's symmetric memory make theirs:
// - allocate: cuMemCreate (requesting POSIX descriptor handles) of the size rounded up to the
//   allocation granularity, an address range reserved, mapped and made read-write for this GPU,
//   the allocation handle released: the mapping holds the allocation;
// - export: the allocation's handle retained from the address, exported as a POSIX descriptor,
//   released; the descriptor goes to the peers as a memfd does (NOTE [Authenticated block
//   exchange] in p2p_workspace/fd_exchange.cpp), and the handle names the rounded size;
// - import: the descriptor imported as a handle (a reference of the importer's own), mapped,
//   released, made read-write for the importer's GPU (over NVLink or PCIe peer access);
// - free: unmapped and the range freed, through NOTE [Deferred frees] like every CUDA block.
// The physical memory lives until the last mapping in any process and the last descriptor are
// gone: a rank that dies (its descriptors closed by the kernel, its mappings with its context)
// leaves its block valid for the survivors until they unmap it, and a survivor never frees
// memory a peer still maps. Device::blocks_outlive_owner() says so to the block retirement
// (NOTE [Block lifetime] in p2p_workspace/block_retirement.cpp).
//
// The cost: sizes round up to the granularity (2 MiB on current GPUs), which the workspace's
// buffers and heaps exceed anyway. Where the capability is missing the device keeps legacy IPC
// and says why (python -m cuda_p2p; docs/workspace.md), and CUDA_P2P_CUDA_BLOCKS chooses.
#include "p2p_workspace/cuda/vmm_blocks.hpp"

#include <c10/util/Exception.h>
#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>

#include "p2p_workspace/fd_exchange.hpp"

namespace cuda_p2p::cuda {

namespace {

constexpr const char* kPrefix = "vmm:";
// A sanity bound on a peer's claimed size (64 PiB, as the knobs' byte bound).
constexpr uint64_t kMaxSize = uint64_t{1} << 56;

// The driver's entry points, looked up through the runtime (the build links no libcuda).
struct Driver {
  decltype(&::cuGetErrorString) get_error_string = nullptr;
  decltype(&::cuDeviceGet) device_get = nullptr;
  decltype(&::cuDeviceGetAttribute) device_get_attribute = nullptr;
  decltype(&::cuMemGetAllocationGranularity) granularity = nullptr;
  decltype(&::cuMemCreate) create = nullptr;
  decltype(&::cuMemRelease) release = nullptr;
  decltype(&::cuMemAddressReserve) reserve = nullptr;
  decltype(&::cuMemAddressFree) address_free = nullptr;
  decltype(&::cuMemMap) map = nullptr;
  decltype(&::cuMemUnmap) unmap = nullptr;
  decltype(&::cuMemSetAccess) set_access = nullptr;
  decltype(&::cuMemRetainAllocationHandle) retain = nullptr;
  decltype(&::cuMemExportToShareableHandle) export_handle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) import_handle = nullptr;

  // The first entry point missing ("" when none is).
  std::string load() {
    std::string missing;
    auto get = [&missing](auto& fn, const char* name) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult q{};
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
          q != cudaDriverEntryPointSuccess || p == nullptr) {
        (void)cudaGetLastError();
        if (missing.empty()) missing = name;
        return;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    get(get_error_string, "cuGetErrorString");
    get(device_get, "cuDeviceGet");
    get(device_get_attribute, "cuDeviceGetAttribute");
    get(granularity, "cuMemGetAllocationGranularity");
    get(create, "cuMemCreate");
    get(release, "cuMemRelease");
    get(reserve, "cuMemAddressReserve");
    get(address_free, "cuMemAddressFree");
    get(map, "cuMemMap");
    get(unmap, "cuMemUnmap");
    get(set_access, "cuMemSetAccess");
    get(retain, "cuMemRetainAllocationHandle");
    get(export_handle, "cuMemExportToShareableHandle");
    get(import_handle, "cuMemImportFromShareableHandle");
    return missing;
  }

  std::string error(CUresult r) const {
    const char* text = nullptr;
    if (get_error_string == nullptr || get_error_string(r, &text) != CUDA_SUCCESS || !text) {
      return "CUresult " + std::to_string(static_cast<int>(r));
    }
    return text;
  }
};

class DriverVmmBlocks : public VmmBlocks {
 public:
  DriverVmmBlocks(Driver d, CUdevice device, size_t granularity)
      : d_(std::move(d)), device_(device), granularity_(granularity) {}

  VmmMapping allocate(size_t bytes) override {
    const size_t size = round_up(bytes);
    CUmemAllocationProp prop = properties();
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = d_.create(&h, size, &prop, 0);
    TORCH_CHECK_WITH(OutOfMemoryError, r != CUDA_ERROR_OUT_OF_MEMORY,
                     "cuda_p2p: cannot allocate a block of ", size,
                     " bytes with cuMemCreate: out of memory");
    check(r, "cuMemCreate");
    return map_handle(h, size);  // releases h
  }

  std::unique_ptr<BlockExporter> exporter(const VmmMapping& m, int max_peers) override {
    CUmemGenericAllocationHandle h = 0;
    check(d_.retain(&h, m.ptr), "cuMemRetainAllocationHandle");
    int fd = -1;
    const CUresult r =
        d_.export_handle(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, /*flags=*/0);
    (void)d_.release(h);  // the descriptor holds its own reference
    check(r, "cuMemExportToShareableHandle");
    return std::make_unique<Exporter>(fd, max_peers, m.size);
  }

  VmmMapping import(const std::vector<uint8_t>& handle, size_t bytes, Millis timeout) override {
    const std::string text(handle.begin(), handle.end());
    const size_t colon = text.find(':', std::char_traits<char>::length(kPrefix));
    const std::string size_text = text.substr(
        std::char_traits<char>::length(kPrefix),
        colon == std::string::npos ? 0 : colon - std::char_traits<char>::length(kPrefix));
    const bool ok = is_vmm_handle(handle) && colon != std::string::npos && !size_text.empty() &&
                    size_text.size() <= 20 &&
                    size_text.find_first_not_of("0123456789") == std::string::npos;
    TORCH_CHECK(ok, "cuda_p2p: malformed CUDA block handle (expected 'vmm:<bytes>:<socket>', got ",
                text.size(), " bytes)");
    const uint64_t size = std::stoull(size_text);
    TORCH_CHECK(size >= bytes && size <= kMaxSize && size % granularity_ == 0,
                "cuda_p2p: a peer's CUDA block holds ", size, " bytes, expected at least ", bytes,
                " in whole granules of ", granularity_, " bytes");
    const int fd = receive_fd(text.substr(colon + 1), timeout);
    CUmemGenericAllocationHandle h = 0;
    const CUresult r = d_.import_handle(&h, reinterpret_cast<void*>(static_cast<intptr_t>(fd)),
                                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
    ::close(fd);  // the imported handle holds the allocation
    check(r, "cuMemImportFromShareableHandle");
    return map_handle(h, static_cast<size_t>(size));  // releases h
  }

  void unmap(const VmmMapping& m) noexcept override {
    const auto p = reinterpret_cast<CUdeviceptr>(m.ptr);
    (void)d_.unmap(p, m.size);
    (void)d_.address_free(p, m.size);
  }

 private:
  // Serves the descriptor; its handle adds the size to the socket's.
  class Exporter : public BlockExporter {
   public:
    Exporter(int fd, int max_peers, size_t size)
        : fds_(fd, max_peers, nullptr, /*own_fd=*/true), size_(size) {}
    std::vector<uint8_t> handle() const override {
      const std::vector<uint8_t> socket = fds_.handle();
      std::string h = kPrefix + std::to_string(size_) + ":";
      h.append(socket.begin(), socket.end());
      return {h.begin(), h.end()};
    }

   private:
    FdExporter fds_;
    size_t size_;
  };

  CUmemAllocationProp properties() const {
    CUmemAllocationProp prop{};
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop.location.id = device_;
    prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
    return prop;
  }

  size_t round_up(size_t bytes) const {
    return (std::max<size_t>(bytes, 1) + granularity_ - 1) / granularity_ * granularity_;
  }

  // Reserves a range, maps `h` there read-write for this GPU, releases `h` (the mapping keeps
  // the allocation); on any failure undoes what it did and throws.
  VmmMapping map_handle(CUmemGenericAllocationHandle h, size_t size) {
    CUdeviceptr p = 0;
    CUresult r = d_.reserve(&p, size, granularity_, 0, 0);
    if (r == CUDA_SUCCESS) {
      r = d_.map(p, size, 0, h, 0);
      if (r == CUDA_SUCCESS) {
        CUmemAccessDesc access{};
        access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
        access.location.id = device_;
        access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = d_.set_access(p, size, &access, 1);
        if (r != CUDA_SUCCESS) (void)d_.unmap(p, size);
      }
      if (r != CUDA_SUCCESS) (void)d_.address_free(p, size);
    }
    (void)d_.release(h);
    check(r, "mapping a CUDA block (cuMemAddressReserve, cuMemMap, cuMemSetAccess)");
    return {reinterpret_cast<void*>(p), size};
  }

  void check(CUresult r, const char* what) const {
    TORCH_CHECK(r == CUDA_SUCCESS, "cuda_p2p: ", what, " on cuda:", device_,
                " failed: ", d_.error(r));
  }

  Driver d_;
  CUdevice device_;
  size_t granularity_;
};

}  // namespace

std::unique_ptr<VmmBlocks> VmmBlocks::open(int device, std::string& why_not) {
  Driver d;
  const std::string missing = d.load();
  if (!missing.empty()) {
    why_not = "the driver has no " + missing;
    return nullptr;
  }
  CUdevice dev = 0;
  if (d.device_get(&dev, device) != CUDA_SUCCESS) {
    why_not = "cuDeviceGet(" + std::to_string(device) + ") failed";
    return nullptr;
  }
  int vmm = 0, posix = 0;
  if (d.device_get_attribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev) !=
          CUDA_SUCCESS ||
      vmm == 0) {
    why_not = "the GPU has no virtual memory management";
    return nullptr;
  }
  if (d.device_get_attribute(&posix,
                             CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
                             dev) != CUDA_SUCCESS ||
      posix == 0) {
    why_not = "the GPU cannot export allocations as POSIX file descriptors";
    return nullptr;
  }
  CUmemAllocationProp prop{};
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = dev;
  prop.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  size_t granularity = 0;
  if (d.granularity(&granularity, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
      granularity == 0) {
    why_not = "cuMemGetAllocationGranularity failed";
    return nullptr;
  }
  return std::make_unique<DriverVmmBlocks>(std::move(d), dev, granularity);
}

bool VmmBlocks::is_vmm_handle(const std::vector<uint8_t>& handle) {
  const size_t n = std::char_traits<char>::length(kPrefix);
  return handle.size() > n && std::equal(kPrefix, kPrefix + n, handle.begin());
}

}  // namespace cuda_p2p::cuda
