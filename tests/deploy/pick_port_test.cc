// PickFreePort: ports for child processes are picked below the kernel's ephemeral range (where no
// outgoing connection or bind to port 0 can take them before the child binds), bind, and are
// never handed out twice by one process.
#include <set>

#include "comm/socket_io.h"
#include "deploy/launcher/cluster.h"
#include "gtest/gtest.h"

namespace tandem::launcher {
namespace {

TEST(PickFreePort, BelowTheEphemeralRangeBindableAndNeverRepeated) {
  const auto [first, last] = EphemeralPortRange();
  ASSERT_GT(first, 0);
  ASSERT_LE(first, last);
  const bool room_below = first - 1 - kFirstPickedPort >= 1000;
  std::set<int> seen;
  for (int i = 0; i < 200; ++i) {
    absl::StatusOr<int> port = PickFreePort("127.0.0.1");
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_TRUE(seen.insert(*port).second) << "port " << *port << " handed out twice";
    if (room_below) {
      EXPECT_GE(*port, kFirstPickedPort);
      EXPECT_LT(*port, first);
    }
    // Free for the child: it binds without SO_REUSEADDR.
    EXPECT_TRUE(Listen("127.0.0.1", *port, /*reuse_address=*/false).ok()) << *port;
  }
}

TEST(PickFreePort, BadHostIsAnError) { EXPECT_FALSE(PickFreePort("not-an-address").ok()); }

}  // namespace
}  // namespace tandem::launcher
