// The fault matrix's transfer phase ([hardening], issue 27; the other phases are in
// fault_matrix_e2e_test): real processes on loopback. The KV of three requests is in flight from
// the prefill worker to the decode worker — each has streamed its first token, the prefill
// worker holds its pages and none is prefilling or queued there — when the decode worker freezes
// (SIGSTOP), is killed, or the prefill worker or the router is killed, or the clients
// disconnect. A small model's KV moves in well under a millisecond, so the transfer is held
// open in one of two places: (1) before any byte: the decode worker is frozen just before its KV
// arrives, and each cell thaws it (SIGCONT) at once, except the one that tests the freeze
// itself; (2) with every page written (over IPC: the copies into the decode worker's granted
// pages enqueued and landed) and the completion not yet sent: the prefill worker's
// --kv-transfer-hold-ms. In every cell each client
// gets one terminal answer within kAnswerBound of the fault, the launcher restarts what died and
// service resumes within kResumeBound, no worker holds a reserved or owned page kIdleBound after
// that, and a request through both workers again gives the tokens it gave before the first
// fault. Each cell prints its figures ("matrix: ...") and its verdict ("cell: NAME: PASS|FAIL").
//
// Built twice from this file: fault_transfer_e2e_test (label cpu): the CPU backend, the host TCP
// transport, the tiny model; fault_transfer_gpu_test (label gpu, TANDEM_FAULT_GPU; skips without
// a device): the CUDA backend with both workers on GPU 0 and kv_transport ipc (the decode worker's
// pool mapped into the prefill worker, pages written in place layer by layer), the small-qwen3
// preset (head_dim 128, what the CUDA kernels take), longer prompts.
#include <signal.h>

#include <cstdlib>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "base/check.h"
#include "engine/cuda/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/deploy/fault_clients.h"

namespace tandem::e2e {
namespace {

// The router marks a silent worker down after 16 missed heartbeats of 500 ms (8 s; the default
// is 3): long enough that three prompts are prefilled while the decode worker is frozen, on a
// loaded machine too.
constexpr absl::Duration kAnswerBound = absl::Seconds(12);
constexpr absl::Duration kIdleBound = absl::Seconds(5);
// A frozen decode worker: the prefill worker's pages of the requests the router gave up on are
// free this long after the router's last answer, the decode worker still frozen.
constexpr absl::Duration kFrozenReleaseBound = absl::Seconds(1);
constexpr int kClients = 3;
constexpr int kMaxTokens = 24;
// Where (2) holds each transfer: long enough to see and fault it, short enough that ServeAgain's
// requests (5 s deadline) pass through a held transfer.
constexpr char kHoldMs[] = "2500";

#ifdef TANDEM_FAULT_GPU
constexpr bool kGpu = true;
constexpr char kTransport[] = "ipc";
// A restarted worker initializes CUDA, loads the model and captures its graphs first.
constexpr absl::Duration kResumeBound = absl::Seconds(60);
// 125 prefill steps of 16 tokens each (a step takes ~1 ms on a GPU): the three requests reach
// the prefill worker while the first is still being prefilled.
constexpr int kPrompt = 2000;
// The prefix cache is off so that the check request after the faults recomputes its prompt in
// the same chunks as before them (the same bf16 rounding, hence the same greedy tokens).
constexpr char kLayout[] = R"(
backend: cuda
kv_transport: ipc
engine: {page_size: 16, gpu_memory_utilization: 0.3, max_model_len: 4096,
         enable_prefix_caching: false}
router: {args: [--missed-heartbeats, "16"]}
groups:
  - {role: prefill, count: 1, gpus: [0], args: [--max-num-batched-tokens, "16", --max-num-seqs, "1"]}
  - {role: decode, count: 1, gpus: [0]}
)";
#else
constexpr bool kGpu = false;
constexpr char kTransport[] = "tcp";
constexpr absl::Duration kResumeBound = absl::Seconds(20);
// 30 prefill steps of 16 tokens each: the three requests (their calls start together) all reach
// the prefill worker while the first is still being prefilled.
constexpr int kPrompt = 480;
constexpr char kLayout[] = R"(
kv_transport: tcp
engine: {page_size: 16, num_pages: 1024, enable_prefix_caching: false}
router: {args: [--missed-heartbeats, "16"]}
groups:
  - {role: prefill, count: 1, args: [--max-num-batched-tokens, "16", --max-num-seqs, "1"]}
  - {role: decode, count: 1}
)";
#endif

const std::string& ModelDir() { return kGpu ? SmallQwen3ModelDir() : TinyModelDir(); }

// The request that checks the service after each fault: 300 prompt tokens (19 pages, the last
// one partial) through both workers, its KV over the transport.
StreamResult CheckRequest(const launcher::Cluster& c) {
  GenerateArgs args;
  args.prompt = Prompt(300, 7777);
  args.max_tokens = 8;
  args.deadline = absl::Seconds(30);
  return Generate(c.router().grpc_address, args);
}

