// kvpark-proxy's HTTP front: installs the routes on an httplib server.
#pragma once

#include "proxy/proxy.h"

namespace httplib {
class Server;
}

namespace kvpark::proxy {

// POST /v1/chat/completions, /v1/responses, /v1/messages (and each without /v1):
// parked and restored.
// GET /health (503 until every upstream is verified), GET /kvpark/status, GET
// /metrics: the proxy's own. GET /v1/models: the configured model names.
// Anything else: passed through to an upstream.
void install_routes(ProxyState& proxy, httplib::Server& server);

}  // namespace kvpark::proxy
