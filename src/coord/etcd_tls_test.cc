// etcd with TLS (docs/etcd.md, "TLS"): a real etcd on loopback serving https
// with --client-cert-auth, certificates made here by the openssl CLI (a test
// CA, a server certificate for IP 127.0.0.1, a client certificate). The
// store's calls go through when the client presents a certificate the CA
// signed; without one, with plain http, or with a CA that did not sign the
// server's certificate they are refused; bad TLS settings are named.
// Skipped without the etcd or openssl binary.
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <thread>

#include "common/subprocess.h"
#include "common/test_util.h"
#include "coord/etcd_store.h"
#include "coord/store.h"
#include "gtest/gtest.h"

namespace memento::coord {
namespace {

Deadline Soon() { return Deadline::AfterSeconds(10); }

int FreeLoopbackPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof(a);
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0) {
    port = ntohs(a.sin_port);
  }
  close(fd);
  return port;
}

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto etcd = FindExecutable("etcd");
    if (!etcd.ok()) GTEST_SKIP() << "no etcd binary: " << etcd.status();
    auto openssl = FindExecutable("openssl");
    if (!openssl.ok()) GTEST_SKIP() << "no openssl binary: " << openssl.status();
    const std::string d = dir_.path();
    // A test CA; etcd's certificate for 127.0.0.1 (serverAuth and clientAuth:
    // etcd's JSON gateway dials its own gRPC server with it); a client
    // certificate; a second CA that signed nothing here.
    const std::string script =
        "set -e; cd " + d + "; o=" + *openssl +
        "\n"
        "$o req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout ca.key -out "
        "ca.pem -days 2 "
        "-subj /CN=memento-test-ca 2>/dev/null\n"
        "$o req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout other.key "
        "-out other-ca.pem -days 2 "
        "-subj /CN=memento-other-ca 2>/dev/null\n"
        "printf 'subjectAltName=IP:127.0.0.1\\nextendedKeyUsage=serverAuth,clientAuth\\n' "
        "> server.ext\n"
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext\n"
        "for n in server client; do\n"
        "  $o req -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout $n.key -out "
        "$n.csr -subj /CN=memento-$n "
        "2>/dev/null\n"
        "  $o x509 -req -in $n.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out $n.pem "
        "-days 2 -extfile $n.ext 2>/dev/null\n"
        "done\n";
    SpawnOptions so;
    so.argv = {"/bin/sh", "-c", script};
    so.log_path = d + "/openssl.log";
    auto p = Subprocess::Spawn(so);
    ASSERT_TRUE(p.ok()) << p.status();
    auto st = p->Wait(Deadline::AfterSeconds(60));
    ASSERT_TRUE(st.ok() && st->ok()) << TailFile(so.log_path);

    port_ = FreeLoopbackPort();
    const int peer = FreeLoopbackPort();
    ASSERT_GT(port_, 0);
    ASSERT_GT(peer, 0);
    const std::string client = "https://127.0.0.1:" + std::to_string(port_);
    const std::string peer_url = "http://127.0.0.1:" + std::to_string(peer);
    SpawnOptions eo;
    eo.argv = {*etcd,
               "--name=memento",
               "--data-dir=" + d + "/etcd-data",
               "--listen-client-urls=" + client,
               "--advertise-client-urls=" + client,
               "--listen-peer-urls=" + peer_url,
               "--initial-advertise-peer-urls=" + peer_url,
               "--initial-cluster=memento=" + peer_url,
               "--heartbeat-interval=10",
               "--election-timeout=100",
               "--cert-file=" + d + "/server.pem",
               "--key-file=" + d + "/server.key",
               "--trusted-ca-file=" + d + "/ca.pem",
               "--client-cert-auth",
               "--log-level=warn",
               "--logger=zap"};
    eo.log_path = d + "/etcd.log";
    auto e = Subprocess::Spawn(eo);
    ASSERT_TRUE(e.ok()) << e.status();
    etcd_ = std::move(*e);
    // Ready when a client with the right certificate gets an answer.
    Status last = UnavailableError("not probed");
    const Deadline ready = Deadline::AfterSeconds(30);
    while (!ready.expired()) {
      ASSERT_TRUE(etcd_.running()) << TailFile(eo.log_path);
      auto s = EtcdStore::Open(Options(true), Deadline::AfterSeconds(1));
      if (s.ok()) return;
      last = s.status();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    FAIL() << "etcd with TLS did not answer: " << last << "\n" << TailFile(eo.log_path);
  }
  void TearDown() override {
    if (etcd_.unreaped()) etcd_.Terminate(2);
  }

  EtcdOptions Options(bool with_client_cert, const std::string& ca = "ca.pem") const {
    EtcdOptions o;
    o.endpoints.push_back(EtcdEndpoint{"127.0.0.1", port_});
    o.ca_file = dir_.path() + "/" + ca;
    if (with_client_cert) {
      o.cert_file = dir_.path() + "/client.pem";
      o.key_file = dir_.path() + "/client.key";
    }
    return o;
  }
  std::string Url() const { return "etcd://127.0.0.1:" + std::to_string(port_); }

  testing::ScratchDir dir_{"etcd-tls-test"};
  int port_ = -1;
  Subprocess etcd_;
};

