#include "envs/schedulers/async_queue.h"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

using Job = AsyncQueueScheduler::Job;

std::vector<int32_t> Home(int envs, int threads) {
  std::vector<int32_t> home;
  for (int t = 0; t <= threads; ++t) home.push_back(int32_t(int64_t(t) * envs / threads));
  return home;
}

// What the jobs wrote: per ring buffer and row, the env and the thread.
struct Rows {
  explicit Rows(int ring, int batch_size) : env(ring, std::vector<int32_t>(batch_size, -1)), thread(env) {}
  std::vector<std::vector<int32_t>> env, thread;
};

AsyncQueueScheduler::Options Options(int envs, int threads, int batch_size, Rows& rows) {
  AsyncQueueScheduler::Options o;
  o.home = Home(envs, threads);
  o.batch_size = batch_size;
  o.ring = int(rows.env.size());
  o.finish = [&rows](int thread, const Job& job, int buffer, int row) {
    rows.env[buffer][row] = job.env_id;
    rows.thread[buffer][row] = thread;
  };
  return o;
}

// Every env sent comes back once, batch_size at a time, in ring order, over
// many rounds: slots are claimed once each and a buffer is reused only
// after it was returned.
TEST(AsyncQueueSchedulerTest, ReturnsEveryJobOnceInFullBatches) {
  constexpr int kEnvs = 12, kBatch = 4, kRing = 4;
  for (const int threads : {1, 2, 4}) {
    Rows rows(kRing, kBatch);
    AsyncQueueScheduler scheduler(Options(kEnvs, threads, kBatch, rows));
    std::vector<int32_t> all(kEnvs);
    for (int i = 0; i < kEnvs; ++i) all[i] = i;
    int expected_buffer = 0;
    for (int round = 0; round < 100; ++round) {
      scheduler.Enqueue(all, /*reset=*/round == 0);
      std::multiset<int32_t> seen;
      for (int b = 0; b < kEnvs / kBatch; ++b) {
        const int buffer = scheduler.WaitBatch();
        ASSERT_EQ(buffer, expected_buffer);
        expected_buffer = (expected_buffer + 1) % kRing;
        for (int32_t id : rows.env[buffer]) seen.insert(id);
      }
      std::multiset<int32_t> want(all.begin(), all.end());
      ASSERT_EQ(seen, want) << threads << " threads, round " << round;
    }
  }
}

// Rows are claimed as jobs are taken up, in that order; a batch returns
// once every one of its rows is written, however long a job takes.
TEST(AsyncQueueSchedulerTest, ABatchHoldsJobsInTheOrderTakenUpOnceAllAreWritten) {
  {
    Rows rows(/*ring=*/3, /*batch_size=*/2);
    AsyncQueueScheduler scheduler(Options(/*envs=*/4, /*threads=*/1, /*batch_size=*/2, rows));
    const std::vector<int32_t> ids = {3, 1, 2, 0};
    scheduler.Enqueue(ids, /*reset=*/false);
    EXPECT_THAT(rows.env[scheduler.WaitBatch()], ::testing::ElementsAre(3, 1));
    EXPECT_THAT(rows.env[scheduler.WaitBatch()], ::testing::ElementsAre(2, 0));
  }
  Rows rows(/*ring=*/3, /*batch_size=*/2);
  AsyncQueueScheduler::Options o = Options(/*envs=*/4, /*threads=*/2, /*batch_size=*/2, rows);
  auto finish = o.finish;
  o.finish = [finish](int thread, const Job& job, int buffer, int row) {
    if (job.env_id == 0) std::this_thread::sleep_for(std::chrono::milliseconds(200));
    finish(thread, job, buffer, row);
  };
  AsyncQueueScheduler scheduler(std::move(o));
  const std::vector<int32_t> ids = {0, 1, 2, 3};
  scheduler.Enqueue(ids, /*reset=*/false);
  std::multiset<int32_t> seen;
  for (int b = 0; b < 2; ++b) {
    const int buffer = scheduler.WaitBatch();
    EXPECT_THAT(rows.env[buffer], ::testing::Not(::testing::Contains(-1))) << "a row not yet written";
    seen.insert(rows.env[buffer].begin(), rows.env[buffer].end());
  }
  EXPECT_THAT(seen, ::testing::ElementsAre(0, 1, 2, 3));
}

// With a queue per thread an env's jobs run on its home thread only, all
// of a thread's queue handed to `start` at once, in the order sent.
TEST(AsyncQueueSchedulerTest, AQueuePerThreadRunsEachEnvOnItsHomeThread) {
  constexpr int kEnvs = 6, kThreads = 3;
  Rows rows(/*ring=*/3, /*batch_size=*/kEnvs);
  AsyncQueueScheduler::Options o = Options(kEnvs, kThreads, kEnvs, rows);
  o.queue_per_thread = true;
  std::mutex mutex;
  std::vector<std::vector<int32_t>> started(kThreads);
  o.start = [&](int thread, std::span<const Job> jobs) {
    std::lock_guard lock(mutex);
    for (const Job& job : jobs) started[thread].push_back(job.env_id);
  };
  std::atomic<int> on_start{0};
  o.on_start = [&](int) { ++on_start; };
  AsyncQueueScheduler scheduler(std::move(o));
  const std::vector<int32_t> ids = {5, 0, 3, 1, 4, 2};
  scheduler.Enqueue(ids, /*reset=*/true);
  const int buffer = scheduler.WaitBatch();
  for (int row = 0; row < kEnvs; ++row) {
    EXPECT_EQ(rows.thread[buffer][row], rows.env[buffer][row] / 2) << "env " << rows.env[buffer][row];
  }
  std::lock_guard lock(mutex);
  EXPECT_THAT(started[0], ::testing::ElementsAre(0, 1));
  EXPECT_THAT(started[1], ::testing::ElementsAre(3, 2));
  EXPECT_THAT(started[2], ::testing::ElementsAre(5, 4));
  EXPECT_EQ(on_start.load(), kThreads - 1);
}

TEST(AsyncQueueSchedulerTest, DestroyingItWithJobsQueuedJoinsItsThreads) {
  Rows rows(/*ring=*/3, /*batch_size=*/2);
  AsyncQueueScheduler::Options o = Options(/*envs=*/4, /*threads=*/3, /*batch_size=*/2, rows);
  auto finish = o.finish;
  o.finish = [finish](int thread, const Job& job, int buffer, int row) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    finish(thread, job, buffer, row);
  };
  AsyncQueueScheduler scheduler(std::move(o));
  const std::vector<int32_t> ids = {0, 1, 2, 3};
  scheduler.Enqueue(ids, /*reset=*/false);
}

}  // namespace
}  // namespace troupe::envs
