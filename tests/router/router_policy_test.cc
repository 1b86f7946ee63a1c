// Routing policies, admission and the worker registry: the router's decisions,
// tested as values without any network.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "base/page_hash.h"
#include "router/admission.h"
#include "router/routing_policy.h"
#include "router/worker_registry.h"
#include "tests/base/fake_clock.h"

namespace tandem::router {
namespace {

using tandem::v1::WORKER_ROLE_DECODE;
using tandem::v1::WORKER_ROLE_MIXED;
using tandem::v1::WORKER_ROLE_PREFILL;

WorkerSnapshot Worker(const std::string& id, tandem::v1::WorkerRole role, int outstanding = 0,
                      int free_pages = 100) {
  WorkerSnapshot w;
  w.id = id;
  w.epoch = 1;
  w.role = role;
  w.healthy = true;
  w.outstanding = outstanding;
  w.load.set_num_pages_free(free_pages);
  return w;
}

TEST(RoutingPolicyTest, LeastLoadedPicksIdleWorkersAndMorePages) {
  auto policy = MakeLeastLoadedPolicy();
  std::vector<WorkerSnapshot> workers = {
      Worker("p0", WORKER_ROLE_PREFILL, 3), Worker("p1", WORKER_ROLE_PREFILL, 1),
      Worker("d0", WORKER_ROLE_DECODE, 2, 500), Worker("d1", WORKER_ROLE_DECODE, 2, 900),
      Worker("d2", WORKER_ROLE_DECODE, 5, 5000)};
  absl::StatusOr<RoutePlan> plan = policy->Pick(workers, RouteQuery());
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->mixed);
  EXPECT_EQ(plan->prefill.id, "p1");
  EXPECT_EQ(plan->decode.id, "d1");  // same load as d0, more free pages
  // Reported queue depth counts too.
  workers[1].load.set_num_waiting(10);
  plan = policy->Pick(workers, RouteQuery());
  EXPECT_EQ(plan->prefill.id, "p0");
}

TEST(RoutingPolicyTest, SkipsDownDrainingAndExcludedWorkers) {
  auto policy = MakeLeastLoadedPolicy();
  std::vector<WorkerSnapshot> workers = {Worker("p0", WORKER_ROLE_PREFILL),
                                         Worker("d0", WORKER_ROLE_DECODE),
                                         Worker("d1", WORKER_ROLE_DECODE, 9)};
  workers[1].healthy = false;
  EXPECT_EQ(policy->Pick(workers, RouteQuery())->decode.id, "d1");
  workers[1].healthy = true;
  workers[1].draining = true;
  EXPECT_EQ(policy->Pick(workers, RouteQuery())->decode.id, "d1");
  workers[1].draining = false;
  RouteQuery query;
  query.excluded.insert("d0");
  EXPECT_EQ(policy->Pick(workers, query)->decode.id, "d1");
  query.excluded.insert("d1");
  absl::StatusOr<RoutePlan> none = policy->Pick(workers, query);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnavailable);
}

TEST(RoutingPolicyTest, MixedWhenNoPairAndUnavailableWhenNothing) {
  auto policy = MakeRoundRobinPolicy();
  std::vector<WorkerSnapshot> workers = {Worker("p0", WORKER_ROLE_PREFILL),
                                         Worker("m0", WORKER_ROLE_MIXED)};
  absl::StatusOr<RoutePlan> plan = policy->Pick(workers, RouteQuery());
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->mixed);
  EXPECT_EQ(plan->decode.id, "m0");
  EXPECT_TRUE(HasUsableWorkers(workers));
  workers.pop_back();
  EXPECT_FALSE(HasUsableWorkers(workers));
  EXPECT_EQ(policy->Pick(workers, RouteQuery()).status().code(), absl::StatusCode::kUnavailable);
}

TEST(RoutingPolicyTest, RoundRobinCycles) {
  auto policy = MakeRoundRobinPolicy();
  std::vector<WorkerSnapshot> workers = {Worker("p0", WORKER_ROLE_PREFILL),
                                         Worker("d0", WORKER_ROLE_DECODE),
                                         Worker("d1", WORKER_ROLE_DECODE)};
  std::vector<std::string> decodes;
  for (int i = 0; i < 4; ++i) decodes.push_back(policy->Pick(workers, RouteQuery())->decode.id);
  EXPECT_EQ(decodes, (std::vector<std::string>{"d0", "d1", "d0", "d1"}));
  EXPECT_FALSE(MakeRoutingPolicy("random").ok());
}

