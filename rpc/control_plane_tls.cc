#include "rpc/control_plane_tls.h"

#include <errno.h>
#include <sys/stat.h>

#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace tandem {
namespace {

// The file's text, or InvalidArgument naming `flag`; `private_key`: refused when group or others
// may read it (as the cluster token file).
absl::StatusOr<std::string> ReadPem(const char* flag, const std::string& file, bool private_key,
                                    const char* marker) {
  struct stat st;
  if (stat(file.c_str(), &st) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", flag, " ", file, ": ", std::strerror(errno)));
  }
  if (private_key && (st.st_mode & (S_IRWXG | S_IRWXO)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", file, " may be read by others (chmod 600 it)"));
  }
  std::ifstream in(file);
  std::stringstream s;
  s << in.rdbuf();
  if (!in) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read ", flag, " ", file, ": ", std::strerror(errno)));
  }
  std::string text = s.str();
  if (!absl::StrContains(text, marker)) {
    return absl::InvalidArgumentError(
        absl::StrCat(flag, " ", file, " holds no PEM block \"", marker, "\""));
  }
  return text;
}

}  // namespace

absl::StatusOr<ControlPlaneTls> LoadControlPlaneTls(const std::string& ca_file,
                                                    const std::string& cert_file,
                                                    const std::string& key_file) {
  ControlPlaneTls tls;
  const int given = !ca_file.empty() + !cert_file.empty() + !key_file.empty();
  if (given == 0) return tls;
  if (given != 3) {
    std::string missing;
    for (auto [flag, file] : {std::pair{"--tls-ca", &ca_file}, std::pair{"--tls-cert", &cert_file},
                              std::pair{"--tls-key", &key_file}}) {
      if (file->empty()) absl::StrAppend(&missing, missing.empty() ? "" : ", ", flag);
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "control-plane TLS needs --tls-ca, --tls-cert and --tls-key together; missing: ", missing));
  }
  absl::StatusOr<std::string> ca = ReadPem("--tls-ca", ca_file, false, "-----BEGIN CERTIFICATE");
  if (!ca.ok()) return ca.status();
  absl::StatusOr<std::string> cert =
      ReadPem("--tls-cert", cert_file, false, "-----BEGIN CERTIFICATE");
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> key = ReadPem("--tls-key", key_file, true, "PRIVATE KEY-----");
  if (!key.ok()) return key.status();
  tls.ca_pem = *std::move(ca);
  tls.cert_pem = *std::move(cert);
  tls.key_pem = *std::move(key);
  return tls;
}

std::shared_ptr<grpc::ServerCredentials> ControlPlaneServerCredentials(const ControlPlaneTls& tls) {
  if (!tls.enabled()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = tls.ca_pem;
  options.pem_key_cert_pairs.push_back({tls.key_pem, tls.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ControlPlaneChannelCredentials(
    const ControlPlaneTls& tls) {
  if (!tls.enabled()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = tls.ca_pem;
  options.pem_private_key = tls.key_pem;
  options.pem_cert_chain = tls.cert_pem;
  return grpc::SslCredentials(options);
}

void ApplyControlPlaneTlsArgs(const ControlPlaneTls& tls, grpc::ChannelArguments& args) {
  if (tls.enabled()) args.SetSslTargetNameOverride(kControlPlaneTlsName);
}

bool PeerHasVerifiedCertificate(const grpc::ServerContext& context) {
  const std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return auth != nullptr && auth->IsPeerAuthenticated();
}

}  // namespace tandem
