// How a worker picks its KV data paths (worker/kv_ipc_setup.h): --kv-transport nccl (or ipc)
// with a KV pool in host memory refuses to start with a clear error, in the decode worker too;
// auto and tcp start without NCCL; the kind parses and names round-trip; MakeCudaNccl either
// works (a build with libnccl) or says why not.
#include <memory>
#include <string>

#include "comm/kv_ipc.h"
#include "comm/nccl_api.h"
#include "decode_worker/decode_service.h"
#include "gtest/gtest.h"
#include "tests/engine/fake_model.h"
#include "worker/kv_ipc_setup.h"

namespace tandem {
namespace {

using testing::FakeModel;

std::unique_ptr<Engine> HostEngine(const WorkerOptions& options) {
  auto engine =
      Engine::CreateWithModel(options.engine, std::make_unique<FakeModel>(FakeModel::Options{}));
  EXPECT_TRUE(engine.ok()) << engine.status();
  return engine.ok() ? *std::move(engine) : nullptr;
}

WorkerOptions Options(KvTransportKind kind) {
  WorkerOptions o;
  o.role = WorkerRole::kDecode;
  o.host = o.advertise_host = "127.0.0.1";
  o.engine.page_size = 16;
  o.engine.num_pages = 64;
  o.kv_transport = kind;
  return o;
}

TEST(KvTransportSetupTest, KindsParseAndName) {
  for (const char* name : {"tcp", "ipc", "nccl", "auto"}) {
    absl::StatusOr<KvTransportKind> kind = ParseKvTransportKind(name);
    ASSERT_TRUE(kind.ok()) << name;
    EXPECT_STREQ(KvTransportKindName(*kind), name);
  }
  absl::StatusOr<KvTransportKind> bad = ParseKvTransportKind("NCCL");
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("tcp, ipc, nccl or auto"), std::string::npos);
}

TEST(KvTransportSetupTest, NcclWithAHostPoolIsRefusedWithAClearError) {
  WorkerOptions o = Options(KvTransportKind::kNccl);
  std::unique_ptr<Engine> engine = HostEngine(o);
  ASSERT_NE(engine, nullptr);
  ASSERT_FALSE(engine->kv_pool_on_device());
  absl::StatusOr<std::shared_ptr<NcclKvTransport>> nccl = NcclFor(o, *engine);
  EXPECT_EQ(nccl.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(nccl.status().message().find("--kv-transport nccl needs the KV pool on a GPU"),
            std::string::npos)
      << nccl.status();
  // No IPC device either: nccl does not use it.
  absl::StatusOr<std::shared_ptr<KvIpcDevice>> ipc = KvIpcFor(o, *engine);
  ASSERT_TRUE(ipc.ok());
  EXPECT_EQ(*ipc, nullptr);
  // The decode worker does not start.
  const WorkerEnv env{&o, nullptr, engine.get()};
  absl::StatusOr<std::unique_ptr<DecodeService>> decode = DecodeService::Create(env);
  EXPECT_EQ(decode.status().code(), absl::StatusCode::kFailedPrecondition) << decode.status();
}

TEST(KvTransportSetupTest, AutoAndTcpStartWithoutNccl) {
  for (KvTransportKind kind : {KvTransportKind::kAuto, KvTransportKind::kTcp}) {
    WorkerOptions o = Options(kind);
    std::unique_ptr<Engine> engine = HostEngine(o);
    ASSERT_NE(engine, nullptr);
    absl::StatusOr<std::shared_ptr<NcclKvTransport>> nccl = NcclFor(o, *engine);
    ASSERT_TRUE(nccl.ok()) << nccl.status();
    EXPECT_EQ(*nccl, nullptr);
    const WorkerEnv env{&o, nullptr, engine.get()};
    absl::StatusOr<std::unique_ptr<DecodeService>> decode = DecodeService::Create(env);
    EXPECT_TRUE(decode.ok()) << decode.status();
  }
}

TEST(KvTransportSetupTest, MakeCudaNcclWorksOrSaysWhyNot) {
  absl::StatusOr<std::shared_ptr<NcclApi>> api = MakeCudaNccl();
  if (api.ok()) {
    EXPECT_NE(*api, nullptr);  // a build with libnccl (no device needed to create it)
  } else {
    EXPECT_EQ(api.status().code(), absl::StatusCode::kUnimplemented);
    EXPECT_NE(api.status().message().find("no NCCL KV transport"), std::string::npos)
        << api.status();
  }
}

}  // namespace
}  // namespace tandem
