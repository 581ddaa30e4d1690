#include "memento_hooks.h"

#include <cstdio>
#include <utility>

#include "memento/client.h"

namespace memento::trainer {
namespace {

class MementoHooks : public TrainerHooks {
 public:
  explicit MementoHooks(std::unique_ptr<Client> client) : client_(std::move(client)) {}

  void OnPhase(TrainPhase phase) override {
    switch (phase) {
      case TrainPhase::kCompute:
        client_->OnPhase(Phase::kCompute);
        break;
      case TrainPhase::kIdle:
        client_->OnPhase(Phase::kIdle);
        break;
      case TrainPhase::kCommunicate:
        client_->OnPhase(Phase::kCommunicate);
        break;
    }
  }
  Status BeforeOptimizerStep(int64_t step) override { return client_->Fence(); }
  Status AfterOptimizerStep(int64_t step) override { return client_->Snapshot(step); }

  std::string ProgressNote() override {
    const SnapshotStats s = client_->LastSnapshotStats();
    if (s.step < 0) return "";
    char buf[256];
    std::snprintf(buf, sizeof(buf),
                  "snap_step %lld snap_bytes %llu copy_ms %.2f fence_wait_ms %.2f idle_bytes %llu "
                  "fence_bytes %llu",
                  static_cast<long long>(s.step), static_cast<unsigned long long>(s.bytes),
                  s.copy_s * 1e3, s.fence_wait_s * 1e3,
                  static_cast<unsigned long long>(s.bytes_idle),
                  static_cast<unsigned long long>(s.bytes_fence));
    return buf;
  }

 private:
  std::unique_ptr<Client> client_;
};

}  // namespace

Result<std::unique_ptr<TrainerHooks>> ConnectMemento(Trainer* trainer,
                                                     const MementoHookOptions& options,
                                                     int64_t* restored_step) {
  *restored_step = -1;
  const TrainerOptions& to = trainer->options();
  ClientOptions co;
  co.job_id = options.job_id;
  co.rank = to.comm.rank;
  co.world_size = to.comm.topology.world();
  co.agent_dir = options.agent_dir;
  co.node = options.node;
  co.schedule = options.schedule;
  co.copy_priority = options.copy_priority;
  MEMENTO_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(co));

  TensorMeta params;
  params.name = "params";
  params.dtype = DType::kFloat32;
  params.shape = {static_cast<int64_t>(trainer->padded_params())};
  params.state_class = StateClass::kReplicated;
  MEMENTO_RETURN_IF_ERROR(client->RegisterTensor(params, trainer->params()));

  for (int i = 0; i < 2; ++i) {
    TensorMeta moment;
    moment.name = i == 0 ? "adam_m" : "adam_v";
    moment.dtype = DType::kFloat32;
    moment.shape = {static_cast<int64_t>(trainer->optimizer_numel())};
    if (to.zero1 && to.comm.topology.dp > 1) {
      moment.state_class = StateClass::kDpSharded;
      moment.global_numel = static_cast<int64_t>(trainer->padded_params());
      moment.shard_offset = static_cast<int64_t>(trainer->optimizer_offset());
    } else {
      moment.state_class = StateClass::kReplicated;
    }
    MEMENTO_RETURN_IF_ERROR(
        client->RegisterTensor(moment, i == 0 ? trainer->adam_m() : trainer->adam_v()));
  }
  MEMENTO_RETURN_IF_ERROR(
      client->RegisterBlob("train_state", trainer->mutable_state(), sizeof(TrainState)));
  MEMENTO_RETURN_IF_ERROR(client->Seal());

  if (options.restore) {
    Result<int64_t> restored = client->Restore();
    if (restored.ok()) {
      *restored_step = *restored;
      if (trainer->state().step != *restored) {
        return DataLossError("restored version " + std::to_string(*restored) +
                             " holds train_state.step " + std::to_string(trainer->state().step));
      }
    } else if (restored.status().code() != StatusCode::kNotFound) {
      return restored.status();
    }
  }
  return std::unique_ptr<TrainerHooks>(new MementoHooks(std::move(client)));
}

}  // namespace memento::trainer