TEST(AdmissionTest, RunsQueuesRejectsAndCancels) {
  AdmissionController admission(/*max_running=*/2, /*max_waiting=*/2);
  std::vector<int> started;
  auto start = [&](int i) { return [&started, i] { started.push_back(i); }; };
  ASSERT_TRUE(admission.Admit(0, start(0)).ok());
  ASSERT_TRUE(admission.Admit(1, start(1)).ok());
  ASSERT_TRUE(admission.Admit(2, start(2)).ok());
  ASSERT_TRUE(admission.Admit(3, start(3)).ok());
  EXPECT_EQ(started, (std::vector<int>{0, 1}));
  EXPECT_EQ(admission.waiting(), 2);
  absl::Status full = admission.Admit(4, start(4));
  EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(admission.CancelWaiting(2));
  EXPECT_FALSE(admission.CancelWaiting(2));
  admission.Release(0);  // 0 done → 3 starts (2 was cancelled)
  EXPECT_EQ(started, (std::vector<int>{0, 1, 3}));
  EXPECT_EQ(admission.running(), 2);
  admission.Release(0);  // twice: no effect
  EXPECT_EQ(admission.running(), 2);
  admission.Release(1);
  admission.Release(3);
  EXPECT_EQ(admission.running(), 0);
}

TEST(AdmissionTest, KvCapacityBoundsWhatRunsAndAGrowingPoolStartsWaiters) {
  AdmissionController admission(AdmissionOptions{100, 10, absl::ZeroDuration()});
  admission.SetCapacity(1000);
  std::vector<int> started;
  auto start = [&](int i) { return [&started, i] { started.push_back(i); }; };
  ASSERT_TRUE(admission.Admit(1, start(1), nullptr, 600).ok());
  ASSERT_TRUE(admission.Admit(2, start(2), nullptr, 300).ok());
  ASSERT_TRUE(admission.Admit(3, start(3), nullptr, 200).ok());  // 1100 > 1000: waits
  ASSERT_TRUE(admission.Admit(4, start(4), nullptr, 50).ok());   // fits, but FIFO behind 3
  EXPECT_EQ(started, (std::vector<int>{1, 2}));
  EXPECT_EQ(admission.running_kv_tokens(), 900);
  admission.SetCapacity(1200);  // a worker joined
  EXPECT_EQ(started, (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(admission.running_kv_tokens(), 1150);
  // Larger than the whole pool: runs once nothing else does.
  ASSERT_TRUE(admission.Admit(5, start(5), nullptr, 5000).ok());
  for (uint64_t t : {1, 2, 3}) admission.Release(t);
  EXPECT_EQ(started.size(), 4u);
  admission.Release(4);
  EXPECT_EQ(started, (std::vector<int>{1, 2, 3, 4, 5}));
}

TEST(AdmissionTest, WaitersPastMaxQueueTimeAreRejectedWithResourceExhausted) {
  ::tandem::testing::FakeClock clock;
  AdmissionController admission(AdmissionOptions{1, 10, absl::Seconds(5), &clock});
  std::vector<int> started;
  std::vector<std::pair<int, absl::StatusCode>> rejected;
  auto start = [&](int i) { return [&started, i] { started.push_back(i); }; };
  auto reject = [&](int i) {
    return [&rejected, i](const absl::Status& s) { rejected.emplace_back(i, s.code()); };
  };
  ASSERT_TRUE(admission.Admit(1, start(1), reject(1)).ok());
  ASSERT_TRUE(admission.Admit(2, start(2), reject(2)).ok());
  clock.Advance(absl::Seconds(3));
  ASSERT_TRUE(admission.Admit(3, start(3), reject(3)).ok());
  EXPECT_EQ(admission.ExpireWaiting(), 0);
  clock.Advance(absl::Seconds(2));  // 2 has waited 5 s, 3 only 2 s
  EXPECT_EQ(admission.ExpireWaiting(), 1);
  EXPECT_EQ(
      rejected,
      (std::vector<std::pair<int, absl::StatusCode>>{{2, absl::StatusCode::kResourceExhausted}}));
  admission.Release(1);
  EXPECT_EQ(started, (std::vector<int>{1, 3}));
  EXPECT_EQ(admission.waiting(), 0);
}

tandem::v1::RegisterRequest Registration(const std::string& id, tandem::v1::WorkerRole role) {
  tandem::v1::RegisterRequest r;
  r.set_protocol_version(tandem::v1::PROTOCOL_VERSION_CURRENT);
  r.set_worker_id(id);
  r.set_instance_id("instance-" + id);
  r.set_role(role);
  r.set_address("127.0.0.1:1");
  r.mutable_model()->set_vocab_size(258);
  return r;
}

TEST(WorkerRegistryTest, RefusesMismatchedProtocolAndModel) {
  RegistryOptions options;
  options.expected_model.set_vocab_size(258);
  WorkerRegistry registry(options);
  tandem::v1::RegisterRequest r = Registration("d0", WORKER_ROLE_DECODE);
  r.set_protocol_version(static_cast<tandem::v1::ProtocolVersion>(7));
  absl::StatusOr<tandem::v1::RegisterResponse> refused = registry.Register(r);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(refused.status().message()),
              ::testing::AllOf(
                  ::testing::HasSubstr("version 7"),
                  ::testing::HasSubstr(absl::StrCat(
                      "speaks version ", static_cast<int>(tandem::v1::PROTOCOL_VERSION_CURRENT)))));
  r = Registration("d0", WORKER_ROLE_DECODE);
  r.mutable_model()->set_vocab_size(1000);
  EXPECT_THAT(std::string(registry.Register(r).status().message()),
              ::testing::HasSubstr("vocab_size"));
  EXPECT_TRUE(registry.Snapshot().empty());
}

TEST(WorkerRegistryTest, HeartbeatsExpiryAndReregistration) {
  ::tandem::testing::FakeClock clock;
  RegistryOptions options;
  options.heartbeat_interval = absl::Milliseconds(100);
  options.missed_heartbeats_limit = 3;
  options.clock = &clock;
  WorkerRegistry registry(options);
  std::vector<std::pair<std::string, uint64_t>> down;
  registry.SetDownListener(
      [&](const std::string& id, uint64_t epoch) { down.emplace_back(id, epoch); });
  absl::StatusOr<tandem::v1::RegisterResponse> reg =
      registry.Register(Registration("d0", WORKER_ROLE_DECODE));
  ASSERT_TRUE(reg.ok());
  EXPECT_EQ(reg->heartbeat_interval_ms(), 100);
  tandem::v1::HeartbeatRequest hb;
  hb.set_worker_id("d0");
  hb.set_instance_id("instance-d0");
  hb.set_epoch(reg->epoch());
  hb.mutable_load()->set_num_waiting(4);
  EXPECT_FALSE(registry.Heartbeat(hb)->reregister());
  EXPECT_EQ(registry.Snapshot()[0].load.num_waiting(), 4);
  // Within the limit nothing happens; a heartbeat starts the limit again; a nanosecond past it
  // the worker is down and must re-register.
  clock.Advance(absl::Milliseconds(200));
  EXPECT_EQ(registry.ExpireStale(clock.Now()), 0);
  EXPECT_FALSE(registry.Heartbeat(hb)->reregister());
  clock.Advance(absl::Milliseconds(300));
  EXPECT_EQ(registry.ExpireStale(clock.Now()), 0);
  EXPECT_TRUE(down.empty());
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(registry.ExpireStale(clock.Now()), 1);
  EXPECT_EQ(registry.ExpireStale(clock.Now() + absl::Hours(1)), 0);  // already down
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0].second, reg->epoch());
  EXPECT_FALSE(registry.Snapshot()[0].healthy);
  EXPECT_TRUE(registry.Heartbeat(hb)->reregister());
  EXPECT_EQ(registry.Stub("d0", reg->epoch() + 100), nullptr);
  absl::StatusOr<tandem::v1::RegisterResponse> again =
      registry.Register(Registration("d0", WORKER_ROLE_DECODE));
  ASSERT_TRUE(again.ok());
  EXPECT_NE(again->epoch(), reg->epoch());
  EXPECT_TRUE(registry.Snapshot()[0].healthy);
  EXPECT_NE(registry.Stub("d0", again->epoch()), nullptr);
  // A restart while still marked up counts as the old epoch going down.
  ASSERT_TRUE(registry.Register(Registration("d0", WORKER_ROLE_DECODE)).ok());
  ASSERT_EQ(down.size(), 2u);
  EXPECT_EQ(down[1].second, again->epoch());
  registry.ReportUnreachable("d0", again->epoch());  // stale epoch: ignored
  EXPECT_TRUE(registry.Snapshot()[0].healthy);
  // A registration counts as the first heartbeat.
  clock.Advance(absl::Milliseconds(300));
  EXPECT_EQ(registry.ExpireStale(clock.Now()), 0);
  clock.Advance(absl::Nanoseconds(1));
  EXPECT_EQ(registry.ExpireStale(clock.Now()), 1);
  EXPECT_EQ(down.size(), 3u);
}

