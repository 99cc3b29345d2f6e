// A network link with loss, delay and partitions for kernels without the
// netem qdisc (tests/network_end_to_end_test.cc): two TUN devices, one in
// this process's network namespace and one moved into another, and two
// threads of this process that carry each IP packet from one device to the
// other, dropping it with the set probability and delivering it after the
// set delay, as `tc qdisc ... netem delay D loss L%` would on each end of a
// veth pair. Needs root (CAP_NET_ADMIN) and /dev/net/tun. Test-only.
#ifndef TROUPE_TESTS_TUN_LINK_H_
#define TROUPE_TESTS_TUN_LINK_H_

#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace troupe::e2e {

class TunLink {
 public:
  // Packets waiting in one direction at most (more are dropped, as a full
  // queue would).
  static constexpr size_t kMaxQueued = 20000;

  // Opens TUN device `name` (IP packets, no extra header), non-blocking;
  // returns its fd, or -1 with *error set.
  static int OpenDevice(const std::string& name, std::string* error) {
    const int fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
      *error = std::string("cannot open /dev/net/tun: ") + std::strerror(errno);
      return -1;
    }
    ifreq request{};
    request.ifr_flags = IFF_TUN | IFF_NO_PI;
    std::strncpy(request.ifr_name, name.c_str(), IFNAMSIZ - 1);
    if (ioctl(fd, TUNSETIFF, &request) < 0) {
      *error = "cannot make TUN device " + name + ": " + std::strerror(errno);
      close(fd);
      return -1;
    }
    return fd;
  }

  // Carries packets between the open devices `a` and `b` (taking their
  // fds), at first with no loss and no delay.
  TunLink(int a, int b) : a_(a), b_(b) {
    threads_.emplace_back([this](std::stop_token stop) { Forward(stop, a_, b_, 1); });
    threads_.emplace_back([this](std::stop_token stop) { Forward(stop, b_, a_, 2); });
  }
  ~TunLink() {
    threads_.clear();  // stops and joins
    close(a_);
    close(b_);
  }

  // Each packet, either way, is dropped with probability `loss` (1: a
  // partition) and otherwise delivered `delay` after it was sent.
  void Set(double loss, std::chrono::milliseconds delay) {
    loss_ = loss;
    delay_ms_ = static_cast<int>(delay.count());
  }

  int64_t packets_carried() const { return carried_.load(); }
  int64_t packets_dropped() const { return dropped_.load(); }

 private:
  using Clock = std::chrono::steady_clock;

  void Forward(std::stop_token stop, int in, int out, uint64_t seed) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    std::deque<std::pair<Clock::time_point, std::string>> queue;
    std::vector<char> buffer(1 << 16);
    while (!stop.stop_requested()) {
      // Wait for a packet, or until the next one is due (10 ms at most).
      int timeout_ms = 10;
      if (!queue.empty()) {
        const auto due = std::chrono::duration_cast<std::chrono::milliseconds>(queue.front().first - Clock::now());
        timeout_ms = static_cast<int>(std::clamp<int64_t>(due.count(), 0, 10));
      }
      pollfd ready{in, POLLIN, 0};
      if (poll(&ready, 1, timeout_ms) > 0 && (ready.revents & POLLIN)) {
        for (int i = 0; i < 256; ++i) {
          const ssize_t n = read(in, buffer.data(), buffer.size());
          if (n <= 0) break;
          if (uniform(rng) < loss_.load() || queue.size() >= kMaxQueued) {
            ++dropped_;
            continue;
          }
          queue.emplace_back(Clock::now() + std::chrono::milliseconds(delay_ms_.load()),
                             std::string(buffer.data(), static_cast<size_t>(n)));
        }
      }
      // Deliver what is due.
      const auto now = Clock::now();
      while (!queue.empty() && queue.front().first <= now) {
        (void)!write(out, queue.front().second.data(), queue.front().second.size());
        queue.pop_front();
        ++carried_;
      }
    }
  }

  const int a_, b_;
  std::atomic<double> loss_{0.0};
  std::atomic<int> delay_ms_{0};
  std::atomic<int64_t> carried_{0}, dropped_{0};
  std::vector<std::jthread> threads_;
};

}  // namespace troupe::e2e

#endif  // TROUPE_TESTS_TUN_LINK_H_
