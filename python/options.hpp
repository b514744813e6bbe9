// The Python face of the knob table (backend/config.hpp, NOTE [Configuration rules]):
// ProcessGroupCudaP2P.Options with one property per knob, the table itself, and the knob values
// get_collective_config reports. All of it is generated from config::knobs().
#pragma once

#include <pybind11/pybind11.h>

#include "backend/config.hpp"

namespace cuda_p2p::python {

// Binds ProcessGroupCudaP2P.Options inside `pg` (the ProcessGroupCudaP2P class): a property per
// Options knob, whose setter refuses with config::check what the resolution refuses.
void bind_options(pybind11::handle pg);

// Binds cuda_p2p._C._config_knobs(): every knob's row, for the docs table and the tests.
void bind_knob_table(pybind11::module_& m);

// The value of every reported knob (Knob::reported) of a group's Config, keyed by its Options
// field.
pybind11::dict knob_config(const Config& config, const config::Context& ctx);

}  // namespace cuda_p2p::python
