// Test-only hooks of the client library: not part of the public API
// (include/memento), not read from the environment. Tests and the test
// trainers (tests/shm/test_trainer.cc, tests/cluster_save/cluster_trainer.cc,
// which take MEMENTO_TEST_COPY_DELAY_US from their own environment through
// toy::ApplyCopyDelayFromEnvironment, src/toy/toy_run.h) call them.
#pragma once

namespace memento::client::testing_hooks {

// Every chunk copy of a Client sealed after this call sleeps `us`
// microseconds first (0: none), so that a test's kill or Fence() lands while
// copies are left (shm_crash_test, shm_client_agent_test
// IdlePriorityFenceCopiesWhatIsLeft, cluster_save_test ClusterKillTest).
void SetCopyDelayUs(int us);
int CopyDelayUs();

}  // namespace memento::client::testing_hooks
