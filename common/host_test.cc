#include "common/host.h"

#include <unistd.h>

#include "gtest/gtest.h"

namespace troupe {
namespace {

TEST(HostTest, HostNameIsGethostnames) {
  char name[256] = {0};
  ASSERT_EQ(gethostname(name, sizeof(name) - 1), 0);
  EXPECT_EQ(HostName(), name[0] == '\0' ? "localhost" : name);
}

TEST(HostTest, AnEveryInterfaceAddressBecomesTheHostAndItsPort) {
  EXPECT_EQ(ReachableAddress("0.0.0.0:5000", "node7"), "node7:5000");
  EXPECT_EQ(ReachableAddress("[::]:5000", "node7"), "node7:5000");
  EXPECT_EQ(ReachableAddress(":::5000", "node7"), "node7:5000");
  EXPECT_EQ(ReachableAddress(":5000", "node7"), "node7:5000");
  EXPECT_EQ(ReachableAddress("0.0.0.0:41", ""), HostName() + ":41");
}

TEST(HostTest, AnyOtherAddressComesBackAsItIs) {
  EXPECT_EQ(ReachableAddress("127.0.0.1:5000", "node7"), "127.0.0.1:5000");
  EXPECT_EQ(ReachableAddress("learner.example:80", "node7"), "learner.example:80");
  EXPECT_EQ(ReachableAddress("[::1]:5000", "node7"), "[::1]:5000");
  EXPECT_EQ(ReachableAddress("no-port", "node7"), "no-port");
}

}  // namespace
}  // namespace troupe
