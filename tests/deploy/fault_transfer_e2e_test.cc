// The fault matrix's transfer phase ([hardening], issue 27; the other phases are in
// fault_matrix_e2e_test): real processes on loopback, the tiny model. The KV of three requests
// is in flight from the prefill worker to the decode worker — each has streamed its first token,
// the prefill worker holds its pages and none is prefilling or queued there — when the decode
// worker freezes (SIGSTOP), is killed, or the prefill worker or the router is killed, or the
// clients disconnect. The transfer is held open by freezing the decode worker just before its
// KV arrives (the tiny model's KV moves in well under a millisecond otherwise); each cell then
// thaws it (SIGCONT) at once, except the one that tests the freeze itself. In every cell each
// client gets one terminal answer within kAnswerBound of the fault, the launcher restarts what
// died and service resumes within kResumeBound, and no worker holds a reserved or owned page
// kIdleBound after that. Each cell prints its figures ("matrix: ...").
#include <signal.h>

#include <iostream>

#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "tests/deploy/fault_clients.h"

namespace tandem::e2e {
namespace {

// The router marks a silent worker down after 16 missed heartbeats of 500 ms (8 s; the default
// is 3): long enough that three prompts are prefilled while the decode worker is frozen, on a
// loaded machine too.
constexpr absl::Duration kAnswerBound = absl::Seconds(12);
constexpr absl::Duration kResumeBound = absl::Seconds(20);
constexpr absl::Duration kIdleBound = absl::Seconds(5);
// A frozen decode worker: the prefill worker's pages of the requests the router gave up on are
// free this long after the router's last answer, the decode worker still frozen.
constexpr absl::Duration kFrozenReleaseBound = absl::Seconds(1);
constexpr int kClients = 3;
// 30 prefill steps of 16 tokens each: the three requests (their calls start together) all reach
// the prefill worker while the first is still being prefilled.
constexpr int kPrompt = 480;
constexpr int kMaxTokens = 24;

constexpr char kLayout[] = R"(
engine: {page_size: 16, num_pages: 1024}
router: {args: [--missed-heartbeats, "16"]}
groups:
  - {role: prefill, count: 1, args: [--max-num-batched-tokens, "16", --max-num-seqs, "1"]}
  - {role: decode, count: 1}
)";

enum class Fault { kFreezeDecode, kKillDecode, kKillPrefill, kKillRouter, kCancel };

const char* Name(Fault f) {
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

void RunCell(launcher::Cluster& c, Fault fault) {
  // Prompts of their own per cell: the prefill worker's prefix cache would serve repeats at once.
  const uint32_t seed = 6100 + 10 * static_cast<uint32_t>(fault);
  SCOPED_TRACE(Name(fault));
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
  // Every request has its decode pages reserved once it is in the prefill worker (the router
  // reserves first): freeze the decode worker then, before any KV reaches it.
  absl::Time give_up = absl::Now() + absl::Seconds(20);
  tandem::v1::LoadReport l;
  while (absl::Now() < give_up) {
    l = GetLoad(c, prefill->grpc_address);
    if (l.num_running() + l.num_waiting() == kClients) break;
    absl::SleepFor(absl::Milliseconds(1));
  }
  ASSERT_LT(absl::Now(), give_up) << "the requests never reached the prefill worker together: "
                                  << l.ShortDebugString();
  decode->child->Signal(SIGSTOP);
  const absl::Time frozen_at = absl::Now();
  // The transfer phase: every first token streamed, nothing left to prefill, pages still held.
  give_up = absl::Now() + absl::Seconds(7);  // within the 8 s the router waits for decode-0
  while (absl::Now() < give_up) {
    l = GetLoad(c, prefill->grpc_address);
    if (clients.NumWithTokens(1) == kClients && l.num_running() == 0 && l.num_waiting() == 0 &&
        l.num_pages_owned() > 0) {
      break;
    }
    absl::SleepFor(absl::Milliseconds(2));
  }
  if (absl::Now() >= give_up) decode->child->Signal(SIGCONT);
  ASSERT_LT(absl::Now(), give_up) << "the transfer phase was never reached: "
                                  << l.ShortDebugString();
  EXPECT_GE(l.num_pages_owned(), kClients * kPrompt / 16);  // every request's prompt pages
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
  std::cout << absl::StrFormat(
      "matrix: %-38s last terminal answer %6.0f ms, serving again %6.0f ms, "
      "no page held %6.0f ms after the fault (%s)\n",
      Name(fault), absl::ToDoubleMilliseconds(worst), absl::ToDoubleMilliseconds(resumed),
      absl::ToDoubleMilliseconds(idle), Answers(clients));
}

TEST(FaultTransferE2E, EachClientGetsOneTerminalAnswerNoPageLeaksServiceResumes) {
  std::unique_ptr<launcher::Cluster> c = StartCluster(kLayout);
  ASSERT_NE(c, nullptr);
  for (Fault fault : {Fault::kFreezeDecode, Fault::kKillDecode, Fault::kKillPrefill,
                      Fault::kKillRouter, Fault::kCancel}) {
    RunCell(*c, fault);
    if (HasFatalFailure()) break;
  }
  EXPECT_TRUE(c->Shutdown(absl::Seconds(20)).ok());
}

}  // namespace
}  // namespace tandem::e2e
