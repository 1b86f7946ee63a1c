// The decode role's time logic in process, on a FakeClock shared by the service, its engine
// loop and its KV receiver (engine over the FakeModel, receiver on loopback): an unclaimed
// reservation is released at the first loop tick at or past its TTL and not before, and one
// whose KV never arrives is dropped exactly at the KV transfer deadline. (worker_pair_test
// checks the same endings across real processes, on real time.)
#include "decode_worker/decode_service.h"

#include <memory>

#include "gtest/gtest.h"
#include "tests/base/fake_clock.h"
#include "tests/engine/engine_test_util.h"

namespace tandem {
namespace {

using testing::FakeClock;

constexpr absl::Duration kTick = absl::Milliseconds(50);

class DecodeServiceClockTest : public ::testing::Test {
 protected:
  void Start() {
    options_.role = WorkerRole::kDecode;
    options_.host = options_.advertise_host = "127.0.0.1";
    options_.worker_id = "decode-0";
    EngineOptions engine_options;
    engine_options.page_size = 4;
    engine_options.num_pages = 64;
    std::unique_ptr<Engine> engine =
        testing::MakeEngine(engine_options, testing::FakeModel::Options());
    ASSERT_NE(engine, nullptr);
    WorkerEnv env{&options_, /*metrics=*/nullptr, engine.get(), &clock_};
    absl::StatusOr<std::unique_ptr<DecodeService>> service = DecodeService::Create(env);
    ASSERT_TRUE(service.ok()) << service.status();
    service_ = *std::move(service);
    loop_ = std::make_unique<EngineLoop>(std::move(engine), service_->Handlers(), kTick, &clock_);
    service_->Attach(loop_.get());
    loop_->Start();
    start_ = clock_.Now();
  }
  void TearDown() override {
    if (service_) service_->Stop();  // no KV callback posts to the loop after this
    loop_.reset();
    service_.reset();
  }

  grpc::Status Reserve(const std::string& id, int ttl_ms) {
    tandem::v1::ReservePagesRequest request;
    request.set_request_id(id);
    request.set_num_prompt_tokens(10);
    request.set_max_tokens(5);
    request.set_ttl_ms(ttl_ms);
    tandem::v1::ReservePagesResponse response;
    grpc::Status status = service_->ReservePages(nullptr, &request, &response);
    if (status.ok()) {
      EXPECT_EQ(response.page_ids_size(), 3);  // 10 prompt tokens, 4 per page
    }
    return status;
  }
  // Waits (real time) until the loop's stats (published after each loop pass) show `reserved`
  // reserved pages and every other page free.
  bool AwaitReserved(int reserved) {
    for (int i = 0; i < 1000; ++i) {
      const EngineStats s = loop_->stats();
      if (s.num_pages_reserved == reserved && s.num_pages_free + reserved == s.num_pages_total) {
        return true;
      }
      Clock::Real()->SleepFor(absl::Milliseconds(5));
    }
    return false;
  }
  // Lets one tick pass: waits for the loop to sleep until its next tick, then advances to it.
  void Tick(int n) {
    ASSERT_TRUE(clock_.AwaitWaiterUntil(start_ + kTick * n)) << "tick " << n;
    clock_.Advance(start_ + kTick * n - clock_.Now());
  }

  FakeClock clock_;  // first: outlives the loop, the service and its receiver
  WorkerOptions options_;
  std::unique_ptr<DecodeService> service_;
  std::unique_ptr<EngineLoop> loop_;
  absl::Time start_;
};

TEST_F(DecodeServiceClockTest, UnclaimedReservationIsReleasedAtTheFirstTickPastItsTtl) {
  Start();
  ASSERT_TRUE(Reserve("ttl-1", /*ttl_ms=*/200).ok());
  EXPECT_TRUE(AwaitReserved(3));
  for (int n = 1; n <= 3; ++n) Tick(n);                      // 50, 100, 150 ms: within the TTL
  ASSERT_TRUE(clock_.AwaitWaiterUntil(start_ + kTick * 4));  // the 150 ms tick has run
  EXPECT_EQ(loop_->stats().num_pages_reserved, 3);
  Tick(4);  // 200 ms: the TTL is up
  EXPECT_TRUE(AwaitReserved(0));
  // The id is free again.
  EXPECT_TRUE(Reserve("ttl-1", 200).ok());
}

TEST_F(DecodeServiceClockTest, ReservationWhoseKvNeverArrivesIsDroppedAtTheTransferDeadline) {
  options_.kv_transfer_timeout_ms = 120;
  Start();
  ASSERT_TRUE(Reserve("kv-1", /*ttl_ms=*/60000).ok());
  EXPECT_TRUE(AwaitReserved(3));
  const absl::Time deadline = start_ + absl::Milliseconds(120);
  ASSERT_TRUE(clock_.AwaitWaiterUntil(deadline));  // the receiver waits for exactly that
  clock_.Advance(absl::Milliseconds(119));         // the loop ticks on the way: nothing expires
  EXPECT_TRUE(clock_.AwaitWaiterUntil(deadline));
  EXPECT_TRUE(clock_.AwaitWaiterUntil(clock_.Now() + kTick));  // the loop ran its tick
  EXPECT_EQ(loop_->stats().num_pages_reserved, 3);
  clock_.Advance(absl::Milliseconds(1));
  EXPECT_TRUE(AwaitReserved(0));
}

}  // namespace
}  // namespace tandem
