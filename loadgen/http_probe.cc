// FetchFirstModelId (http_target.h): one blocking GET of /v1/models.
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include "absl/strings/str_cat.h"
#include "loadgen/http_target.h"

namespace tandem::loadgen {

namespace beast = boost::beast;
namespace http = beast::http;
using boost::asio::ip::tcp;

absl::StatusOr<std::string> FetchFirstModelId(const std::string& base_url) {
  const std::string kScheme = "http://";
  if (base_url.rfind(kScheme, 0) != 0) {
    return absl::InvalidArgumentError("--base-url must start with http://: " + base_url);
  }
  std::string rest = base_url.substr(kScheme.size());
  std::string authority = rest.substr(0, rest.find('/'));
  std::string prefix = rest.size() > authority.size() ? rest.substr(authority.size()) : "";
  while (!prefix.empty() && prefix.back() == '/') prefix.pop_back();
  size_t colon = authority.rfind(':');
  std::string host = authority.substr(0, colon);
  std::string port = colon == std::string::npos ? "80" : authority.substr(colon + 1);

  boost::asio::io_context io;
  beast::error_code ec;
  tcp::resolver resolver(io);
  auto endpoints = resolver.resolve(host, port, ec);
  tcp::socket socket(io);
  if (!ec) boost::asio::connect(socket, endpoints, ec);
  http::request<http::empty_body> request(http::verb::get, prefix + "/v1/models", 11);
  request.set(http::field::host, authority);
  if (!ec) http::write(socket, request, ec);
  beast::flat_buffer buffer;
  http::response<http::string_body> response;
  if (!ec) http::read(socket, buffer, response, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("GET ", base_url, "/v1/models failed (",
                                               ec.message(),
                                               "); is the server up? Or pass --model"));
  }
  auto j = nlohmann::json::parse(response.body(), nullptr, false);
  if (response.result_int() != 200 || j.is_discarded() || !j.contains("data") ||
      !j["data"].is_array() || j["data"].empty() || !j["data"][0].contains("id") ||
      !j["data"][0]["id"].is_string()) {
    return absl::UnavailableError(absl::StrCat("GET /v1/models gave no model (HTTP ",
                                               response.result_int(), "); pass --model"));
  }
  return j["data"][0]["id"].get<std::string>();
}

}  // namespace tandem::loadgen
