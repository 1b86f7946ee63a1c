// The launcher's deployment CA (deploy/launcher/deployment_ca.h) and the processes' reading of
// their TLS files (rpc/control_plane_tls.h): issued certificates verify against their CA only,
// name the control plane, are usable as TLS server and client, and are written with private keys
// readable by the owner only; incomplete, missing, unreadable, exposed or non-PEM files are
// refused with an error naming the flag and the file.
#include "deploy/launcher/deployment_ca.h"

#include <openssl/bio.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509_vfy.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "gtest/gtest.h"
#include "rpc/control_plane_tls.h"

namespace tandem::launcher {
namespace {

X509* ParseCert(const std::string& pem) {
  BIO* bio = BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size()));
  X509* x = PEM_read_bio_X509(bio, nullptr, nullptr, nullptr);
  BIO_free(bio);
  return x;
}

// Whether `leaf` chains to `ca` for TLS-client and -server use (OpenSSL's own verifier).
bool Verifies(const std::string& ca, const std::string& leaf, int purpose) {
  X509* ca_cert = ParseCert(ca);
  X509* leaf_cert = ParseCert(leaf);
  X509_STORE* store = X509_STORE_new();
  X509_STORE_add_cert(store, ca_cert);
  X509_STORE_CTX* ctx = X509_STORE_CTX_new();
  X509_STORE_CTX_init(ctx, store, leaf_cert, nullptr);
  X509_STORE_CTX_set_purpose(ctx, purpose);
  const bool ok = X509_verify_cert(ctx) == 1;
  X509_STORE_CTX_free(ctx);
  X509_STORE_free(store);
  X509_free(leaf_cert);
  X509_free(ca_cert);
  return ok;
}

std::string TempDir(const char* name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/", name, "XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

TEST(DeploymentCaTest, IssuedCertificatesVerifyAgainstTheirCaOnly) {
  absl::StatusOr<DeploymentCa> ca = DeploymentCa::Create("test CA", absl::Hours(2));
  ASSERT_TRUE(ca.ok()) << ca.status();
  absl::StatusOr<DeploymentCa> other = DeploymentCa::Create("test CA", absl::Hours(2));
  ASSERT_TRUE(other.ok()) << other.status();
  absl::StatusOr<DeploymentCa::Issued> router = ca->Issue("router");
  ASSERT_TRUE(router.ok()) << router.status();
  EXPECT_TRUE(absl::StrContains(router->key_pem, "-----BEGIN PRIVATE KEY-----"));
  EXPECT_TRUE(Verifies(ca->ca_pem(), router->cert_pem, X509_PURPOSE_SSL_SERVER));
  EXPECT_TRUE(Verifies(ca->ca_pem(), router->cert_pem, X509_PURPOSE_SSL_CLIENT));
  // Same CA name, other key: not trusted.
  EXPECT_FALSE(Verifies(other->ca_pem(), router->cert_pem, X509_PURPOSE_SSL_CLIENT));
  EXPECT_NE(ca->ca_pem(), other->ca_pem());
  // Two issues: different keys.
  absl::StatusOr<DeploymentCa::Issued> again = ca->Issue("router");
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->key_pem, router->key_pem);
  // The name every client checks is in the certificate; the process name is its CN.
  X509* cert = ParseCert(router->cert_pem);
  ASSERT_NE(cert, nullptr);
  EXPECT_EQ(X509_check_host(cert, kControlPlaneTlsName, 0, 0, nullptr), 1);
  EXPECT_NE(X509_check_host(cert, "localhost", 0, 0, nullptr), 1);
  char cn[64] = {};
  X509_NAME_get_text_by_NID(X509_get_subject_name(cert), NID_commonName, cn, sizeof(cn));
  EXPECT_STREQ(cn, "router");
  X509_free(cert);
  // A leaf is no CA: what it signed would not verify.
  EXPECT_FALSE(Verifies(router->cert_pem, again->cert_pem, X509_PURPOSE_SSL_CLIENT));
}

TEST(DeploymentCaTest, FilesAreWrittenForTheOwnerAndLoadBack) {
  absl::StatusOr<DeploymentCa> ca = DeploymentCa::Create("test CA", absl::Hours(2));
  ASSERT_TRUE(ca.ok()) << ca.status();
  const std::string dir = TempDir("tls-files-");
  absl::StatusOr<TlsFiles> files = ca->IssueFiles(dir, "decode-0");
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->ca, dir + "/ca.crt");
  struct stat st;
  ASSERT_EQ(stat(files->key.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  ASSERT_EQ(stat(files->cert.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  absl::StatusOr<ControlPlaneTls> tls = LoadControlPlaneTls(files->ca, files->cert, files->key);
  ASSERT_TRUE(tls.ok()) << tls.status();
  EXPECT_TRUE(tls->enabled());
  EXPECT_EQ(tls->ca_pem, ca->ca_pem());
  EXPECT_TRUE(Verifies(tls->ca_pem, tls->cert_pem, X509_PURPOSE_SSL_SERVER));
}

TEST(DeploymentCaTest, BadTlsFilesAreRefusedNamingFlagAndFile) {
  absl::StatusOr<DeploymentCa> ca = DeploymentCa::Create("test CA", absl::Hours(2));
  ASSERT_TRUE(ca.ok()) << ca.status();
  const std::string dir = TempDir("tls-bad-");
  absl::StatusOr<TlsFiles> f = ca->IssueFiles(dir, "w");
  ASSERT_TRUE(f.ok()) << f.status();
  // None: TLS off.
  absl::StatusOr<ControlPlaneTls> off = LoadControlPlaneTls("", "", "");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->enabled());
  auto error = [](const std::string& ca, const std::string& cert, const std::string& key) {
    absl::StatusOr<ControlPlaneTls> tls = LoadControlPlaneTls(ca, cert, key);
    EXPECT_FALSE(tls.ok());
    EXPECT_EQ(tls.status().code(), absl::StatusCode::kInvalidArgument);
    return std::string(tls.status().message());
  };
  EXPECT_TRUE(absl::StrContains(error(f->ca, "", ""), "missing: --tls-cert, --tls-key"));
  EXPECT_TRUE(absl::StrContains(error("", f->cert, f->key), "missing: --tls-ca"));
  const std::string absent = dir + "/absent.crt";
  EXPECT_TRUE(absl::StrContains(error(f->ca, absent, f->key),
                                "cannot read --tls-cert " + absent + ": No such file"));
  // A key others may read.
  const std::string open_key = dir + "/open.key";
  {
    std::ifstream in(f->key);
    std::ofstream out(open_key);
    out << in.rdbuf();
  }
  chmod(open_key.c_str(), 0644);
  EXPECT_TRUE(absl::StrContains(error(f->ca, f->cert, open_key), "may be read by others"));
  // A key given as the certificate, a certificate as the key.
  EXPECT_TRUE(absl::StrContains(error(f->ca, f->key, f->key), "--tls-cert"));
  EXPECT_TRUE(absl::StrContains(error(f->ca, f->cert, f->cert), "holds no PEM block"));
  // A directory.
  EXPECT_TRUE(absl::StrContains(error(dir, f->cert, f->key), "--tls-ca"));
}

}  // namespace
}  // namespace tandem::launcher
