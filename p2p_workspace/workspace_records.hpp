// What the ranks of a workspace exchange through the c10d store at rendezvous, and how: the
// records (NOTE [Workspace records]: the store is not trusted, so each is parsed strictly), the
// CPU masks, the failure records of a rank that could not allocate, the exchange itself and the
// claim of a rank's slot (NOTE [One job per store]). Used by symmetric_workspace.cpp.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <utility>
#include <vector>

#include "p2p_workspace/device.hpp"  // Millis

namespace cuda_p2p::records {

// Lower-case hex of `bytes`, and back (`s` already checked to be hex of even length).
std::string hex(const std::vector<uint8_t>& bytes);
std::vector<uint8_t> unhex(const std::string& s);
// A record from the store as an error may quote it: its first `max` bytes between quotes,
// anything unprintable as '?', "..." where it was cut (a record may come from anyone).
std::string quoted_record(const std::string& s, size_t max);
std::string to_string(const std::vector<uint8_t>& v);
std::vector<uint8_t> to_bytes(const std::string& s);

// This process's CPU affinity, a bit per CPU (NOTE [CPUs of the ranks]), and the number of CPUs
// in the union of several such masks.
std::vector<uint8_t> cpu_mask();
int union_cpus(const std::vector<std::vector<uint8_t>>& masks);

// What a rank publishes at rendezvous.
struct PeerInfo {
  std::string host;
  int64_t pid = 0;
  std::string device;
  int device_index = -1;
  int64_t block_size = 0;
  std::vector<uint8_t> handle;
  uint64_t probe_addr = 0;  // NOTE [Cross-memory probe]
  uint64_t probe_token = 0;
  std::string uuid;           // Device::device_uuid(): NOTE [Peer devices]
  std::vector<uint8_t> cpus;  // the CPUs it may run on, a bit each: NOTE [CPUs of the ranks]
  // The handle of its failure area (NOTE [Failure words] in p2p_workspace/watchdog.hpp); empty
  // ("-") where it publishes none: after the first generation, or with one rank.
  std::vector<uint8_t> failure_area;

  std::string serialize() const;
  // Parses rank `rank`'s record strictly (NOTE [Workspace records]); a bad one is an error naming
  // the rank.
  static PeerInfo parse(const std::string& s, int rank);
};

// NOTE [Allocation failures at rendezvous]: the record a rank publishes in place of its info when
// its block cannot be allocated or exported, and its parse: {out of memory, reason}, or nullopt
// when `s` is not one (an info record, which PeerInfo::parse then checks).
std::string failure_record(bool out_of_memory, const std::string& reason);
std::optional<std::pair<bool, std::string>> parse_failure(const std::string& s, int rank);

// Publishes `value` under prefix/<rank> and returns every rank's value, in rank order; a rank
// missing after `timeout` is an error naming it.
std::vector<std::string> exchange(c10d::Store& store, const std::string& prefix, int rank,
                                  int world_size, const std::string& value, Millis timeout);

// NOTE [One job per store]: claims rank `rank`'s slot of the store for this process, or raises
// naming the process that holds it.
void claim_rank_slot(c10d::Store& store, int rank);

}  // namespace cuda_p2p::records
