// cuda_p2p._C: the Python face of the C++ backend.
//
// Compiled against torch's own pybind11 and registered with torch's c10d classes as bases, so
// that `group._get_backend(device)` hands Python our class (real down-casting).
#include <pybind11/chrono.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include "backend/ProcessGroupCudaP2P.hpp"
#include "backend/dispatcher_group.hpp"
#include "backend/symmetric_allocator.hpp"
#include "ops/pipeline_common.hpp"
#include "ops/reduction.hpp"
#include "p2p_workspace/host/core_probe.hpp"
#include "p2p_workspace/host/host_device.hpp"

namespace py = pybind11;

namespace {

using cuda_p2p::ProcessGroupCudaP2P;
using Options = ProcessGroupCudaP2P::Options;
using BackendPtr = c10::intrusive_ptr<c10d::Backend>;

// The getter and the setter of an Options string whose values `parse` checks: a bad value raises
// (naming `what`, e.g. "Options.host_streams") and leaves the option as it was.
template <std::string Options::* Member>
std::string get_string(const Options& o) {
  return o.*Member;
}
template <std::string Options::* Member, typename Parse>
auto parsed_string_setter(Parse parse, const char* what) {
  return [parse, what](Options& o, const std::string& v) {
    parse(v, what);
    o.*Member = v;
  };
}

// The getter and the setter of an optional count of Options (bytes, flops) that must not be
// negative: a negative one raises, naming `what`, and leaves the option as it was.
template <std::optional<int64_t> Options::* Member>
std::optional<int64_t> get_count(const Options& o) {
  return o.*Member;
}
template <std::optional<int64_t> Options::* Member>
auto non_negative_setter(const char* what) {
  return [what](Options& o, std::optional<int64_t> v) {
    TORCH_CHECK_VALUE(!v || *v >= 0, "cuda_p2p: ", what, " must be >= 0 or None, got ",
                      v.value_or(0));
    o.*Member = v;
  };
}

// NOTE [GIL-free destructor]: the last reference to a backend may be dropped from Python (the
// object of get_cuda_p2p_backend outliving destroy_process_group). Its destructor joins Gloo's
// worker thread, which may itself need the GIL to free the tensors of its last Work: destroying
// it with the GIL held deadlocks. torch binds its c10d classes with this holder for that reason.
template <typename T>
class IntrusivePtrNoGilDestructor {
  c10::intrusive_ptr<T> impl_;

 public:
  IntrusivePtrNoGilDestructor() = default;
  IntrusivePtrNoGilDestructor(const IntrusivePtrNoGilDestructor&) = default;
  IntrusivePtrNoGilDestructor(IntrusivePtrNoGilDestructor&&) noexcept = default;
  IntrusivePtrNoGilDestructor& operator=(const IntrusivePtrNoGilDestructor&) = default;
  IntrusivePtrNoGilDestructor& operator=(IntrusivePtrNoGilDestructor&&) noexcept = default;
  /* implicit */ IntrusivePtrNoGilDestructor(c10::intrusive_ptr<T> impl) : impl_(std::move(impl)) {}
  explicit IntrusivePtrNoGilDestructor(T* impl)
      : impl_(c10::intrusive_ptr<T>::unsafe_steal_from_new(impl)) {}
  ~IntrusivePtrNoGilDestructor() {
    if (impl_) {
      if (PyGILState_Check()) {
        py::gil_scoped_release release;
        impl_.reset();
      } else {
        impl_.reset();
      }
    }
  }
  T& operator*() const noexcept { return *impl_; }
  T* operator->() const noexcept { return impl_.get(); }
  T* get() const noexcept { return impl_.get(); }
  void reset() noexcept { impl_.reset(); }
  explicit operator bool() const noexcept { return static_cast<bool>(impl_); }
};

}  // namespace

PYBIND11_DECLARE_HOLDER_TYPE(T, IntrusivePtrNoGilDestructor<T>, true)

