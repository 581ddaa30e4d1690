#include <fmt/format.h>

#include "coord/embedded_store.h"
#include "coord/etcd_store.h"
#include "coord/store.h"
#include "net/socket.h"

namespace memento::coord {

Result<std::unique_ptr<Store>> OpenStore(const std::string& url, const std::string& token_path,
                                         Deadline deadline) {
  constexpr std::string_view kTcp = "tcp://";
  constexpr std::string_view kEtcd = "etcd://";
  if (url.compare(0, kEtcd.size(), kEtcd) == 0) {
    MEMENTO_ASSIGN_OR_RETURN(EtcdOptions options, ParseEtcdUrl(url));
    auto store = EtcdStore::Open(std::move(options), deadline);
    if (!store.ok()) return store.status();
    return std::unique_ptr<Store>(std::move(*store));
  }
  if (url.compare(0, kTcp.size(), kTcp) != 0) {
    return InvalidArgumentError(fmt::format(
        "store URL '{}': expected tcp://host:port or etcd://host:port[,host:port...]", url));
  }
  Result<net::HostPort> hp = net::ParseHostPort(url.substr(kTcp.size()), net::PortUse::kConnect);
  if (!hp.ok()) return hp.status().WithContext(fmt::format("store URL '{}'", url));
  MEMENTO_ASSIGN_OR_RETURN(net::JobToken token, net::JobToken::Load(token_path));
  auto client = std::make_unique<StoreClient>(hp->host, hp->port, std::move(token));
  Status s = client->Ping(deadline);
  if (!s.ok()) return s.WithContext(fmt::format("opening store {}", url));
  return std::unique_ptr<Store>(std::move(client));
}

}  // namespace memento::coord
