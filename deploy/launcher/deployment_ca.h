// DeploymentCa: the certificate authority of one deployment's control plane
// (rpc/control_plane_tls.h), made fresh by the launcher at each start with OpenSSL: an ECDSA
// P-256 key and a self-signed CA certificate, which then issues each process a key and a
// certificate (subjectAltName DNS:tandem-control-plane, usable as TLS server and client). The
// CA's private key lives in this object only and is never written out: once the launcher has
// issued its processes' certificates no one can issue another. Thread-compatible.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tandem::launcher {

// The PEM files of one process: the CA's certificate, its certificate and its key.
struct TlsFiles {
  std::string ca;
  std::string cert;
  std::string key;
};

class DeploymentCa {
 public:
  // A new CA named `name` (the certificates' issuer CN) whose certificates are valid from an
  // hour ago (clock skew) for `validity`.
  static absl::StatusOr<DeploymentCa> Create(const std::string& name, absl::Duration validity);
  DeploymentCa(DeploymentCa&&) noexcept;
  DeploymentCa& operator=(DeploymentCa&&) noexcept;
  ~DeploymentCa();

  const std::string& ca_pem() const { return ca_pem_; }
  // A fresh key and a certificate for process `name` (its CN), signed by this CA.
  struct Issued {
    std::string cert_pem;
    std::string key_pem;
  };
  absl::StatusOr<Issued> Issue(const std::string& name) const;
  // Issue(name), written as <dir>/<name>.crt and <dir>/<name>.key (mode 600), with the CA's
  // certificate as <dir>/ca.crt (written once). `dir` must exist (mode 700: Cluster makes it).
  absl::StatusOr<TlsFiles> IssueFiles(const std::string& dir, const std::string& name);

 private:
  struct Impl;
  DeploymentCa();
  std::unique_ptr<Impl> impl_;
  std::string ca_pem_;
  absl::Duration validity_;
  bool ca_written_ = false;
};

}  // namespace tandem::launcher