// A worker whose engine broke says so in its heartbeat: it is down at once (its requests are
// failed through the listener), routing skips it, and only a new registration brings it back.
TEST(WorkerRegistryTest, UnhealthyHeartbeatMarksTheWorkerDown) {
  WorkerRegistry registry(RegistryOptions{});
  std::vector<std::pair<std::string, uint64_t>> down;
  registry.SetDownListener(
      [&](const std::string& id, uint64_t epoch) { down.emplace_back(id, epoch); });
  absl::StatusOr<tandem::v1::RegisterResponse> reg =
      registry.Register(Registration("m0", WORKER_ROLE_MIXED));
  ASSERT_TRUE(reg.ok());
  tandem::v1::HeartbeatRequest hb;
  hb.set_worker_id("m0");
  hb.set_instance_id("instance-m0");
  hb.set_epoch(reg->epoch());
  EXPECT_FALSE(registry.Heartbeat(hb)->reregister());
  EXPECT_TRUE(registry.Snapshot()[0].healthy);
  hb.set_unhealthy_reason("illegal memory access");
  ASSERT_TRUE(registry.Heartbeat(hb).ok());
  ASSERT_EQ(down.size(), 1u);
  EXPECT_EQ(down[0], std::make_pair(std::string("m0"), reg->epoch()));
  EXPECT_FALSE(registry.Snapshot()[0].healthy);
  EXPECT_FALSE(MakeLeastLoadedPolicy()->Pick(registry.Snapshot(), RouteQuery()).ok());
  ASSERT_TRUE(registry.Heartbeat(hb).ok());  // again: already down, no second notification
  EXPECT_EQ(down.size(), 1u);
  hb.set_epoch(reg->epoch() + 7);  // another epoch's report changes nothing
  EXPECT_TRUE(registry.Heartbeat(hb)->reregister());
  EXPECT_EQ(down.size(), 1u);
}

