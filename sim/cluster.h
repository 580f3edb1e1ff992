// Several serving instances on one virtual clock, each with its own production Scheduler
// and KvBlockManager: data-parallel replicas (every instance prefills and decodes), or
// prefill/decode disaggregation (prefill instances compute the prompt and the first token,
// the KV cache crosses to a decode instance at a given bandwidth, the decode instance
// generates the rest). A router sends each request to the least-loaded instance of its
// role (fewest running + waiting, lowest index on ties). Deterministic.
#pragma once
#include "sim/simulator.h"

namespace troupe::sim {

struct ClusterConfig {
  int32_t instances = 1;          // colocated replicas (when prefill_instances == 0)
  int32_t prefill_instances = 0;  // > 0: disaggregated, with decode_instances
  int32_t decode_instances = 0;
  double kv_transfer_bandwidth = 0;  // bytes/s per transfer (0: instant)
  double kv_transfer_latency_s = 0;
};

Status check_cluster(const ClusterConfig& c);

// Runs `requests` over the cluster; every instance uses `cfg`'s scheduler, KV pool and
// policy and `cost`. On a decode instance the transferred prompt is planned by the
// production scheduler like a prefill (it takes token budget and KV blocks) but priced as
// received, not computed: only the token after it is computed (unless the decode instance
// preempted it: then the recompute is priced in full). TTFT is the prefill
// instance's first token; the decode instance streams the rest.
Result<SimResult> simulate_cluster(const std::vector<SimRequest>& requests, const SimConfig& cfg, const CostModel& cost,
                                   const ClusterConfig& cluster);

}  // namespace troupe::sim