namespace {

BackendPtr optional_backend(const py::object& obj, const char* what) {
  if (obj.is_none()) return {};
  try {
    return obj.cast<BackendPtr>();
  } catch (const py::cast_error&) {
    throw py::type_error(std::string("cuda_p2p: ") + what +
                         " must be a torch.distributed Backend (e.g. ProcessGroupGloo) or None, "
                         "got " +
                         py::str(py::type::of(obj)).cast<std::string>());
  }
}

// The fused GEMM pipelines' part of the module (ops/fused_*.cpp; their dispatcher ops are
// registered by backend/dispatcher_fused_ops.cpp): Options.max_buffer_size, and the pipelines'
// diagnostics.
template <typename PgClass>
void bind_fused_pipelines(PgClass& pg) {
  using Options = ProcessGroupCudaP2P::Options;
  auto options = py::reinterpret_borrow<
      py::class_<Options, c10d::Backend::Options, c10::intrusive_ptr<Options>>>(pg.attr("Options"));
  options.def_property(
      "max_buffer_size", [](const Options& o) { return o.max_buffer_size; },
      [](Options& o, int64_t v) {
        TORCH_CHECK_VALUE(v > 0,
                          "cuda_p2p: Options.max_buffer_size must be a positive number of "
                          "bytes, got ",
                          v);
        o.max_buffer_size = v;
      },
      "The largest buffer (bytes) an op may grow the workspace to on its own (default 256 MiB); "
      "an op needing more processes its payload in rounds.");
  pg.def(
        "_set_pipeline_tracing",
        [](ProcessGroupCudaP2P& self, bool enable) {
          auto& state = self.pipeline_state();
          std::lock_guard<std::mutex> lock(state.mutex);
          state.tracing = enable;
          state.last_trace.clear();
        },
        py::arg("enable"),
        "Diagnostics: record a trace of every fused op's pipeline (host device).")
      .def(
          "_last_pipeline_trace",
          [](ProcessGroupCudaP2P& self) {
            auto& state = self.pipeline_state();
            std::lock_guard<std::mutex> lock(state.mutex);
            py::list out;
            for (const auto& e : state.last_trace) {
              out.append(py::make_tuple(e.stream, e.what, e.start_us, e.end_us));
            }
            return out;
          },
          "Diagnostics: the last fused op's trace, [(stream, what, start_us, end_us)]; stream 2 "
          "is the caller.");
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "cuda_p2p C++ backend";
  // Our classes derive from torch's c10d bindings: they must be registered first.
  py::module_::import("torch._C._distributed_c10d");

  auto pg = py::class_<ProcessGroupCudaP2P, c10d::Backend,
                       IntrusivePtrNoGilDestructor<ProcessGroupCudaP2P>>(
      m, "ProcessGroupCudaP2P",
      "The cuda_p2p c10d backend. Get it for a group with cuda_p2p.get_cuda_p2p_backend(group).");

  py::class_<ProcessGroupCudaP2P::Options, c10d::Backend::Options,
             c10::intrusive_ptr<ProcessGroupCudaP2P::Options>>(
      pg, "Options",
      "Options of a cuda_p2p process group; pass as pg_options to init_process_group/new_group.")
      .def(py::init<>())
      .def_property(
          "buffer_size", [](const ProcessGroupCudaP2P::Options& o) { return o.buffer_size; },
          [](ProcessGroupCudaP2P::Options& o, std::optional<int64_t> v) {
            TORCH_CHECK_VALUE(!v.has_value() || *v > 0,
                              "cuda_p2p: Options.buffer_size must be a positive number of bytes "
                              "or None, got ",
                              *v);
            o.buffer_size = v;
          },
          "Bytes of the symmetric buffer each rank shares with its peers (None: the default, "
          "32 MiB).")
      .def_readwrite("workspace_collectives", &ProcessGroupCudaP2P::Options::workspace_collectives,
                     "Run the collectives on the workspace when it is available (default True; "
                     "CUDA_P2P_WORKSPACE_COLLECTIVES=0 also sends them to the wrapped backend, "
                     "while the workspace stays up for everything else).")
      .def_property(
          "cuda_workspace_collectives",
          [](const Options& o) { return o.cuda_workspace_collectives; },
          [](Options& o, std::optional<bool> v) { o.cuda_workspace_collectives = v; },
          "Run the collectives on CUDA tensors on the CUDA workspace: True, False, or None "
          "(CUDA_P2P_CUDA_WORKSPACE_COLLECTIVES=1 turns them on, else off). Off, the default until "
          "they have been validated on a GPU, they go to the wrapped NCCL backend. CPU tensors and "
          "the fused ops are not affected.")
      .def_property(
          "workspace_device", &get_string<&Options::workspace_device>,
          parsed_string_setter<&Options::workspace_device>(cuda_p2p::parse_workspace_device,
                                                           "Options.workspace_device"),
          "Where the group's workspace lives: 'cuda' (the GPU bound by init_process_group("
          "device_id=...), else GPU LOCAL_RANK, else the current one), 'cpu' (host shared "
          "memory) or 'auto' (CUDA_P2P_WORKSPACE_DEVICE, else 'cuda' when a GPU is visible). "
          "Tensors on the other device go to the wrapped backend.")
      .def_readwrite("hierarchical", &ProcessGroupCudaP2P::Options::hierarchical,
                     "On a group whose ranks span hosts, run the collectives on CPU tensors "
                     "hierarchically: intra-host on each host's workspace, inter-host on the "
                     "wrapped backend (default True; CUDA_P2P_HIERARCHICAL=0 also turns it off).")
      .def_readwrite("enable_workspace", &ProcessGroupCudaP2P::Options::enable_workspace,
                     "Set up the P2P workspace (default True; CUDA_P2P_DISABLE_WORKSPACE=1 also "
                     "turns it off).")
      .def_property(
          "nccl_options",
          [](const ProcessGroupCudaP2P::Options& o) -> py::object {
            if (!o.nccl_options) return py::none();
            return py::cast(o.nccl_options);
          },
          [](ProcessGroupCudaP2P::Options& o, const py::object& v) {
            if (v.is_none()) {
              o.nccl_options.reset();
              return;
            }
            try {
              auto opts = v.cast<c10::intrusive_ptr<c10d::Backend::Options>>();
              TORCH_CHECK_TYPE(opts->backend == "nccl",
                               "cuda_p2p: Options.nccl_options must be a ProcessGroupNCCL.Options "
                               "or None, got options of backend '",
                               opts->backend, "'");
              o.nccl_options = std::move(opts);
            } catch (const py::cast_error&) {
              throw py::type_error(
                  "cuda_p2p: Options.nccl_options must be a ProcessGroupNCCL.Options or None, "
                  "got " +
                  py::str(py::type::of(v)).cast<std::string>());
            }
          },
          "Options handed to the wrapped NCCL backend (ProcessGroupNCCL.Options), or None.")
      .def_property(
          "host_streams", &get_string<&Options::host_streams>,
          parsed_string_setter<&Options::host_streams>(cuda_p2p::parse_host_streams,
                                                       "Options.host_streams"),
          "How a CPU group runs the fused pipelines' two streams: 'auto' (CUDA_P2P_HOST_STREAMS, "
          "else 'cooperative'), 'cooperative' (in the waiting thread) or 'threads' (a thread per "
          "stream, the GPU's concurrency).")
      .def_property(
          "all_gather_algo", &get_string<&Options::all_gather_algo>,
          parsed_string_setter<&Options::all_gather_algo>(cuda_p2p::ops::parse_all_gather_algo,
                                                          "Options.all_gather_algo"),
          "Workspace all-gather algorithm: 'auto' (by size; CUDA_P2P_ALL_GATHER_ALGO may force "
          "one), 'direct' or 'ring'.")
      .def_property(
          "reduce_scatter_algo", &get_string<&Options::reduce_scatter_algo>,
          parsed_string_setter<&Options::reduce_scatter_algo>(
              cuda_p2p::ops::parse_reduce_scatter_algo, "Options.reduce_scatter_algo"),
          "Workspace reduce-scatter algorithm: 'auto' (CUDA_P2P_REDUCE_SCATTER_ALGO may force "
          "one), 'direct' or 'ring'.")
      .def_property(
          "all_reduce_algo", &get_string<&Options::all_reduce_algo>,
          parsed_string_setter<&Options::all_reduce_algo>(cuda_p2p::ops::parse_all_reduce_algo,
                                                          "Options.all_reduce_algo"),
          "Workspace all-reduce algorithm: 'auto' (CUDA_P2P_ALL_REDUCE_ALGO may force one), "
          "'one_shot' or 'two_shot'.")
      .def_property(
          "all_reduce_rounds", &get_string<&Options::all_reduce_rounds>,
          parsed_string_setter<&Options::all_reduce_rounds>(cuda_p2p::ops::parse_all_reduce_rounds,
                                                            "Options.all_reduce_rounds"),
          "Rounds of a two-shot all-reduce of more than one chunk_bytes round on a host "
          "workspace: 'auto' (rank 0 chooses by time, one op ahead, between chunk_bytes rounds "
          "and the largest the buffer holds; "
          "CUDA_P2P_ALL_REDUCE_ROUNDS may force one), 'chunked' or 'large'.")
      .def_property(
          "zero_copy_agreement", &get_string<&Options::zero_copy_agreement>,
          parsed_string_setter<&Options::zero_copy_agreement>(
              cuda_p2p::ops::parse_zero_copy_agreement, "Options.zero_copy_agreement"),
          "How the ranks agree that a collective's inputs are symmetric tensors: 'auto' "
          "(CUDA_P2P_ZERO_COPY_AGREEMENT, else 'exchange' on the host, 'signature' on CUDA), "
          "'exchange' (host only), 'signature', or 'off' (never read them in place).")
      .def_property(
          "ring_steps", [](const Options& o) { return o.ring_steps; },
          [](Options& o, std::optional<int64_t> v) {
            TORCH_CHECK_VALUE(!v || *v > 0,
                              "cuda_p2p: Options.ring_steps must be a positive "
                              "multiple of the world size or None, got ",
                              v.value_or(0));
            o.ring_steps = v;
          },
          "Steps of the reduce-scatter ring, a multiple of the world size (None: "
          "CUDA_P2P_RING_STEPS, else the world size).")
      .def_property(
          "chunk_bytes", &get_count<&Options::chunk_bytes>,
          non_negative_setter<&Options::chunk_bytes>("Options.chunk_bytes"),
          "Bytes a rank stages per round of a workspace collective (0: half the buffer; None: "
          "CUDA_P2P_CHUNK_BYTES, else the default).")
      .def_property(
          "all_reduce_one_shot_max_bytes", &get_count<&Options::all_reduce_one_shot_max_bytes>,
          non_negative_setter<&Options::all_reduce_one_shot_max_bytes>(
              "Options.all_reduce_one_shot_max_bytes"),
          "Largest all-reduce (bytes) that 'auto' runs one-shot (None: the measured default).")
      .def_property(
          "all_gather_ring_max_bytes", &get_count<&Options::all_gather_ring_max_bytes>,
          non_negative_setter<&Options::all_gather_ring_max_bytes>(
              "Options.all_gather_ring_max_bytes"),
          "Largest all-gather output (bytes) that 'auto' runs as a unidirectional ring on 3+ "
          "ranks, above: direct (None: the measured default).")
      .def_property(
          "reduce_scatter_ring_max_bytes", &get_count<&Options::reduce_scatter_ring_max_bytes>,
          non_negative_setter<&Options::reduce_scatter_ring_max_bytes>(
              "Options.reduce_scatter_ring_max_bytes"),
          "Largest reduce-scatter input (bytes) that 'auto' runs as a ring, above: direct "
          "(None: the measured default).")
      .def_property(
          "cross_memory", [](const Options& o) { return o.cross_memory; },
          [](Options& o, std::optional<bool> v) { o.cross_memory = v; },
          "Copy-free reads of peers' tensors on the host (process_vm_readv) where the system "
          "allows them: True, False, or None (CUDA_P2P_CROSS_MEMORY, else off).")
      .def_property(
          "cross_memory_min_bytes", &get_count<&Options::cross_memory_min_bytes>,
          non_negative_setter<&Options::cross_memory_min_bytes>("Options.cross_memory_min_bytes"),
          "Smallest payload (bytes) the direct all-gather / reduce-scatter and broadcast read "
          "copy-free (None: the measured default).")
      .def_property(
          "parallel_min_bytes", &get_count<&Options::parallel_min_bytes>,
          non_negative_setter<&Options::parallel_min_bytes>("Options.parallel_min_bytes"),
          "On the host, copies and reductions of at least this many bytes use the rank's "
          "intra-op threads when it has 2+ (0: never; None: CUDA_P2P_PARALLEL_MIN_BYTES, else "
          "the measured default).")
      .def_property(
          "symmetric_heap_size", [](const Options& o) { return o.symmetric_heap_size; },
          [](Options& o, std::optional<int64_t> v) {
            TORCH_CHECK_VALUE(!v || *v > 0,
                              "cuda_p2p: Options.symmetric_heap_size must be a positive number "
                              "of bytes or None, got ",
                              *v);
            o.symmetric_heap_size = v;
          },
          "Bytes of each rank's symmetric heap (cuda_p2p.empty, use_symmetric_memory): on the host "
          "a sparse mapping, on CUDA committed device memory; it does not grow (None: "
          "CUDA_P2P_SYMMETRIC_HEAP_SIZE, else 1 GiB).")
      .def_property(
          "mailbox_slot_bytes", [](const Options& o) { return o.mailbox_slot_bytes; },
          [](Options& o, std::optional<int64_t> v) {
            TORCH_CHECK_VALUE(!v || (*v >= 4096 && *v % 4096 == 0),
                              "cuda_p2p: Options.mailbox_slot_bytes must be a positive multiple "
                              "of 4096 bytes or None, got ",
                              *v);
            o.mailbox_slot_bytes = v;
          },
          "Bytes of each slot of the send/recv mailboxes on a host workspace (two per pair of "
          "ranks): a message up to two slots is sent eagerly, a larger one streams through them "
          "(None: CUDA_P2P_MAILBOX_SLOT_BYTES, else 1 MiB).")
      .def_property(
          "inline_all_reduce", [](const Options& o) { return o.inline_all_reduce; },
          [](Options& o, std::optional<bool> v) { o.inline_all_reduce = v; },
          "On a host workspace, a one-shot all-reduce that fits one round runs on the calling "
          "thread without enqueueing: True, False, or None (CUDA_P2P_INLINE_ALL_REDUCE, else "
          "on).")
      .def_property(
          "fused_min_flops", &get_count<&Options::fused_min_flops>,
          non_negative_setter<&Options::fused_min_flops>("Options.fused_min_flops"),
          "The fused ops' 'auto' runs the fused pipeline from this many GEMM flops per rank "
          "(2*M*N*K) on, below it the unfused workspace collective and matmul (None: "
          "CUDA_P2P_FUSED_MIN_FLOPS, else the device's measured default).");

  pg.def(py::init([](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     c10::intrusive_ptr<ProcessGroupCudaP2P::Options> options,
                     const py::object& cpu_backend, const py::object& cuda_backend,
                     std::optional<int64_t> bound_device) {
           auto cpu = optional_backend(cpu_backend, "cpu_backend");
           auto cuda = optional_backend(cuda_backend, "cuda_backend");
           return IntrusivePtrNoGilDestructor<ProcessGroupCudaP2P>(
               c10::make_intrusive<ProcessGroupCudaP2P>(store, rank, size, std::move(options),
                                                        std::move(cpu), std::move(cuda),
                                                        bound_device));
         }),
         py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("options"),
         py::arg("cpu_backend"), py::arg("cuda_backend") = py::none(),
         py::arg("bound_device") = py::none(),
         "`bound_device`: the index of the GPU bound by init_process_group(device_id=...), for "
         "a CUDA workspace (NOTE [The workspace's GPU] in backend/config.cpp).")
      .def_property_readonly("options", &ProcessGroupCudaP2P::options)
      .def(
          "wrapped_backend",
          [](const ProcessGroupCudaP2P& self, const std::string& device) -> py::object {
            auto b = self.wrapped_backend(c10::Device(device).type());
            if (!b) return py::none();
            return py::cast(b);
          },
          py::arg("device"),
          "The wrapped backend for 'cpu' (Gloo) or 'cuda' (NCCL), or None where there is none.")
      .def("is_p2p_available", &ProcessGroupCudaP2P::is_p2p_available,
           "Whether the symmetric P2P workspace is set up (all ranks on one host, not disabled).")
      .def("p2p_unavailable_reason", &ProcessGroupCudaP2P::p2p_unavailable_reason,
           "Why the workspace is unavailable ('' when it is available).")
      .def("get_buffer_size", &ProcessGroupCudaP2P::get_buffer_size,
           "Bytes of each rank's P2P buffer (0 when the workspace is unavailable).")
      .def(
          "get_p2p_buffer",
          [](const ProcessGroupCudaP2P& self, int64_t rank, std::vector<int64_t> sizes,
             at::ScalarType dtype, int64_t storage_offset) {
            return self.get_p2p_buffer(rank, sizes, dtype, storage_offset);
          },
          py::arg("rank"), py::arg("sizes"), py::arg("dtype"), py::arg("storage_offset") = 0,
          "A tensor aliasing `rank`'s P2P buffer (CPU shared memory or a CUDA IPC mapping).")
      .def(
          "intra_node_barrier",
          [](ProcessGroupCudaP2P& self, std::optional<std::vector<int64_t>> ranks,
             std::optional<double> timeout) {
            std::optional<cuda_p2p::Millis> t;
            if (timeout) {
              TORCH_CHECK_VALUE(*timeout > 0,
                                "cuda_p2p intra_node_barrier: timeout must be a "
                                "positive number of seconds, got ",
                                *timeout);
              t = cuda_p2p::Millis(static_cast<int64_t>(*timeout * 1000.0 + 0.5));
            }
            py::gil_scoped_release release;
            self.intra_node_barrier(ranks.value_or(std::vector<int64_t>{}), t);
          },
          py::arg("ranks") = py::none(), py::arg("timeout") = py::none(),
          "Barrier through the workspace's signal pads among `ranks` (default: all). `timeout` in "
          "seconds (default: the group's timeout).")
      .def(
          "symmetric_empty",
          [](ProcessGroupCudaP2P& self, std::vector<int64_t> sizes, at::ScalarType dtype,
             std::optional<at::Device> device) {
            py::gil_scoped_release release;
            return self.symmetric_empty(sizes, dtype, device);
          },
          py::arg("sizes"), py::arg("dtype"), py::arg("device") = py::none(),
          "Collective: a tensor in this rank's symmetric heap (use cuda_p2p.empty).")
      .def("symmetric_device", &ProcessGroupCudaP2P::symmetric_device,
           "The device of the group's symmetric heap: its workspace's (cpu, or the GPU the group "
           "was created on).")
      .def(
          "symmetric_allocator",
          [](ProcessGroupCudaP2P& self) -> py::object {
            std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator> allocator;
            {
              py::gil_scoped_release release;
              allocator = self.symmetric_allocator();
            }
#ifdef CUDA_P2P_WITH_CUDA
            return py::cast(allocator);  // torch registers it: torch._C._cuda_CUDAAllocator
#else
            return py::none();  // not reached: symmetric_allocator raises without CUDA
#endif
          },
          "Collective the first time (creates the heap): the allocator of a torch.cuda.MemPool "
          "whose segments are carved from this rank's symmetric heap (CUDA groups; use "
          "cuda_p2p.get_mem_pool).")
      .def(
          "_heap_segments",
          [](ProcessGroupCudaP2P& self) {
            py::gil_scoped_release release;
            return self.heap_segments();
          },
          "Test hook: the heap segments the MemPool allocator takes and returns (any device).")
#ifdef CUDA_P2P_WITH_CUDA
      .def(
          "_heap_pool_allocator",
          [](ProcessGroupCudaP2P& self) {
            std::shared_ptr<cuda_p2p::detail::HeapSegments> segments;
            {
              py::gil_scoped_release release;
              segments = self.heap_segments();
            }
            return py::cast(cuda_p2p::detail::make_pool_allocator(segments, -1));
          },
          "Test hook: a MemPool allocator over this group's heap on either device (never called "
          "on the host: it lets the host tests check its type and that it keeps the heap mapped).")
#endif
      .def(
          "ensure_symmetric_heap",
          [](ProcessGroupCudaP2P& self) {
            py::gil_scoped_release release;
            self.ensure_symmetric_heap();
          },
          "Collective, once: creates the group's symmetric heap.")
      // torch's Backend binds these too; ours release the GIL, as the first allocation is a
      // collective (it creates the heap). NOTE [Process-group allocation for FSDP2].
      .def(
          "supports_tensor_alloc",
          [](ProcessGroupCudaP2P& self, const at::Device& device) {
            return self.supportsTensorAlloc(device.index()) &&
                   device.type() == self.symmetric_device().type();
          },
          py::arg("device"),
          "Whether allocate_tensor serves `device`: the heap's device, where the collectives read "
          "heap tensors in place (FSDP2's set_allocate_memory_from_process_group_for_comm).")
      .def(
          "allocate_tensor",
          [](ProcessGroupCudaP2P& self, int64_t size, at::ScalarType dtype,
             const at::Device& device) {
            py::gil_scoped_release release;
            return self.allocateTensor(size, at::TensorOptions().dtype(dtype).device(device));
          },
          py::arg("size"), py::kw_only(), py::arg("dtype"), py::arg("device"),
          "Collective: a 1-d tensor of `size` elements in this rank's symmetric heap (an ordinary "
          "one, counted allocate_tensor.fallback, when the heap cannot hold it).")
      .def("symmetric_offset", &ProcessGroupCudaP2P::symmetric_offset, py::arg("tensor"),
           "The offset of the tensor's data in this rank's symmetric heap, or -1.")
      .def("symmetric_peer_tensor", &ProcessGroupCudaP2P::symmetric_peer_tensor, py::arg("tensor"),
           py::arg("rank"),
           "`tensor` (in this rank's symmetric heap) as `rank` holds it: its sizes, strides and "
           "dtype at the same offset of `rank`'s heap, aliasing this rank's mapping of it.")
      .def("symmetric_heap_info", &ProcessGroupCudaP2P::symmetric_heap_info,
           "{created, capacity, used_bytes, live_blocks, deferred_blocks, largest_free, segments, "
           "segment_bytes} of the symmetric heap (live_blocks: blocks with a tensor; "
           "deferred_blocks: freed on a CUDA heap, reclaimed in stream order by a later "
           "allocation; segments: those of its MemPool allocator, cached ones included).")
      .def("get_counters", &ProcessGroupCudaP2P::counters,
           "Which paths ran: {'all_reduce.one_shot': 3, 'all_reduce.wrapped': 1, ...}.")
      .def("reset_counters", &ProcessGroupCudaP2P::reset_counters)
      .def(
          "_knob_values",
          [](const ProcessGroupCudaP2P& self) {
            py::list out;
            for (const auto& v : self.config().knobs) {
              py::dict d;
              d["option"] = v.knob->option;
              d["env"] = v.knob->env;
              d["value"] = v.value;
              d["source"] = v.source;
              out.append(d);
            }
            return out;
          },
          "Each knob's value for this group and where it came from ('Options', 'environment' or "
          "'default'), as they were when the group was created: for python -m cuda_p2p and "
          "CUDA_P2P_DEBUG=INFO.")
      .def(
          "_wrapped_backends",
          [](const ProcessGroupCudaP2P& self) {
            py::dict d;
            for (const auto type : {c10::DeviceType::CPU, c10::DeviceType::CUDA}) {
              if (auto b = self.wrapped_backend(type)) {
                d[py::str(c10::DeviceTypeName(type, /*lower_case=*/true))] = b->getBackendName();
              }
            }
            return d;
          },
          "The wrapped backends by tensor device: {'cpu': 'gloo', 'cuda': 'nccl'} (no 'cuda' "
          "where the group was created without a GPU).")
      .def(
          "_debug", [](const ProcessGroupCudaP2P& self) { return self.config().debug; },
          "Whether CUDA_P2P_DEBUG=INFO was set when the group was created.")
      .def(
          "get_collective_config",
          [](const ProcessGroupCudaP2P& self) {
            const auto& c = self.collective_config();
            const auto* ws = self.workspace();
            py::dict d;
            d["all_gather_algo"] = cuda_p2p::ops::to_string(c.all_gather);
            d["reduce_scatter_algo"] = cuda_p2p::ops::to_string(c.reduce_scatter);
            d["all_reduce_algo"] = cuda_p2p::ops::to_string(c.all_reduce);
            d["all_reduce_rounds"] = cuda_p2p::ops::to_string(c.all_reduce_rounds);
            d["ring_steps"] = c.ring_steps == 0 ? self.getSize() : c.ring_steps;
            d["chunk_bytes"] = c.chunk_bytes;
            d["all_reduce_one_shot_max_bytes"] = c.all_reduce_one_shot_max_bytes;
            d["all_gather_ring_max_bytes"] = c.all_gather_ring_max_bytes;
            d["reduce_scatter_ring_max_bytes"] = c.reduce_scatter_ring_max_bytes;
            d["cross_memory_min_bytes"] = c.cross_memory_min_bytes;
            d["parallel_min_bytes"] = c.parallel_min_bytes;
            d["inline_all_reduce"] = c.inline_all_reduce;
            // "auto" resolved by the workspace's device (NOTE [Zero-copy collectives]).
            d["zero_copy_agreement"] = cuda_p2p::ops::to_string(cuda_p2p::ops::resolve_agreement(
                c.zero_copy_agreement, !ws || ws->device().tensor_device().is_cpu()));
            d["cross_memory"] = self.uses_cross_memory();
            d["cross_memory_reason"] = self.cross_memory_reason();
            d["fused_min_flops"] = self.config().fused_min_flops_for(c10::DeviceType::CPU);
            d["mailbox_slot_bytes"] = self.config().mailbox_slot_bytes;
            d["workspace_collectives"] = self.uses_workspace_collectives();
            d["workspace_collectives_reason"] = self.workspace_collectives_reason();
            d["cuda_workspace_collectives"] = self.options()->cuda_workspace_collectives;
            // NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp.
            d["workspace_device"] =
                ws ? py::object(py::str(ws->device().tensor_device().is_cpu() ? "cpu" : "cuda"))
                   : py::object(py::none());
            d["ranks_cpus"] = ws ? ws->device().ranks_cpus() : 0;
            d["oversubscribed"] = ws ? ws->device().oversubscribed() : false;
            return d;
          },
          "The workspace collectives' effective settings (Options, then environment variables, "
          "then the defaults) and whether they run at all.")
      .def("all_gather_v", &ProcessGroupCudaP2P::all_gather_v, py::arg("tensor"), py::arg("sizes"),
           py::call_guard<py::gil_scoped_release>(),
           "Collective: concatenates along dim 0 the rows of every rank (sizes[r] rows from rank "
           "r) in rank order.")
      .def("all_to_all_v", &ProcessGroupCudaP2P::all_to_all_v, py::arg("tensor"),
           py::arg("input_splits"), py::call_guard<py::gil_scoped_release>(),
           "Collective: sends input_splits[q] rows (dim 0) of tensor to rank q; returns (the rows "
           "received from every rank in rank order, how many came from each rank).")
      .def_static(
          "_hierarchy_host",
          [](const c10::intrusive_ptr<ProcessGroupCudaP2P::Options>& options,
             int size) -> py::object {
            const auto c = cuda_p2p::resolve_config(*options, size);
            if (!c.workspace || !c.collectives || !c.hierarchical) return py::none();
            return py::str(cuda_p2p::host_identity(c.workspace_options.host_id));
          },
          py::arg("options"), py::arg("size"),
          "For the Python layer: this process's host identity when a group with these options "
          "would run hierarchically across hosts, else None.")
      .def(
          "_set_hierarchy",
          [](ProcessGroupCudaP2P& self, const std::vector<int64_t>& host_of,
             const py::object& intra, const py::object& inter) {
            self.set_hierarchy(host_of, optional_backend(intra, "intra"),
                               optional_backend(inter, "inter"));
          },
          py::arg("host_of"), py::arg("intra"), py::arg("inter"),
          "For the Python layer, at group construction: the host of every rank, the cuda_p2p "
          "backend over this host's ranks and the backend over this rank's local-index peers on "
          "the other hosts (backend/hierarchical.hpp).")
      .def("_set_hierarchical_agreement", &ProcessGroupCudaP2P::set_hierarchical_agreement,
           py::arg("on"),
           "Bench knob (bench/bench_collectives.py --agreement-cost), not for users: off skips "
           "the agreement of a hierarchical group's collectives (NOTE [Hierarchical agreement]), "
           "to measure its cost; mismatched arguments then crash or hang the group.")
      .def(
          "hierarchy",
          [](const ProcessGroupCudaP2P& self) -> py::object {
            const auto* h = self.hierarchy();
            if (h == nullptr) return py::none();
            const auto& layout = h->layout();
            py::dict d;
            d["hosts"] = layout.hosts;
            d["host"] = layout.host.at(self.getRank());
            d["local_rank"] = layout.local.at(self.getRank());
            d["even"] = layout.even();
            d["intra"] = py::cast(h->intra());
            d["inter"] = h->inter() ? py::cast(h->inter()) : py::none();
            return d;
          },
          "None on a group within one host; on a group spanning hosts that runs its collectives "
          "hierarchically: {'hosts': ranks per host, 'host', 'local_rank', 'even', 'intra': the "
          "backend over this host's ranks, 'inter': the backend over this rank's local-index "
          "peers (None where that local index is not on every host)}.")
      .def("ensure_min_buffer_size", &ProcessGroupCudaP2P::ensure_min_buffer_size,
           py::arg("nbytes"), py::call_guard<py::gil_scoped_release>(),
           "Collective: grows every rank's buffer to at least the largest nbytes requested.");

  bind_fused_pipelines(pg);

  // What the MemPool allocator's functions call, for the host tests (tests/python/
  // test_zero_copy.py): addresses as integers.
  py::class_<cuda_p2p::detail::HeapSegments, std::shared_ptr<cuda_p2p::detail::HeapSegments>>(
      m, "_HeapSegments")
      .def(
          "allocate",
          [](cuda_p2p::detail::HeapSegments& self, size_t bytes) {
            return reinterpret_cast<uintptr_t>(self.allocate(bytes));
          },
          py::arg("nbytes"))
      .def(
          "free",
          [](cuda_p2p::detail::HeapSegments& self, uintptr_t ptr) {
            self.free(reinterpret_cast<void*>(ptr));
          },
          py::arg("ptr"))
      .def("segments", &cuda_p2p::detail::HeapSegments::segments)
      .def("bytes", &cuda_p2p::detail::HeapSegments::bytes);

  // The symmetric heap's allocator alone, for its unit tests (tests/python/test_zero_copy.py).
  py::class_<cuda_p2p::HeapAllocator>(m, "_HeapAllocator")
      .def(py::init<int64_t, int64_t>(), py::arg("capacity"),
           py::arg("alignment") = cuda_p2p::HeapAllocator::kDefaultAlignment)
      .def("allocate", &cuda_p2p::HeapAllocator::allocate, py::arg("nbytes"))
      .def("free", &cuda_p2p::HeapAllocator::free, py::arg("offset"))
      .def("used_bytes", &cuda_p2p::HeapAllocator::used_bytes)
      .def("live_blocks", &cuda_p2p::HeapAllocator::live_blocks)
      .def("largest_free", &cuda_p2p::HeapAllocator::largest_free)
      .def("free_ranges", &cuda_p2p::HeapAllocator::free_ranges);

  m.def("_parallel_grain", &cuda_p2p::ops::parallel_grain, py::arg("bytes"), py::arg("esize"),
        py::arg("min_bytes"),
        "Test hook: the elements per piece a host copy / reduction of `bytes` is split into on "
        "this process's intra-op threads from `min_bytes` on, or 0 (NOTE [Intra-op threads]).");
  m.def("_set_default_group_name", &cuda_p2p::set_default_group_name, py::arg("group_name"),
        "Records the name of torch's default group, a cuda_p2p group being created: the dispatcher "
        "ops' group_name '' (NOTE [The default group's name] in backend/dispatcher_group.cpp).");

  m.def(
      "_core_round_trip_ns",
      [](int cpu_a, int cpu_b, double seconds) {
        if (!(seconds > 0 && seconds <= 1)) {
          throw py::value_error("_core_round_trip_ns: expected seconds in (0, 1], got " +
                                std::to_string(seconds));
        }
        cuda_p2p::host::CoreRoundTrip r;
        {
          py::gil_scoped_release no_gil;
          r = cuda_p2p::host::core_round_trip(
              cpu_a, cpu_b,
              std::chrono::microseconds(std::max<int64_t>(1, static_cast<int64_t>(seconds * 1e6))));
        }
        py::dict d;
        d["min_ns"] = r.min_ns;
        d["median_ns"] = r.median_ns;
        d["batches"] = r.batches;
        return d;
      },
      py::arg("cpu_a"), py::arg("cpu_b"), py::arg("seconds") = 0.002,
      "Bounces a cache line between threads pinned to two CPUs for `seconds`: the round trip in "
      "ns (min and median over batches of 16). The bench's placement probe (NOTE [Core "
      "placement] in p2p_workspace/host/core_probe.cpp).");

  m.def(
      "_choose_cuda_device",
      [](std::optional<int64_t> bound_device, int device_count, int current_device,
         const std::map<std::string, std::string>& env) {
        auto choice = cuda_p2p::choose_cuda_device(
            bound_device, device_count, current_device,
            [&env](const std::string& name) -> std::optional<std::string> {
              auto it = env.find(name);
              if (it == env.end() || it->second.empty()) return std::nullopt;
              return it->second;
            });
        return py::make_tuple(choice.index, choice.from);
      },
      py::arg("bound_device"), py::arg("device_count"), py::arg("current_device"), py::arg("env"),
      "Test hook: (index, rule) of the GPU a CUDA workspace would take, with `env` as the "
      "environment (NOTE [The workspace's GPU] in backend/config.cpp).");
  m.def(
      "_build_info",
      [] {
        py::dict d;
#ifdef CUDA_P2P_WITH_CUDA
        d["cuda"] = true;
#ifdef CUDA_P2P_CUDA_ARCHS_TEXT
        d["cuda_archs"] = CUDA_P2P_CUDA_ARCHS_TEXT;
#else
        d["cuda_archs"] = "";
#endif
#else
        d["cuda"] = false;
        d["cuda_archs"] = "";
#endif
        d["host_reduction"] = cuda_p2p::ops::host_reduction_isa();
        return d;
      },
      "How this extension was built: {'cuda': CUDA sources compiled in, 'cuda_archs': their "
      "architectures, 'host_reduction': the host reduction kernel's build used on this CPU}.");

  m.def("_debug_line", &cuda_p2p::config::debug_line, py::arg("line"),
        "Writes one line to stderr in one piece (NOTE [Debug lines] in backend/config.cpp).");

  m.def(
      "_config_knobs",
      [] {
        py::list out;
        for (const auto& k : cuda_p2p::config::knobs()) {
          py::dict d;
          d["option"] = k.option;
          d["env"] = k.env;
          d["type"] = k.type;
          d["default"] = k.default_value;
          d["help"] = k.help;
          out.append(d);
        }
        return out;
      },
      "Every configuration knob (backend/config.cpp): Options field, environment variable, "
      "type, default and help; docs/configuration.md is checked against it.");
}
