// cuda_p2p._C._testing: hooks for the tests and the benches, not for users. They reach into the
// backend's parts (the heap's allocator and segments, the intra-op split, the GPU a workspace
// would take, the hierarchical agreement) without the production module carrying them.
#pragma once

#include <pybind11/pybind11.h>

namespace cuda_p2p::python {

// Binds the submodule `_testing` of `m` (cuda_p2p._C).
void bind_testing(pybind11::module_& m);

}  // namespace cuda_p2p::python
