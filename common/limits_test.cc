#include "common/limits.h"

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe {
namespace {

using ::testing::HasSubstr;

TEST(ValidateHostPortTest, AcceptsHostsAndPortsInRange) {
  for (const char* address : {"127.0.0.1:0", "127.0.0.1:65535", "0.0.0.0:7000", "localhost:80", "my-host.example:1",
                              "[::1]:7000", "[::]:0", "[fe80::1:2]:9"}) {
    EXPECT_TRUE(ValidateHostPort(address, "learner.listen").ok()) << address;
  }
}

TEST(ValidateHostPortTest, RefusesPortsOutOfRangeAndLooseSyntaxNamingTheField) {
  const struct {
    const char* address;
    const char* why;
  } cases[] = {
      {"127.0.0.1:99999", "port 99999 is outside [0, 65535]"},
      {"127.0.0.1:65536", "outside [0, 65535]"},
      {"127.0.0.1:-1", "decimal digits only"},
      {"127.0.0.1:+80", "decimal digits only"},
      {"127.0.0.1: 80", "decimal digits only"},
      {"127.0.0.1:123456", "1 to 5 digits"},
      {"127.0.0.1:", "1 to 5 digits"},
      {"127.0.0.1", "no ':PORT'"},
      {"", "no ':PORT'"},
      {":7000", "the host must be"},
      {"bad host:7000", "the host must be"},
      {"-host:7000", "the host must be"},
      {"::1:7000", "IPv6 host must be in brackets"},
      {"[zz::1]:7000", "not a valid [IPv6] host"},
      {"[::1:7000", "not a valid [IPv6] host"},
      {"host/../x:7000", "the host must be"},
  };
  for (const auto& c : cases) {
    const absl::Status status = ValidateHostPort(c.address, "learner.listen");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.address;
    EXPECT_THAT(status.message(), HasSubstr("learner.listen")) << c.address;
    EXPECT_THAT(status.message(), HasSubstr(c.why)) << c.address;
  }
}

TEST(CheckFitsInMemoryTest, RefusesMoreThanThisMachineHasAndNaming) {
  ASSERT_GT(PhysicalMemoryBytes(), 0);
  EXPECT_TRUE(CheckFitsInMemory("x.size 1", 1024).ok());
  const absl::Status status = CheckFitsInMemory("learner.replay_size 9", 4.0 * PhysicalMemoryBytes());
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("learner.replay_size 9: needs ~"));
  EXPECT_FALSE(CheckFitsInMemory("x", 1e300 * 1e300).ok()) << "infinity does not fit";
}

}  // namespace
}  // namespace troupe
