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
#include "python/options.hpp"
#include "python/testing.hpp"

namespace py = pybind11;

namespace {

using cuda_p2p::ProcessGroupCudaP2P;
using Options = ProcessGroupCudaP2P::Options;
using BackendPtr = c10::intrusive_ptr<c10d::Backend>;

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
// registered by backend/dispatcher_fused_ops.cpp): the pipelines' diagnostics.
template <typename PgClass>
void bind_fused_pipelines(PgClass& pg) {
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

  cuda_p2p::python::bind_options(pg);

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
      .def(
          "perform_nocolor_split", [](ProcessGroupCudaP2P&, const at::Device&) {},
          py::arg("device"),
          "For torch's new_group on a rank outside the new group, when the default group has a "
          "bound GPU and splits (NOTE [Child groups] in backend/child_groups.cpp): NCCL's "
          "ncclCommSplit needs every rank of the parent, but a cuda_p2p group made by new_group "
          "creates its wrapped NCCL anew among its members, so there is nothing to take part in.")
      .def(
          "_set_cuda_backend_factory",
          [](ProcessGroupCudaP2P& self, py::function factory) {
            // Held and released with the GIL: a group may go in a thread without it.
            std::shared_ptr<py::function> fn(new py::function(std::move(factory)),
                                             [](py::function* f) {
                                               py::gil_scoped_acquire gil;
                                               delete f;
                                             });
            self.set_cuda_backend_factory(
                [fn](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout, const std::vector<uint64_t>& global_ranks) {
                  py::gil_scoped_acquire gil;
                  return (*fn)(store, rank, size, timeout, global_ranks)
                      .cast<c10::intrusive_ptr<c10d::Backend>>();
                });
          },
          py::arg("factory"),
          "factory(store, rank, size, timeout, global_ranks) -> a fresh CUDA backend (NCCL): what "
          "a shrink gives its child when the wrapped CUDA backend never ran anything (NOTE "
          "[Shrinking a CUDA backend never used] in backend/child_groups.cpp).")
      .def("is_p2p_available", &ProcessGroupCudaP2P::is_p2p_available,
           "Whether the symmetric P2P workspace is set up (all ranks on one host, not disabled).")
      .def("p2p_unavailable_reason", &ProcessGroupCudaP2P::p2p_unavailable_reason,
           "Why the workspace is unavailable ('' when it is available).")
      .def("_block_memory", &ProcessGroupCudaP2P::block_memory,
           "What the workspace's blocks are: memfd, cuMem (POSIX descriptors) or CUDA IPC "
           "(legacy, with the reason); '' without a workspace.")
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
          "heap tensors zero-copy (FSDP2's set_allocate_memory_from_process_group_for_comm).")
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
      .def("check", &ProcessGroupCudaP2P::check, py::call_guard<py::gil_scoped_release>(),
           "Raises the group's failure (cuda_p2p.check).")
      .def("_lost_context", &ProcessGroupCudaP2P::lost_context,
           "Why a kernel of the workspace gave up with an error that loses the CUDA context (the "
           "host with CUDA's semantics: its model of a trap); '' while none did.")
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
            const auto* ws = self.workspace();
            // The knobs' values (NOTE [Configuration rules]), read in the workspace's context.
            py::dict d = cuda_p2p::python::knob_config(
                self.config(), {self.getSize(), !ws || ws->device().tensor_device().is_cpu()});
            // What the group runs, which the knobs ask for but the group decides.
            d["cross_memory"] = self.uses_cross_memory();
            d["cross_memory_reason"] = self.cross_memory_reason();
            d["workspace_collectives"] = self.uses_workspace_collectives();
            d["workspace_collectives_reason"] = self.workspace_collectives_reason();
            // NOTE [The workspace's device] in backend/ProcessGroupCudaP2P.cpp.
            d["workspace_device"] =
                ws ? py::object(py::str(ws->device().tensor_device().is_cpu() ? "cpu" : "cuda"))
                   : py::object(py::none());
            const cuda_p2p::HostPaths* host = ws ? ws->device().host_paths() : nullptr;
            d["ranks_cpus"] = host ? host->ranks_cpus() : 0;
            d["oversubscribed"] = host ? host->oversubscribed() : false;
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
      .def_static("_check_options", &ProcessGroupCudaP2P::check_options, py::arg("options"),
                  py::arg("size"), py::arg("wraps_cuda"),
                  "For the Python layer, before a group's rendezvous: raises what the "
                  "constructor would of these options alone.")
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
        d["busy"] = r.busy;
        return d;
      },
      py::arg("cpu_a"), py::arg("cpu_b"), py::arg("seconds") = 0.002,
      "Bounces a cache line between threads pinned to two CPUs for `seconds`: the round trip in "
      "ns (min and median over batches of 16), and busy=True when fewer than 32 batches completed "
      "within `seconds` + 1 s (a CPU busy with something else). The bench's placement probe "
      "(NOTE [Core placement] in p2p_workspace/host/core_probe.cpp).");

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
#ifdef CUDA_P2P_WITH_WINDOWS
        d["windows"] = true;
#else
        d["windows"] = false;
#endif
        return d;
      },
      "How this extension was built: {'cuda': CUDA sources compiled in, 'cuda_archs': their "
      "architectures, 'host_reduction': the host reduction kernel's build used on this CPU, "
      "'windows': one-sided windows compiled in (torch's c10d has them: docs/windows.md)}.");

  m.def("_debug_line", &cuda_p2p::config::debug_line, py::arg("line"),
        "Writes one line to stderr in one piece (NOTE [Debug lines] in backend/config.cpp).");

  cuda_p2p::python::bind_knob_table(m);
  cuda_p2p::python::bind_testing(m);
}
