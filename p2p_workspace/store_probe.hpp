// Whether a c10d store's server is known to be gone, found out without calling the store (NOTE
// [Quiet teardown] in store_probe.cpp).
#pragma once

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace cuda_p2p {

// True when `store` is (a prefix of) a TCPStore whose server has closed this process's connection
// to it: its process has exited. False for any other store, and for a server this process has no
// connection to (another host's, or none was ever made). Never throws and logs nothing.
bool store_server_gone(c10d::Store& store) noexcept;

}  // namespace cuda_p2p