// --- kv-aware routing over fake workers' published prefix caches ---

// A summary holding the first `pages` full pages of `prompt` (hashed as the engine hashes).
std::shared_ptr<const WorkerPrefixCache> Holding(const std::vector<int32_t>& prompt, int pages,
                                                 int page_size = 4) {
  auto cache = std::make_shared<WorkerPrefixCache>();
  cache->page_size = page_size;
  const std::vector<uint64_t> hashes = PageHashes(prompt, page_size);
  cache->hashes.insert(hashes.begin(), hashes.begin() + pages);
  cache->hashes.insert(12345);  // some other prefix's page
  return cache;
}

std::vector<int32_t> Prompt(int n, int salt = 0) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (i * 7 + salt) % 1000;
  return p;
}

TEST(KvAwareRoutingTest, CachedPrefixTokensFollowTheEnginesRules) {
  const std::vector<int32_t> prompt = Prompt(18);
  WorkerSnapshot w = Worker("p0", WORKER_ROLE_PREFILL);
  EXPECT_EQ(CachedPrefixTokens(w, prompt), 0);  // no summary yet
  w.prefix_cache = Holding(prompt, 4);
  EXPECT_EQ(CachedPrefixTokens(w, prompt), 16);
  // The last token is always computed: a 16-token prompt can hit at most 3 pages.
  EXPECT_EQ(CachedPrefixTokens(w, Prompt(16)), 12);
  // A prompt that differs in its first page shares nothing, though later pages' tokens match.
  std::vector<int32_t> other = prompt;
  other[0] = 999;
  EXPECT_EQ(CachedPrefixTokens(w, other), 0);
  // Stops at the first page missing.
  w.prefix_cache = Holding(prompt, 2);
  EXPECT_EQ(CachedPrefixTokens(w, prompt), 8);
  // Another page size hashes differently: nothing matches.
  auto wrong = std::make_shared<WorkerPrefixCache>(*Holding(prompt, 4));
  wrong->page_size = 8;
  w.prefix_cache = wrong;
  EXPECT_EQ(CachedPrefixTokens(w, prompt), 0);
}

