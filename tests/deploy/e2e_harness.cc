#include "tests/deploy/e2e_harness.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "base/check.h"
#include "engine/engine.h"
#include "engine/model/make_model.h"
#include "gtest/gtest.h"
#include "rpc/cluster_auth.h"

namespace tandem::e2e {

namespace fs = std::filesystem;

namespace {

std::string MakeTempDir(const char* prefix) {
  std::string tmpl = absl::StrCat(fs::temp_directory_path().string(), "/", prefix, "XXXXXX");
  CHECK(mkdtemp(tmpl.data()) != nullptr);
  return tmpl;
}

std::string BinDir() {
  const char* b = std::getenv("TANDEM_BINARY_DIR");
  return absl::StrCat(b ? b : ".", "/bin");
}

std::string* MakePresetDir(const std::string& preset) {
  auto* d = new std::string(MakeTempDir("tandem-e2e-model-") + "/" + preset);
  MakeModelOptions options;
  options.preset = preset;
  options.out_dir = *d;
  CHECK_OK(MakeModel(options).status());
  return d;
}

}  // namespace

std::string ReadFile(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

const std::string& TinyModelDir() {
  static const std::string* dir = MakePresetDir("tiny");
  return *dir;
}

const std::string& SmallQwen3ModelDir() {
  static const std::string* dir = MakePresetDir("small-qwen3");
  return *dir;
}

const std::string& PresetModelDir(const std::string& preset) {
  static absl::Mutex mu;
  static auto* dirs = new std::map<std::string, std::string*>();
  absl::MutexLock l(&mu);
  std::string*& dir = (*dirs)[preset];
  if (dir == nullptr) dir = MakePresetDir(preset);
  return *dir;
}

absl::StatusOr<std::unique_ptr<launcher::Cluster>> TryStartCluster(
    const std::string& layout_yaml,
    const std::function<void(launcher::Layout&, launcher::ClusterOptions&)>& adjust) {
  absl::StatusOr<launcher::Layout> layout = launcher::ParseLayout(layout_yaml);
  if (!layout.ok()) return layout.status();
  layout->router_port = 0;
  layout->router_grpc_port = 0;
  launcher::ClusterOptions options;
  options.bin_dir = BinDir();
  options.model_dir = TinyModelDir();
  options.log_dir = MakeTempDir("tandem-e2e-logs-");
  options.ready_timeout = absl::Seconds(60);
  options.router_drain_timeout_s = 5;
  if (adjust) adjust(*layout, options);
  return launcher::Cluster::Start(*layout, options);
}

std::unique_ptr<launcher::Cluster> StartCluster(
    const std::string& layout_yaml,
    const std::function<void(launcher::Layout&, launcher::ClusterOptions&)>& adjust) {
  absl::StatusOr<std::unique_ptr<launcher::Cluster>> c = TryStartCluster(layout_yaml, adjust);
  EXPECT_TRUE(c.ok()) << c.status();
  return c.ok() ? *std::move(c) : nullptr;
}

StreamResult Generate(const std::string& router_grpc, const GenerateArgs& args) {
  auto stub = tandem::v1::Generation::NewStub(
      args.channel != nullptr
          ? args.channel
          : grpc::CreateChannel(router_grpc, grpc::InsecureChannelCredentials()));
  tandem::v1::GenerateRequest req;
  req.mutable_prompt_tokens()->mutable_ids()->Assign(args.prompt.begin(), args.prompt.end());
  req.mutable_sampling()->set_max_tokens(args.max_tokens);
  req.mutable_sampling()->set_temperature(0.0f);
  req.mutable_sampling()->set_ignore_eos(args.ignore_eos);
  for (const std::string& stop : args.stop) req.mutable_sampling()->add_stop(stop);
  if (args.sampling) args.sampling(*req.mutable_sampling());
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + args.deadline));
  std::unique_ptr<grpc::ClientReader<tandem::v1::GenerateResponse>> reader =
      stub->Generate(&ctx, req);
  if (args.on_start) args.on_start(&ctx);
  StreamResult result;
  tandem::v1::GenerateResponse msg;
  while (reader->Read(&msg)) {
    result.num_messages++;
    result.tokens.insert(result.tokens.end(), msg.token_ids().begin(), msg.token_ids().end());
    result.text += msg.text();
    result.logprobs.insert(result.logprobs.end(), msg.logprobs().begin(), msg.logprobs().end());
    if (msg.finish_reason() != tandem::v1::FINISH_REASON_UNSPECIFIED) {
      result.finish = msg.finish_reason();
      result.last = msg;
    }
    if (args.on_message && !args.on_message(result)) {
      ctx.TryCancel();
      break;
    }
  }
  result.status = reader->Finish();
  return result;
}

