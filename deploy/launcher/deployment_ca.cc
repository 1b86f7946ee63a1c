#include "deploy/launcher/deployment_ca.h"

#include <fcntl.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "rpc/control_plane_tls.h"

namespace tandem::launcher {
namespace {

struct KeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct CertFree {
  void operator()(X509* x) const { X509_free(x); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};
using Key = std::unique_ptr<EVP_PKEY, KeyFree>;
using Cert = std::unique_ptr<X509, CertFree>;
using Bio = std::unique_ptr<BIO, BioFree>;

// OpenSSL's queued error, as a Status naming what failed.
absl::Status SslError(const char* what) {
  char buf[256] = "no OpenSSL error queued";
  if (const unsigned long e = ERR_get_error(); e != 0) ERR_error_string_n(e, buf, sizeof(buf));
  ERR_clear_error();
  return absl::InternalError(absl::StrCat("deployment CA: ", what, ": ", buf));
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return SslError("generating a P-256 key");
  return key;
}

absl::Status AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return SslError(value);
  const int ok = X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
  return ok == 1 ? absl::OkStatus() : SslError("adding an extension");
}

// A certificate for `key` named `cn`, issued by `issuer` (null: self-signed) with `issuer_key`.
absl::StatusOr<Cert> MakeCert(const std::string& cn, EVP_PKEY* key, X509* issuer,
                              EVP_PKEY* issuer_key, absl::Duration validity, bool is_ca) {
  Cert cert(X509_new());
  if (cert == nullptr) return SslError("X509_new");
  if (X509_set_version(cert.get(), X509_VERSION_3) != 1) return SslError("version");
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) return SslError("serial number");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  const bool serial_ok =
      bn != nullptr && BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get())) != nullptr;
  BN_free(bn);
  if (!serial_ok) return SslError("serial number");
  if (X509_gmtime_adj(X509_getm_notBefore(cert.get()), -3600) == nullptr ||
      X509_gmtime_adj(X509_getm_notAfter(cert.get()), absl::ToInt64Seconds(validity)) == nullptr) {
    return SslError("validity");
  }
  X509_NAME* subject = X509_get_subject_name(cert.get());
  if (X509_NAME_add_entry_by_txt(subject, "O", MBSTRING_ASC,
                                 reinterpret_cast<const unsigned char*>("tandem"), -1, -1,
                                 0) != 1 ||
      X509_NAME_add_entry_by_txt(subject, "CN", MBSTRING_UTF8,
                                 reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1,
                                 0) != 1) {
    return SslError("subject name");
  }
  X509* signer = issuer != nullptr ? issuer : cert.get();
  if (X509_set_issuer_name(cert.get(), X509_get_subject_name(signer)) != 1) {
    return SslError("issuer name");
  }
  if (X509_set_pubkey(cert.get(), key) != 1) return SslError("public key");
  absl::Status st;
  if (is_ca) {
    for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:TRUE,pathlen:0"},
                              std::pair{NID_key_usage, "critical,keyCertSign,cRLSign"},
                              std::pair{NID_subject_key_identifier, "hash"}}) {
      if (st = AddExtension(cert.get(), signer, nid, value); !st.ok()) return st;
    }
  } else {
    const std::string san = absl::StrCat("DNS:", kControlPlaneTlsName);
    for (auto [nid, value] : {std::pair{NID_basic_constraints, "critical,CA:FALSE"},
                              std::pair{NID_key_usage, "critical,digitalSignature"},
                              std::pair{NID_ext_key_usage, "serverAuth,clientAuth"},
                              std::pair{NID_subject_alt_name, san.c_str()},
                              std::pair{NID_subject_key_identifier, "hash"},
                              std::pair{NID_authority_key_identifier, "keyid:always"}}) {
      if (st = AddExtension(cert.get(), signer, nid, value); !st.ok()) return st;
    }
  }
  if (X509_sign(cert.get(), issuer_key != nullptr ? issuer_key : key, EVP_sha256()) <= 0) {
    return SslError("signing");
  }
  return cert;
}

