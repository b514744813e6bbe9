#include "python/testing.hpp"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#ifdef CUDA_P2P_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <map>
#include <optional>
#include <string>

#include "backend/ProcessGroupCudaP2P.hpp"
#include "backend/config.hpp"
#include "backend/symmetric_allocator.hpp"
#include "ops/reduction.hpp"
#include "p2p_workspace/symmetric_heap.hpp"

namespace py = pybind11;

namespace cuda_p2p::python {

void bind_testing(py::module_& m) {
  py::module_ t = m.def_submodule(
      "_testing", "Hooks for cuda_p2p's tests and benches (python/testing.hpp), not for users.");

  // What the MemPool allocator's functions call, for the host tests (tests/python/
  // test_zero_copy.py): addresses as integers.
  py::class_<detail::HeapSegments, std::shared_ptr<detail::HeapSegments>>(t, "HeapSegments")
      .def(
          "allocate",
          [](detail::HeapSegments& self, size_t bytes) {
            return reinterpret_cast<uintptr_t>(self.allocate(bytes));
          },
          py::arg("nbytes"))
      .def(
          "free",
          [](detail::HeapSegments& self, uintptr_t ptr) {
            self.free(reinterpret_cast<void*>(ptr));
          },
          py::arg("ptr"))
      .def("segments", &detail::HeapSegments::segments)
      .def("bytes", &detail::HeapSegments::bytes);
  t.def(
      "heap_segments",
      [](ProcessGroupCudaP2P& backend) {
        py::gil_scoped_release release;
        return backend.heap_segments();
      },
      py::arg("backend"),
      "Collective the first time (creates the heap): the heap segments the MemPool allocator of "
      "`backend` takes and returns (any device).");
#ifdef CUDA_P2P_WITH_CUDA
  t.def(
      "heap_pool_allocator",
      [](ProcessGroupCudaP2P& backend) {
        std::shared_ptr<detail::HeapSegments> segments;
        {
          py::gil_scoped_release release;
          segments = backend.heap_segments();
        }
        return py::cast(detail::make_pool_allocator(segments, -1));
      },
      py::arg("backend"),
      "A MemPool allocator over the group's heap on either device (never called on the host: it "
      "lets the host tests check its type and that it keeps the heap mapped).");
#endif

  // The symmetric heap's allocator alone, for its unit tests
  // (tests/python/workspace/test_zero_copy.py).
  py::class_<HeapAllocator>(t, "HeapAllocator")
      .def(py::init<int64_t, int64_t>(), py::arg("capacity"),
           py::arg("alignment") = HeapAllocator::kDefaultAlignment)
      .def("allocate", &HeapAllocator::allocate, py::arg("nbytes"))
      .def("free", &HeapAllocator::free, py::arg("offset"))
      .def("used_bytes", &HeapAllocator::used_bytes)
      .def("live_blocks", &HeapAllocator::live_blocks)
      .def("largest_free", &HeapAllocator::largest_free)
      .def("free_ranges", &HeapAllocator::free_ranges);

  t.def("parallel_grain", &ops::parallel_grain, py::arg("bytes"), py::arg("esize"),
        py::arg("min_bytes"),
        "The elements per piece a host copy / reduction of `bytes` is split into on this "
        "process's intra-op threads from `min_bytes` on, or 0 (NOTE [Intra-op threads]).");

  t.def(
      "choose_cuda_device",
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
      "(index, rule) of the GPU a CUDA workspace would take, with `env` as the environment (NOTE "
      "[The workspace's GPU] in backend/config.cpp).");

  t.def(
      "set_hierarchical_agreement",
      [](ProcessGroupCudaP2P& backend, bool on) { backend.set_hierarchical_agreement(on); },
      py::arg("backend"), py::arg("on"),
      "Bench knob (bench/bench_collectives.py --agreement-cost): off skips the agreement of a "
      "hierarchical group's collectives (NOTE [Hierarchical agreement]), to measure its cost; "
      "mismatched arguments then crash or hang the group.");
}

}  // namespace cuda_p2p::python
