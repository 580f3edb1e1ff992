#include "actors/kv_block_actor.h"

namespace troupe::actors {

kv_block_actor::behavior_type kv_block_fn(kv_block_actor::stateful_pointer<KvBlockState> self, KvBlockActorConfig cfg) {
  self->state.kv = std::make_unique<KvBlockManager>(cfg.kv);
  self->state.check = cfg.check_invariants;
  return {
      [=](const KvOpsRequest& req) -> caf::result<KvOpsReply> {
        auto& st = self->state;
        KvOpsReply reply = apply_kv_ops(*st.kv, req);
        if (st.check)
          if (auto ok = st.kv->check_invariants(); !ok)
            return caf::make_error(caf::sec::runtime_error, "KV-block manager invariant broken: " + ok.error().message);
        return reply;
      },
  };
}

}  // namespace troupe::actors