// Failed assertions of the running test so far (a cell's verdict is the difference).
int FailedParts() {
  const testing::TestResult* r = testing::UnitTest::GetInstance()->current_test_info()->result();
  int failed = 0;
  for (int i = 0; i < r->total_part_count(); ++i) failed += r->GetTestPartResult(i).failed();
  return failed;
}

enum class Fault { kFreezeDecode, kKillDecode, kKillPrefill, kKillRouter, kCancel };

const char* FaultName(Fault f) {
  switch (f) {
    case Fault::kFreezeDecode:
      return "SIGSTOP decode-0 across the transfer";
    case Fault::kKillDecode:
      return "SIGKILL decode-0 while transferring";
    case Fault::kKillPrefill:
      return "SIGKILL prefill-0 while transferring";
    case Fault::kKillRouter:
      return "SIGKILL router while transferring";
    case Fault::kCancel:
      return "cancel while transferring";
  }
  return "";
}

std::string Name(Fault f, bool held) {
  return absl::StrCat(FaultName(f), held ? " (pages written)" : " (before the KV)");
}

// `held`: the cluster's prefill worker holds every transfer with its pages written (2);
// otherwise the cell freezes the decode worker before the KV arrives (1).
void RunCell(launcher::Cluster& c, Fault fault, bool held,
             const std::vector<int32_t>& check_tokens) {
  // Prompts of their own per cell (a prefix cache, where on, would serve repeats at once).
  const uint32_t seed = 6100 + 10 * static_cast<uint32_t>(fault) + (held ? 5 : 0);
  SCOPED_TRACE(Name(fault, held));
  launcher::Process* prefill = c.Find("prefill-0");
  launcher::Process* decode = c.Find("decode-0");
  ASSERT_NE(prefill, nullptr);
  ASSERT_NE(decode, nullptr);
  FaultClients clients(c.router().grpc_address, kClients, [seed](int i) {
    GenerateArgs args;
    args.prompt = Prompt(kPrompt, seed + i);
    args.max_tokens = kMaxTokens;
    args.deadline = absl::Seconds(60);
    return args;
  });
  absl::Time give_up = absl::Now() + absl::Seconds(20);
  tandem::v1::LoadReport l;
  if (!held) {
    // Every request has its decode pages reserved once it is in the prefill worker (the router
    // reserves first): freeze the decode worker then, before any KV reaches it.
    while (absl::Now() < give_up) {
      l = GetLoad(c, prefill->grpc_address);
      if (l.num_running() + l.num_waiting() == kClients) break;
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_LT(absl::Now(), give_up)
        << "the requests never reached the prefill worker together: " << l.ShortDebugString();
    decode->child->Signal(SIGSTOP);
  }
  absl::Time frozen_at = absl::Now();
  // The transfer phase: every first token streamed, nothing left to prefill, every request's
  // prompt pages still held. (The load report is the engine's after its last step, published
  // just after that step's first tokens went out: the pages count waits for it.)
  give_up = absl::Now() + absl::Seconds(7);  // within the 8 s the router waits for decode-0
  while (absl::Now() < give_up) {
    l = GetLoad(c, prefill->grpc_address);
    if (clients.NumWithTokens(1) == kClients && l.num_running() == 0 && l.num_waiting() == 0 &&
        l.num_pages_owned() >= kClients * kPrompt / 16) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  if (absl::Now() >= give_up) decode->child->Signal(SIGCONT);
  ASSERT_LT(absl::Now(), give_up) << "the transfer phase was never reached: "
                                  << l.ShortDebugString();
  if (held) {
    // The decode side holds the pages it received for the transfers: reserved until completion.
    EXPECT_GE(GetLoad(c, decode->grpc_address).num_pages_reserved(), kClients * kPrompt / 16);
    if (fault == Fault::kFreezeDecode) {
      decode->child->Signal(SIGSTOP);
      frozen_at = absl::Now();
    }
  }
  const absl::Time fault_at = fault == Fault::kFreezeDecode ? frozen_at : absl::Now();
  std::vector<grpc::StatusCode> codes = {grpc::StatusCode::UNAVAILABLE};
  switch (fault) {
    case Fault::kFreezeDecode:
      break;  // the router gives up on the silent decode worker
    case Fault::kKillDecode:
      decode->child->Signal(SIGKILL);
      break;
    case Fault::kKillPrefill:
      prefill->child->Signal(SIGKILL);
      decode->child->Signal(SIGCONT);
      break;
    case Fault::kKillRouter:
      c.router().child->Signal(SIGKILL);
      decode->child->Signal(SIGCONT);
      break;
    case Fault::kCancel:
      clients.CancelAll();
      decode->child->Signal(SIGCONT);
      codes = {grpc::StatusCode::CANCELLED};
      break;
  }
  clients.Join();
  if (fault == Fault::kFreezeDecode) {
    // The router gave up on the frozen decode worker and aborted the requests on the prefill
    // worker: its transfer threads, blocked on the silent peer, must give the pages back within
    // kFrozenReleaseBound while the decode worker is still frozen (not after the 30 s transfer
    // timeout, --kv-transfer-timeout-ms).
    const absl::Time answered = absl::Now();
    int owned = -1;
    while (true) {
      owned = GetLoad(c, prefill->grpc_address).num_pages_owned();
      if (owned == 0 || absl::Now() - answered > kFrozenReleaseBound) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    const absl::Duration released = absl::Now() - answered;
    EXPECT_EQ(owned, 0) << "prefill-0 still owns pages " << absl::FormatDuration(released)
                        << " after the router gave up on the frozen decode-0";
    std::cout << absl::StrFormat(
        "matrix: prefill-0 owns %d pages %.0f ms after the last answer, decode-0 still frozen\n",
        owned, absl::ToDoubleMilliseconds(released));
    decode->child->Signal(SIGCONT);
  }
  ExpectTerminalAnswers(clients, codes, /*complete_ok=*/false);
  const absl::Duration worst = clients.Worst(fault_at);
  EXPECT_LT(worst, kAnswerBound);
  const absl::Duration resumed =
      ServeAgain(c, fault_at, {{"prefill", 1}, {"decode", 1}}, kResumeBound);
  EXPECT_LT(resumed, kResumeBound);
  std::string why;
  EXPECT_TRUE(WaitForIdle(c, kIdleBound, &why)) << why;
  const absl::Duration idle = absl::Now() - fault_at;
  // The surviving worker and the restarted one serve correctly: the KV of a prompt lands where
  // the decode worker reads it (a stale mapping of a dead peer's pool would give other tokens).
  const StreamResult check = CheckRequest(c);
  EXPECT_TRUE(check.status.ok()) << check.status.error_message();
  EXPECT_EQ(check.tokens, check_tokens) << "the check request's tokens changed after the fault";
  EXPECT_TRUE(WaitForIdle(c, kIdleBound, &why)) << why;
  std::cout << absl::StrFormat(
      "matrix: %-60s last terminal answer %6.0f ms, serving again %6.0f ms, "
      "no page held %6.0f ms after the fault (%s)\n",
      Name(fault, held), absl::ToDoubleMilliseconds(worst), absl::ToDoubleMilliseconds(resumed),
      absl::ToDoubleMilliseconds(idle), Answers(clients));
}

// Starts the layout (`held`: the prefill worker holds every transfer with its pages written),
// checks the transport, and runs every cell on it.
void RunCells(bool held) {
  if (kGpu && !CudaDeviceAvailable()) GTEST_SKIP() << "no CUDA device";
  std::string log_dir;
  std::unique_ptr<launcher::Cluster> c = StartCluster(
      kLayout, [&log_dir, held](launcher::Layout& layout, launcher::ClusterOptions& options) {
        options.model_dir = ModelDir();
        options.ready_timeout = absl::Seconds(kGpu ? 180 : 60);  // CUDA: loads, graph captures
        log_dir = options.log_dir;
        // Held: the three prompts are prefilled in the same step or the next (not one at a
        // time), so that their holds overlap.
        for (launcher::GroupSpec& g : layout.groups) {
          if (held && g.role == "prefill") {
            g.args = {"--max-num-batched-tokens", "8192", "--kv-transfer-hold-ms", kHoldMs};
          }
        }
      });
  ASSERT_NE(c, nullptr);
  // The decode worker takes the pages over the transport under test.
  const std::string decode_log = ReadFile(absl::StrCat(log_dir, "/decode-0.log"));
  EXPECT_NE(decode_log.find(absl::StrCat("KV transport: ", kTransport)), std::string::npos)
      << "decode-0 log:\n"
      << decode_log;
  const StreamResult check = CheckRequest(*c);
  ASSERT_TRUE(check.status.ok()) << check.status.error_message();
  ASSERT_EQ(check.tokens.size(), 8u);
  for (Fault fault : {Fault::kFreezeDecode, Fault::kKillDecode, Fault::kKillPrefill,
                      Fault::kKillRouter, Fault::kCancel}) {
    const int failed_before = FailedParts();
    RunCell(*c, fault, held, check.tokens);
    std::cout << "cell: " << Name(fault, held) << ": "
              << (FailedParts() == failed_before ? "PASS" : "FAIL") << std::endl;
    if (testing::Test::HasFatalFailure()) break;
  }
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

TEST(FaultTransferE2E, BeforeTheKvEachClientGetsOneTerminalAnswerNoPageLeaksServiceResumes) {
  RunCells(/*held=*/false);
}

TEST(FaultTransferE2E, PagesWrittenEachClientGetsOneTerminalAnswerNoPageLeaksServiceResumes) {
  RunCells(/*held=*/true);
}

}  // namespace
}  // namespace tandem::e2e
