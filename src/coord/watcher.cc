#include "common/log.h"
#include "common/thread_cpu.h"
#include "coord/store.h"

namespace memento::coord {

Watcher::Watcher(Store* store, std::string prefix, int64_t after_revision, Callback on_event)
    : store_(store),
      prefix_(std::move(prefix)),
      after_(after_revision),
      on_event_(std::move(on_event)) {
  thread_ = std::thread([this] {
    NameThisThread("store-watch");
    Run();
  });
}

void Watcher::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void Watcher::Run() {
  uint64_t epoch = 0;
  bool relist = false;
  while (!stop_.load()) {
    if (relist) {
      auto list = store_->List(prefix_, Deadline::AfterSeconds(2));
      if (!list.ok()) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        continue;
      }
      MEMENTO_LOG_DEBUG("coord: watch '{}': re-listed {} keys at revision {}", prefix_,
                        list->kvs.size(), list->revision);
      for (auto& kv : list->kvs) {
        if (stop_.load()) return;
        on_event_(WatchEvent{WatchEvent::Type::kPut, std::move(kv)});
      }
      after_ = list->revision;
      epoch = list->epoch;
      relist = false;
      continue;
    }
    auto batch = store_->WatchPoll(prefix_, after_, Deadline::AfterSeconds(0.2));
    if (!batch.ok()) {
      if (batch.status().code() == StatusCode::kFailedPrecondition) {
        relist = true;
      } else {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
      continue;
    }
    if (epoch != 0 && batch->epoch != epoch) {
      relist = true;  // a new store: our revision means nothing there
      continue;
    }
    epoch = batch->epoch;
    for (const WatchEvent& ev : batch->events) {
      if (stop_.load()) return;
      on_event_(ev);
    }
    after_ = batch->revision;
  }
}

}  // namespace memento::coord
