// Tests that need a display: an Xvfb server started by the test process
// (Mesa's llvmpipe gives software OpenGL under it). Register it once per
// test binary:
//   const auto* const xvfb = ::testing::AddGlobalTestEnvironment(new testing::XvfbEnvironment);
#ifndef TROUPE_VIZ_TESTING_XVFB_H_
#define TROUPE_VIZ_TESTING_XVFB_H_

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

namespace troupe::viz::testing {

// An Xvfb server for this test process: it picks a free display number
// itself (-displayfd) and is killed at the end.
class XvfbEnvironment : public ::testing::Environment {
 public:
  void SetUp() override {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    const std::string fd = std::to_string(fds[1]);
    const char* argv[] = {"Xvfb", "-displayfd", fd.c_str(), "-screen", "0", "1280x720x24", "-nolisten", "tcp",
                          nullptr};
    // A child that dies with this process even if a test crashes.
    pid_ = fork();
    ASSERT_GE(pid_, 0) << std::strerror(errno);
    if (pid_ == 0) {
      prctl(PR_SET_PDEATHSIG, SIGTERM);
      close(fds[0]);
      const int null = open("/dev/null", O_WRONLY);
      dup2(null, 1);
      dup2(null, 2);
      execvp("Xvfb", const_cast<char**>(argv));
      _exit(127);  // no Xvfb: the read below sees EOF
    }
    close(fds[1]);
    // Xvfb writes its display number once it accepts connections.
    char number[32] = {};
    ssize_t got = 0, n = 0;
    while ((n = read(fds[0], number + got, sizeof(number) - 1 - got)) > 0) {
      got += n;
      if (std::memchr(number, '\n', got)) break;
    }
    close(fds[0]);
    ASSERT_GT(got, 0) << "Xvfb (Debian package xvfb) did not start or exited without naming a display";
    std::string display = ":";
    display.append(number, std::strcspn(number, "\n"));
    setenv("DISPLAY", display.c_str(), 1);
    unsetenv("WAYLAND_DISPLAY");
  }
  void TearDown() override {
    if (pid_ > 0) {
      kill(pid_, SIGTERM);
      waitpid(pid_, nullptr, 0);
    }
  }

 private:
  pid_t pid_ = -1;
};

}  // namespace troupe::viz::testing

#endif  // TROUPE_VIZ_TESTING_XVFB_H_