TEST_F(EtcdTlsTest, ClientCertificateSignedByTheCaIsServed) {
  auto s = EtcdStore::Open(Options(true), Soon());
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->Set("/tls/k", "v", Soon()).ok());
  auto kv = (*s)->Get("/tls/k", Soon());
  ASSERT_TRUE(kv.ok()) << kv.status();
  EXPECT_EQ(kv->value, "v");
  // A lease and a compare-and-swap go over the same https connections.
  auto lease = (*s)->GrantLease(2, Soon());
  ASSERT_TRUE(lease.ok()) << lease.status();
  auto cas = (*s)->CompareAndSwap("/tls/leader", std::nullopt, "node0", Soon(), *lease);
  ASSERT_TRUE(cas.ok()) << cas.status();
  EXPECT_TRUE(cas->swapped);
  EXPECT_TRUE((*s)->KeepAlive(*lease, Soon()).ok());
}

TEST_F(EtcdTlsTest, TheEnvironmentConfiguresOpenStore) {
  setenv("MEMENTO_ETCD_CACERT", (dir_.path() + "/ca.pem").c_str(), 1);
  setenv("MEMENTO_ETCD_CERT", (dir_.path() + "/client.pem").c_str(), 1);
  setenv("MEMENTO_ETCD_KEY", (dir_.path() + "/client.key").c_str(), 1);
  auto s = OpenStore(Url(), "", Soon());
  unsetenv("MEMENTO_ETCD_CACERT");
  unsetenv("MEMENTO_ETCD_CERT");
  unsetenv("MEMENTO_ETCD_KEY");
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_TRUE((*s)->Set("/tls/env", "1", Soon()).ok());
  EXPECT_EQ((*s)->Get("/tls/env", Soon())->value, "1");
}

TEST_F(EtcdTlsTest, WithoutTheRightCertificatesEtcdIsNotReached) {
  // No client certificate: etcd (--client-cert-auth) refuses the handshake.
  EXPECT_FALSE(EtcdStore::Open(Options(false), Deadline::AfterSeconds(3)).ok());
  // Plain http to the https port.
  EtcdOptions plain;
  plain.endpoints.push_back(EtcdEndpoint{"127.0.0.1", port_});
  EXPECT_FALSE(EtcdStore::Open(plain, Deadline::AfterSeconds(3)).ok());
  // etcd's certificate is not signed by the CA the client trusts.
  EXPECT_FALSE(EtcdStore::Open(Options(true, "other-ca.pem"), Deadline::AfterSeconds(3)).ok());
}

TEST_F(EtcdTlsTest, BadSettingsAreNamed) {
  EtcdOptions o = Options(true);
  o.key_file.clear();
  auto no_key = EtcdStore::Open(o, Soon());
  EXPECT_EQ(no_key.status().code(), StatusCode::kInvalidArgument) << no_key.status();
  EXPECT_NE(no_key.status().message().find("MEMENTO_ETCD_KEY"), std::string::npos)
      << no_key.status();
  o = Options(true);
  o.ca_file.clear();
  auto no_ca = EtcdStore::Open(o, Soon());
  EXPECT_EQ(no_ca.status().code(), StatusCode::kInvalidArgument) << no_ca.status();
  EXPECT_NE(no_ca.status().message().find("MEMENTO_ETCD_CACERT"), std::string::npos)
      << no_ca.status();
  o = Options(true);
  o.cert_file = dir_.path() + "/missing.pem";
  auto missing = EtcdStore::Open(o, Soon());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound) << missing.status();
  EXPECT_NE(missing.status().message().find("missing.pem"), std::string::npos) << missing.status();
}

}  // namespace
}  // namespace memento::coord