absl::StatusOr<std::string> BioText(BIO* bio) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(bio, &data);
  if (n <= 0 || data == nullptr) return SslError("PEM output");
  return std::string(data, static_cast<size_t>(n));
}

absl::StatusOr<std::string> CertPem(X509* cert) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || PEM_write_bio_X509(bio.get(), cert) != 1) return SslError("PEM cert");
  return BioText(bio.get());
}

absl::StatusOr<std::string> KeyPem(EVP_PKEY* key) {
  Bio bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr ||
      PEM_write_bio_PrivateKey(bio.get(), key, nullptr, nullptr, 0, nullptr, nullptr) != 1) {
    return SslError("PEM key");
  }
  return BioText(bio.get());
}

// Writes `text` to a new file `path` of mode `mode` (an existing one is replaced).
absl::Status WriteFile(const std::string& path, const std::string& text, mode_t mode) {
  unlink(path.c_str());
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  size_t done = 0;
  while (done < text.size()) {
    const ssize_t n = write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int e = errno;
      close(fd);
      return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(e)));
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

}  // namespace

struct DeploymentCa::Impl {
  Key key;
  Cert cert;
};

DeploymentCa::DeploymentCa() : impl_(std::make_unique<Impl>()) {}
DeploymentCa::DeploymentCa(DeploymentCa&&) noexcept = default;
DeploymentCa& DeploymentCa::operator=(DeploymentCa&&) noexcept = default;
DeploymentCa::~DeploymentCa() = default;

absl::StatusOr<DeploymentCa> DeploymentCa::Create(const std::string& name,
                                                  absl::Duration validity) {
  DeploymentCa ca;
  ca.validity_ = validity;
  absl::StatusOr<Key> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<Cert> cert = MakeCert(name, key->get(), nullptr, nullptr, validity, true);
  if (!cert.ok()) return cert.status();
  absl::StatusOr<std::string> pem = CertPem(cert->get());
  if (!pem.ok()) return pem.status();
  ca.impl_->key = *std::move(key);
  ca.impl_->cert = *std::move(cert);
  ca.ca_pem_ = *std::move(pem);
  return ca;
}

absl::StatusOr<DeploymentCa::Issued> DeploymentCa::Issue(const std::string& name) const {
  absl::StatusOr<Key> key = NewKey();
  if (!key.ok()) return key.status();
  absl::StatusOr<Cert> cert =
      MakeCert(name, key->get(), impl_->cert.get(), impl_->key.get(), validity_, false);
  if (!cert.ok()) return cert.status();
  Issued out;
  absl::StatusOr<std::string> cert_pem = CertPem(cert->get());
  if (!cert_pem.ok()) return cert_pem.status();
  absl::StatusOr<std::string> key_pem = KeyPem(key->get());
  if (!key_pem.ok()) return key_pem.status();
  out.cert_pem = *std::move(cert_pem);
  out.key_pem = *std::move(key_pem);
  return out;
}

absl::StatusOr<TlsFiles> DeploymentCa::IssueFiles(const std::string& dir, const std::string& name) {
  TlsFiles files{absl::StrCat(dir, "/ca.crt"), absl::StrCat(dir, "/", name, ".crt"),
                 absl::StrCat(dir, "/", name, ".key")};
  if (!ca_written_) {
    if (absl::Status st = WriteFile(files.ca, ca_pem_, 0644); !st.ok()) return st;
    ca_written_ = true;
  }
  absl::StatusOr<Issued> issued = Issue(name);
  if (!issued.ok()) return issued.status();
  if (absl::Status st = WriteFile(files.cert, issued->cert_pem, 0600); !st.ok()) return st;
  if (absl::Status st = WriteFile(files.key, issued->key_pem, 0600); !st.ok()) return st;
  return files;
}

}  // namespace tandem::launcher