std::vector<int32_t> ReferenceGreedy(const std::string& model_dir, const GenerateArgs& args,
                                     const std::string& quantization) {
  EngineOptions options;
  options.model_dir = model_dir;
  options.num_pages = 256;
  options.quantization = quantization;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  CHECK_OK(engine.status());
  EngineRequest req;
  req.id = "reference";
  req.prompt_tokens = args.prompt;
  req.sampling.temperature = 0.0f;
  req.sampling.max_tokens = args.max_tokens;
  req.sampling.ignore_eos = args.ignore_eos;
  CHECK_OK((*engine)->AddRequest(req));
  std::vector<int32_t> tokens;
  while ((*engine)->HasWork()) {
    absl::StatusOr<std::vector<RequestOutput>> outs = (*engine)->Step();
    CHECK_OK(outs.status());
    for (const RequestOutput& o : *outs) {
      tokens.insert(tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
    }
  }
  return tokens;
}

ReferenceResult Reference(const std::string& model_dir, const std::vector<int32_t>& prompt,
                          const SamplingParams& sampling) {
  EngineOptions options;
  options.model_dir = model_dir;
  options.num_pages = 256;
  absl::StatusOr<std::unique_ptr<Engine>> engine = Engine::Create(options);
  CHECK_OK(engine.status());
  EngineRequest req;
  req.id = "reference";
  req.prompt_tokens = prompt;
  req.sampling = sampling;
  CHECK_OK((*engine)->AddRequest(req));
  ReferenceResult result;
  while ((*engine)->HasWork()) {
    absl::StatusOr<std::vector<RequestOutput>> outs = (*engine)->Step();
    CHECK_OK(outs.status());
    for (const RequestOutput& o : *outs) {
      result.tokens.insert(result.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      result.logprobs.insert(result.logprobs.end(), o.logprobs.begin(), o.logprobs.end());
      if (o.finish_reason != FinishReason::kNone) result.finish = o.finish_reason;
    }
  }
  return result;
}

ControlPlaneTls ClientTls(const launcher::Cluster& cluster) {
  const launcher::TlsFiles& f = cluster.client_tls();
  if (f.ca.empty()) return {};
  static absl::Mutex mu;
  static auto* loaded = new std::map<std::string, ControlPlaneTls>;
  absl::MutexLock l(&mu);
  auto it = loaded->find(f.cert);
  if (it == loaded->end()) {
    absl::StatusOr<ControlPlaneTls> tls = LoadControlPlaneTls(f.ca, f.cert, f.key);
    CHECK_OK(tls.status());
    it = loaded->emplace(f.cert, *std::move(tls)).first;
  }
  return it->second;
}

tandem::v1::LoadReport GetLoad(const launcher::Cluster& cluster, const std::string& worker_grpc) {
  return GetLoad(worker_grpc, cluster.cluster_token(), ClientTls(cluster));
}

tandem::v1::LoadReport GetLoad(const std::string& worker_grpc, const std::string& cluster_token,
                               const ControlPlaneTls& tls) {
  auto stub = tandem::v1::Worker::NewStub(
      ClusterChannel(worker_grpc, cluster_token, grpc::ChannelArguments(), tls));
  grpc::ClientContext ctx;
  ctx.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(2)));
  tandem::v1::LoadReport load;
  grpc::Status st = stub->GetLoad(&ctx, tandem::v1::GetLoadRequest(), &load);
  if (!st.ok()) load.set_num_waiting(-1);  // unreachable: never "idle"
  return load;
}

bool WaitForIdle(launcher::Cluster& cluster, absl::Duration timeout, std::string* why) {
  const absl::Time deadline = absl::Now() + timeout;
  std::string last;
  do {
    last.clear();
    for (launcher::Process* w : cluster.workers()) {
      if (w->child == nullptr || !w->child->Running()) continue;
      const tandem::v1::LoadReport l = GetLoad(cluster, w->grpc_address);
      if (l.num_pages_reserved() != 0 || l.num_pages_owned() != 0 || l.num_waiting() != 0 ||
          l.num_running() != 0) {
        absl::StrAppend(&last, w->name, ": ", l.ShortDebugString(), "; ");
      }
    }
    if (last.empty()) return true;
    absl::SleepFor(absl::Milliseconds(20));
  } while (absl::Now() < deadline);
  if (why != nullptr) *why = last;
  return false;
}

std::vector<int32_t> Prompt(int n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = 10 + static_cast<int32_t>(rng() % 290);
  return p;
}

}  // namespace tandem::e2e