TEST(KvAwareRoutingTest, PicksThePrefillWorkerHoldingThePrefixUnlessItIsBusier) {
  auto policy = MakeKvAwarePolicy();
  EXPECT_EQ(policy->name(), "kv-aware");
  const std::vector<int32_t> prompt = Prompt(64);
  std::vector<WorkerSnapshot> workers = {
      Worker("p0", WORKER_ROLE_PREFILL), Worker("p1", WORKER_ROLE_PREFILL),
      Worker("d0", WORKER_ROLE_DECODE, 0, 100), Worker("d1", WORKER_ROLE_DECODE, 0, 900)};
  workers[1].prefix_cache = Holding(prompt, 12);  // p1 holds 48 of the 64 tokens
  RouteQuery query;
  query.prompt_tokens = &prompt;
  for (int i = 0; i < 4; ++i) {  // not a rotation: every time
    absl::StatusOr<RoutePlan> plan = policy->Pick(workers, query);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->prefill.id, "p1");
    EXPECT_EQ(plan->decode.id, "d1");  // decode side: least loaded, more room
  }
  // Least-loaded would not care: it rotates between the idle prefill workers.
  auto least = MakeLeastLoadedPolicy();
  std::set<std::string> picked;
  for (int i = 0; i < 4; ++i) picked.insert(least->Pick(workers, query)->prefill.id);
  EXPECT_EQ(picked.size(), 2u);
  // One request already on p1 costs a whole prompt: 16 + 64 > 64, so p0 wins.
  workers[1].outstanding = 1;
  EXPECT_EQ(policy->Pick(workers, query)->prefill.id, "p0");
  // With a lighter load weight the cache wins again.
  EXPECT_EQ(MakeKvAwarePolicy(0.5)->Pick(workers, query)->prefill.id, "p1");
  // Both hold the prefix and are idle: the lower load, then rotation, decides.
  workers[1].outstanding = 0;
  workers[0].prefix_cache = Holding(prompt, 12);
  picked.clear();
  for (int i = 0; i < 4; ++i) picked.insert(policy->Pick(workers, query)->prefill.id);
  EXPECT_EQ(picked.size(), 2u);
}

TEST(KvAwareRoutingTest, MixedWorkersAreScoredAndNoPromptFallsBackToLeastLoaded) {
  auto policy = MakeKvAwarePolicy();
  const std::vector<int32_t> prompt = Prompt(40);
  std::vector<WorkerSnapshot> workers = {Worker("m0", WORKER_ROLE_MIXED),
                                         Worker("m1", WORKER_ROLE_MIXED)};
  workers[0].prefix_cache = Holding(prompt, 9);
  RouteQuery query;
  query.prompt_tokens = &prompt;
  absl::StatusOr<RoutePlan> plan = policy->Pick(workers, query);
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(plan->mixed);
  EXPECT_EQ(plan->decode.id, "m0");
  workers[0].outstanding = 3;
  EXPECT_EQ(policy->Pick(workers, RouteQuery())->decode.id, "m1");  // no prompt: load only
  EXPECT_FALSE(policy->Pick({}, query).ok());                       // no worker at all
}

TEST(KvAwareRoutingTest, RegistryKeepsTheLastSummaryOfTheEpoch) {
  ::tandem::testing::FakeClock clock;
  RegistryOptions options;
  options.clock = &clock;
  WorkerRegistry registry(options);
  const tandem::v1::RegisterRequest hello = Registration("p0", WORKER_ROLE_PREFILL);
  absl::StatusOr<tandem::v1::RegisterResponse> reg = registry.Register(hello);
  ASSERT_TRUE(reg.ok()) << reg.status();
  tandem::v1::HeartbeatRequest hb;
  hb.set_worker_id("p0");
  hb.set_instance_id(hello.instance_id());
  hb.set_epoch(reg->epoch());
  hb.mutable_prefix_cache()->set_version(3);
  hb.mutable_prefix_cache()->set_page_size(4);
  hb.mutable_prefix_cache()->add_page_hashes(77);
  absl::StatusOr<tandem::v1::HeartbeatResponse> beat = registry.Heartbeat(hb);
  ASSERT_TRUE(beat.ok()) << beat.status();
  EXPECT_FALSE(beat->reregister());
  ASSERT_NE(registry.Snapshot()[0].prefix_cache, nullptr);
  EXPECT_TRUE(registry.Snapshot()[0].prefix_cache->hashes.contains(77));
  // A heartbeat without a summary means "unchanged".
  hb.clear_prefix_cache();
  ASSERT_TRUE(registry.Heartbeat(hb).ok());
  EXPECT_EQ(registry.Snapshot()[0].prefix_cache->version, 3u);
  // A new registration (the worker restarted: its cache is gone) forgets it.
  ASSERT_TRUE(registry.Register(hello).ok());
  EXPECT_EQ(registry.Snapshot()[0].prefix_cache, nullptr);
}

TEST(RoutingPolicyTest, NamesIncludeKvAware) {
  EXPECT_TRUE(MakeRoutingPolicy("kv-aware").ok());
  EXPECT_EQ(MakeRoutingPolicy("cache").status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tandem::router
