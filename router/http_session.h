// One HTTP connection of HttpServer (internal to http_server.cc and its tests).
//
// Per connection: read a request → dispatch it to the handler with a responder → keep reading
// the socket meanwhile (a read error then means the client went away: the request's cancel
// callback runs) → write the response → with keep-alive, the next request. All socket work runs
// on the connection's strand; responders post to it.
#pragma once

#include <boost/asio/ip/tcp.hpp>
#include <memory>

#include "router/http_server.h"

namespace tandem::router {

struct SessionConfig {
  HttpServerOptions options;
  HttpHandler handler;
};

// Starts serving `socket` (whose executor must be a strand). `keep_alive` is held by the
// session so the io_context outlives it.
void StartSession(boost::asio::ip::tcp::socket socket, std::shared_ptr<SessionConfig> config,
                  std::shared_ptr<void> keep_alive);

// "HTTP/1.1 <status> <reason>\r\n" + headers + "\r\n".
std::string ResponseHead(int status, const std::string& content_type, bool keep_alive,
                         const HttpHeaders& extra, const std::string* length_or_chunked);

}  // namespace tandem::router
