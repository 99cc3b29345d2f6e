#include "envs/schedulers/sync_threads.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

// T + 1 bounds splitting `envs` evenly, as the pool splits them.
std::vector<int32_t> Home(int envs, int threads) {
  std::vector<int32_t> home;
  for (int t = 0; t <= threads; ++t) home.push_back(int32_t(int64_t(t) * envs / threads));
  return home;
}

TEST(SyncThreadSchedulerTest, RunsEveryEnvOnceABatchOnAnyNumberOfThreads) {
  for (const int threads : {1, 2, 3, 8}) {
    for (const int envs : {8, 13, 100}) {
      std::vector<std::atomic<int>> runs(envs);
      std::atomic<int> started{0};
      std::vector<std::atomic<bool>> started_by(threads);
      std::atomic<int> ran_before_start{0};
      {
        SyncThreadScheduler scheduler(
            Home(envs, threads),
            [&](int t) {
              ++started;
              started_by[t] = true;
            },
            [&](int t, int32_t begin, int32_t end) {
              // A worker thread (t > 0) runs envs only after its on_start.
              if (t > 0 && !started_by[t]) ++ran_before_start;
              for (int32_t id = begin; id < end; ++id) ++runs[id];
            });
        ASSERT_EQ(scheduler.num_threads(), threads);
        for (int batch = 1; batch <= 50; ++batch) {
          scheduler.RunBatch();
          // Every env ran exactly once more, all before RunBatch returned.
          for (int id = 0; id < envs; ++id) ASSERT_EQ(runs[id].load(), batch) << threads << " threads, env " << id;
        }
        // Let the workers fall asleep, then wake them for one more batch.
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
        scheduler.RunBatch();
        for (int id = 0; id < envs; ++id) EXPECT_EQ(runs[id].load(), 51);
      }
      // Counted once the workers have ended: on a loaded machine a worker may
      // not have run at all while the caller's thread took every env.
      EXPECT_EQ(started.load(), threads - 1) << "on_start once per worker thread";
      EXPECT_EQ(ran_before_start.load(), 0) << "a worker ran envs before its on_start";
    }
  }
}

// A thread that falls behind has its home envs taken by the others, from
// the back of its range, while it works from the front.
TEST(SyncThreadSchedulerTest, IdleThreadsTakeTheEnvsOfASlowOne) {
  constexpr int kEnvs = 8;
  std::vector<std::atomic<int>> ran_on(kEnvs);
  SyncThreadScheduler scheduler(Home(kEnvs, 2), nullptr, [&](int thread, int32_t begin, int32_t end) {
    for (int32_t id = begin; id < end; ++id) {
      ran_on[id] = thread;
      if (thread == 1) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
  scheduler.RunBatch();
  // Thread 1's home is [4, 8): its last env went to the caller's thread.
  EXPECT_EQ(ran_on[7].load(), 0);
  for (int id = 0; id < 4; ++id) EXPECT_EQ(ran_on[id].load(), 0) << id;
}

TEST(SyncThreadSchedulerTest, DestroyingItWithSleepingWorkersJoinsThem) {
  for (int i = 0; i < 20; ++i) {
    auto scheduler = std::make_unique<SyncThreadScheduler>(Home(4, 4), nullptr, [](int, int32_t, int32_t) {});
    if (i % 2) scheduler->RunBatch();
    if (i % 4 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    scheduler.reset();
  }
}

}  // namespace
}  // namespace troupe::envs
