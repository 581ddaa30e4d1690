// memento-trainer's step lines and summaries (step_report.h).
#include "step_report.h"

#include <algorithm>
#include <cinttypes>
#include <cstring>

namespace memento::trainer {

bool StepReport::OpenLossLog(bool reports_loss) {
  if (cli_.loss_log.empty() || !reports_loss) return true;
  loss_log_ = std::fopen(cli_.loss_log.c_str(), "a");
  if (loss_log_ == nullptr) {
    std::perror(cli_.loss_log.c_str());
    return false;
  }
  return true;
}

void StepReport::Close() {
  if (loss_log_ != nullptr) std::fclose(loss_log_);
  loss_log_ = nullptr;
}

void StepReport::Add(const Trainer& trainer, const StepResult& r, double step_cpu_s) {
  if (r.step > first_step_ || cli_.steps == first_step_) {
    ++timed_steps_;
    sum_s_ += r.seconds;
    sum_idle_ += r.idle_seconds;
    sum_comm_ += r.comm_seconds;
    sum_fence_ += r.fence_seconds;
    sum_snap_ += r.snapshot_seconds;
    sum_cpu_ += step_cpu_s;
    sum_log_s_ += r.log_seconds;
    sum_log_bytes_ += static_cast<double>(r.log_bytes);
    sum_log_cpu_ += r.log_cpu_seconds;
    if (r.log_bytes > 0) ++logged_steps_;
    step_times_.push_back(r.seconds);
  }
  last_loss_ = r.loss;
  window_s_ += r.seconds;
  window_overhead_s_ += r.fence_seconds + r.snapshot_seconds;
  ++window_steps_;
  PrintProgress(r);
  if (r.has_loss) PrintStep(trainer, r);
}

void StepReport::PrintProgress(const StepResult& r) {
  const int64_t every = cli_.progress_every;
  const bool window_ends = every > 0 && (r.step % every == 0 || r.step == cli_.steps);
  if (r.has_loss && window_ends) {
    const double step_ms = window_s_ / window_steps_ * 1e3;
    const double over_ms = window_overhead_s_ / window_steps_ * 1e3;
    std::printf("progress step %" PRId64
                " loss %.4f step_ms %.1f snapshot_overhead_ms %.2f (%.1f%%)\n",
                r.step, r.loss, step_ms, over_ms, step_ms > 0 ? 100.0 * over_ms / step_ms : 0.0);
    std::fflush(stdout);
  }
  if (window_ends) {
    window_s_ = window_overhead_s_ = 0;
    window_steps_ = 0;
  }
}

void StepReport::PrintStep(const Trainer& trainer, const StepResult& r) {
  if (!cli_.quiet && cli_.progress_every <= 0) {
    const std::string note =
        trainer.hooks() != nullptr ? trainer.hooks()->ProgressNote() : std::string();
    std::printf("step %" PRId64
                " loss %.6f grad_norm %.4f time_ms %.1f idle_ms %.1f comm_ms %.1f"
                " fence_ms %.2f snapshot_ms %.2f%s%s\n",
                r.step, r.loss, r.grad_norm, r.seconds * 1e3, r.idle_seconds * 1e3,
                r.comm_seconds * 1e3, r.fence_seconds * 1e3, r.snapshot_seconds * 1e3,
                note.empty() ? "" : " ", note.c_str());
    std::fflush(stdout);
  }
  if (loss_log_ != nullptr) {
    uint64_t bits;
    std::memcpy(&bits, &r.loss, sizeof(bits));
    std::fprintf(loss_log_, "%" PRId64 " %.17g %016" PRIx64 " %.17g\n", r.step, r.loss, bits,
                 r.grad_norm);
    std::fflush(loss_log_);
  }
}

void StepReport::PrintSummaries(Trainer& trainer) const {
  if (!cli_.json) return;
  const double n_timed = static_cast<double>(timed_steps_);
  // Every rank: its own summary (snapshot statistics per HAS layer).
  const std::string hooks_json =
      trainer.hooks() != nullptr ? trainer.hooks()->SummaryJson() : std::string();
  const PipelineLogSpool* spool = trainer.pipeline_log_spool();
  const PipelineLogWriter* writer = trainer.pipeline_log_writer();
  std::printf(
      "{\"rank_summary\": {\"rank\": %d, \"pp_rank\": %d, \"mean_step_s\": %.6f, "
      "\"mean_cpu_s\": %.6f, \"log_bytes_per_step\": %.1f, \"log_s_per_step\": %.6f, "
      "\"log_spool_bytes\": %llu, \"log_spool_write_s\": %.6f, \"log_copy\": \"%s\", "
      "\"log_cpu_s_per_step\": %.7f, \"log_cpu_s_per_logged_step\": %.7f, "
      "\"log_worker_cpu_s\": %.6f, \"log_copies_by_trainer\": %llu, "
      "\"log_copies_by_worker\": %llu, \"snapshot\": %s}}\n",
      cli_.options.comm.rank, trainer.comm().pp_rank(), timed_steps_ > 0 ? sum_s_ / n_timed : 0.0,
      timed_steps_ > 0 ? sum_cpu_ / n_timed : 0.0,
      timed_steps_ > 0 ? sum_log_bytes_ / n_timed : 0.0,
      timed_steps_ > 0 ? sum_log_s_ / n_timed : 0.0,
      spool != nullptr ? static_cast<unsigned long long>(spool->bytes_written()) : 0ULL,
      spool != nullptr ? spool->write_seconds() : 0.0,
      PipelineLogWriter::ModeName(cli_.options.log_copy),
      timed_steps_ > 0 ? sum_log_cpu_ / n_timed : 0.0,
      logged_steps_ > 0 ? sum_log_cpu_ / static_cast<double>(logged_steps_) : 0.0,
      writer != nullptr ? writer->worker_cpu_seconds() : 0.0,
      static_cast<unsigned long long>(writer != nullptr ? writer->jobs_by_caller() : 0),
      static_cast<unsigned long long>(writer != nullptr ? writer->jobs_by_worker() : 0),
      hooks_json.empty() ? "null" : hooks_json.c_str());
  if (!trainer.reports_loss() || timed_steps_ == 0) return;
  const TrainerOptions& o = cli_.options;
  const double mean = sum_s_ / n_timed;
  std::vector<double> sorted = step_times_;
  std::sort(sorted.begin(), sorted.end());
  const size_t n = sorted.size();
  const double median = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
  std::string times;
  for (double t : step_times_) {
    char b[32];
    std::snprintf(b, sizeof(b), "%s%.6f", times.empty() ? "" : ", ", t);
    times += b;
  }
  std::printf("{\"params\": %" PRId64
              ", \"dp\": %d, \"tp\": %d, \"pp\": %d, \"zero1\": %s, "
              "\"micro_batches\": %d, \"batch\": %d, \"seq\": %d, \"steps\": %" PRId64
              ", \"final_loss\": %.6f, \"mean_step_s\": %.6f, \"mean_idle_s\": %.6f, "
              "\"mean_comm_s\": %.6f, \"mean_fence_s\": %.6f, \"mean_snapshot_s\": %.6f, "
              "\"mean_cpu_s\": %.6f, \"tokens_per_s\": %.1f, \"median_step_s\": %.6f, "
              "\"step_s\": [%s]}\n",
              o.model.NumParameters(), o.comm.topology.dp, o.comm.topology.tp, o.comm.topology.pp,
              o.zero1 ? "true" : "false", o.micro_batches, o.global_batch, o.model.seq,
              trainer.state().step, last_loss_, mean, sum_idle_ / n_timed, sum_comm_ / n_timed,
              sum_fence_ / n_timed, sum_snap_ / n_timed, sum_cpu_ / n_timed,
              static_cast<double>(o.global_batch) * o.model.seq / mean, median, times.c_str());
}

}  // namespace memento::trainer
