// What one op did: the value every workspace collective and fused op returns beside its result.
//
// NOTE [Outcomes]
// An op reports facts about the run it made - the algorithm or path that ran, whether it read
// its peers' inputs zero-copy or through cross-memory reads, ran inline, grew the workspace,
// was enqueued under a graph capture - and nothing else: it never names a counter. The backend
// turns an Outcome into the public counter names in one place (backend/counters.cpp), which
// also decides which facts of which op have a name ("all_reduce.inline", "fused_*.grow", ...).
// So an op's report cannot drift from the names users read, and an op tested alone (the C++
// tests drive ops without a backend) is checked through the same value.
#pragma once

#include <cstdint>

namespace cuda_p2p::ops {

struct Outcome {
  // The algorithm or path that ran, a static name: "one_shot", "two_shot", "direct", "ring",
  // "workspace" (the barrier), "pipeline", "pull_ahead", "send_recv". Null when nothing ran.
  const char* algorithm = nullptr;
  // Rounds through the workspace buffer (> 1: the payload did not fit it at once), where the op
  // reports them (the fused pipelines); 0 otherwise.
  int64_t rounds = 0;
  // The peers' inputs were read where they lie in their symmetric heaps (NOTE [Zero-copy
  // collectives] in ops/zero_copy.cpp, NOTE [Zero-copy all-gather→matmul]).
  bool zero_copy = false;
  // Peers' private memory was read with cross-memory reads (NOTE [Cross-memory reads]).
  bool cross_memory = false;
  // The small all-reduce ran inline on the calling thread (NOTE [Inline one-shot]).
  bool ran_inline = false;
  // A two-shot all-reduce ran the large rounds rank 0 chose (NOTE [Rounds chosen by rank 0]).
  bool large_rounds = false;
  // Enqueued under a graph capture (NOTE [Replay-safe signals]): it runs on each replay.
  bool graph = false;
  // The workspace was grown for this op.
  bool grew = false;
};

}  // namespace cuda_p2p::ops
