// Test-only: the set-up of the tests that run the `memento` CLI against a real
// store (inspect_cluster_test, cluster_inspect_bytes_test). A fixture base: a
// scratch directory, a new job token in its job.token (mode 0600) and an
// embedded store server on 127.0.0.1 (an ephemeral port, real token
// authentication), started by SetUp; a failure there fails the test.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "common/clock.h"
#include "common/test_util.h"
#include "coord/embedded_store.h"
#include "net/job_token.h"

namespace memento::coord::testing {

class TokenStoreTest : public ::testing::Test {
 protected:
  // `scratch_prefix`: the scratch directory's name prefix.
  explicit TokenStoreTest(const std::string& scratch_prefix) : dir_(scratch_prefix) {}

  void SetUp() override {
    auto token = net::JobToken::Generate();
    ASSERT_TRUE(token.ok());
    token_file_ = dir_.path() + "/job.token";
    ASSERT_TRUE(token->WriteFile(token_file_).ok());  // mode 0600
    auto server = EmbeddedStoreServer::Start("127.0.0.1", 0, *token);
    ASSERT_TRUE(server.ok()) << server.status().ToString();
    server_ = std::move(*server);
    url_ = "tcp://127.0.0.1:" + std::to_string(server_->port());
  }

  memento::testing::ScratchDir dir_;
  std::string token_file_;  // the job token's file
  std::string url_;         // tcp://127.0.0.1:PORT
  std::unique_ptr<EmbeddedStoreServer> server_;
};

}  // namespace memento::coord::testing
