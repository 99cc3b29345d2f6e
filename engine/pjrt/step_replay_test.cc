// Steps traced once and replayed (nn::Backend::RunStep on the PJRT backend,
// step_replay.cc), on the XLA CPU plugin the ctest fixture fetched: a
// replayed update equals a recorded one bit for bit, a new learning rate or
// step count is an input (no new recording), a new shape is a new
// recording, a step that takes host data inside records every time, and
// the guard stops a replay whose recording would differ.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "engine/nn/cpu_backend.h"
#include "engine/nn/layers.h"
#include "engine/nn/ops.h"
#include "engine/nn/optimizer.h"
#include "engine/nn/tape.h"
#include "engine/nn/testing.h"
#include "engine/pjrt/pjrt_backend.h"
#include "engine/pjrt/pjrt_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::pjrt {
namespace {

std::unique_ptr<PjrtBackend> NewPjrt(const std::string& plugin, int check_replay_every = 0) {
  auto backend = PjrtBackend::Create({.plugin = plugin, .check_replay_every = check_replay_every});
  if (!backend.ok()) {
    ADD_FAILURE() << backend.status();
    return nullptr;
  }
  return std::move(*backend);
}

// A small regression model trained by Adam, its update split as RunStep
// wants it: the batch and Adam's per-step values uploaded first (the host
// part), then the forward, backward and Adam's kernels (the device part),
// the loss read at the step's end.
struct Model {
  nn::Backend& backend;
  int64_t batch, inputs;
  nn::ParameterSet params;
  nn::Mlp mlp;
  std::unique_ptr<nn::Adam> adam;
  nn::Tape tape{&backend};
  nn::DeviceBuffer x, y;
  float loss = 0;

  Model(nn::Backend& b, int64_t batch_size, int64_t input_size) : backend(b), batch(batch_size), inputs(input_size) {
    mlp = nn::Mlp::Create(params, "mlp", {inputs, 32, 32, 1});
    params.Allocate(backend, /*seed=*/3);
    adam = std::make_unique<nn::Adam>(&params, &backend);
    x = nn::DeviceBuffer(backend, batch * inputs);
    y = nn::DeviceBuffer(backend, batch);
  }

  // The host part of update `u`: its batch and Adam's lr and bias corrections on the device.
  void Prepare(int u, float learning_rate) {
    x.Upload(nn::RandomVector(batch * inputs, 100 + u));
    y.Upload(nn::RandomVector(batch, 200 + u));
    adam->Prepare(learning_rate);
  }
  // The device part: kernels and the loss's read only (the batch at `xs`
  // and `ys` when given, else in x and y).
  void DevicePart(const float* xs = nullptr, const float* ys = nullptr) {
    tape.Reset();
    params.ZeroGrad();
    const nn::Var loss_var = nn::MeanSquaredError(mlp(tape, params, tape.Constant(xs ? xs : x.data(), {batch, inputs})),
                                                  tape.Constant(ys ? ys : y.data(), {batch, 1}));
    tape.Backward(loss_var);
    adam->Apply();
    backend.ReadAtStepEnd(tape.data(loss_var).data, &loss, sizeof(float));
  }
  uint64_t Signature() const { return static_cast<uint64_t>(batch) << 32 | static_cast<uint64_t>(inputs); }
  // Update `u` through RunStep: the host part, then the device part.
  void Step(int u, float learning_rate) {
    Prepare(u, learning_rate);
    backend.RunStep(Signature(), [&] { DevicePart(); });
  }
  std::vector<float> Values() const {
    std::vector<float> v(params.total_floats());
    backend.Download(params.device_values(), v.data(), sizeof(float) * v.size());
    return v;
  }
};

float LearningRate(int u) { return 1e-3f * static_cast<float>(1 + u % 3); }

// Two models' parameters within 1e-5 of each other (float32 rounding of
// the same updates on two backends).
::testing::AssertionResult SameValues(const Model& a, const Model& b) {
  const std::vector<float> got = a.Values(), want = b.Values();
  if (got.size() != want.size()) return ::testing::AssertionFailure() << got.size() << " against " << want.size();
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::fabs(got[i] - want[i]) > 1e-5f) {
      return ::testing::AssertionFailure() << "parameter " << i << ": " << got[i] << " against " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// 50 updates replayed against the same 50 recorded one by one (a plain
// step on a second backend), the learning rate changing every update:
// every loss and the final parameters are equal bit for bit, two updates
// were recorded and 48 replayed, with one compile.
TEST(StepReplayTest, ReplayedUpdatesEqualRecordedOnesBitForBitAndANewLearningRateIsAnInput) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> replaying = NewPjrt(plugin), recording = NewPjrt(plugin);
  ASSERT_TRUE(replaying && recording);
  ASSERT_TRUE(replaying->replays_steps());
  Model a(*replaying, 16, 8), b(*recording, 16, 8);
  for (int u = 0; u < 50; ++u) {
    a.Step(u, LearningRate(u));
    b.Prepare(u, LearningRate(u));
    {
      nn::StepScope step(*recording);
      b.DevicePart();
    }
    ASSERT_EQ(a.loss, b.loss) << "update " << u;
    ASSERT_TRUE(std::isfinite(a.loss));
  }
  EXPECT_EQ(a.Values(), b.Values());
  EXPECT_EQ(a.adam->steps(), 50) << "Prepare counts every update, replayed or not";
  EXPECT_EQ(replaying->stats().step_replays, 48);
  EXPECT_EQ(replaying->stats().steps, 50);
  EXPECT_EQ(replaying->stats().step_compiles, 1);
  EXPECT_EQ(recording->stats().step_replays, 0);
}

// Late reads (double-buffered outputs): 30 updates, each step's loss landed
// only after the next step was launched. Before its LandReads a step's
// value is not in host memory (the previous one is); after it, it equals the
// loss of the same update stepped with reads at the step's end, bit for
// bit, and so do the final parameters; 28 of the 30 were replays.
TEST(StepReplayTest, LateReadsLandAfterTheNextStepIsLaunchedInOrderAndUnchanged) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> late = NewPjrt(plugin), now = NewPjrt(plugin);
  ASSERT_TRUE(late && now);
  Model a(*late, 16, 8), b(*now, 16, 8);
  std::vector<float> expected;
  for (int u = 0; u < 30; ++u) {
    b.Step(u, LearningRate(u));
    expected.push_back(b.loss);
  }
  uint64_t unlanded = 0;
  float landed = a.loss;  // none yet
  for (int u = 0; u < 30; ++u) {
    a.Prepare(u, LearningRate(u));
    late->set_late_reads(true);
    late->RunStep(a.Signature(), [&] { a.DevicePart(); });
    late->set_late_reads(false);
    ASSERT_EQ(a.loss, landed) << "update " << u << "'s loss landed before its LandReads";
    if (u > 0) {
      late->LandReads(unlanded);
      ASSERT_EQ(a.loss, expected[u - 1]) << "update " << u - 1;
      landed = a.loss;
    }
    unlanded = late->steps_begun();
    EXPECT_EQ(late->steps_unlanded(), 1u);
  }
  late->LandReads(unlanded);
  EXPECT_EQ(a.loss, expected.back());
  EXPECT_EQ(late->steps_unlanded(), 0u);
  EXPECT_EQ(a.Values(), b.Values());
  EXPECT_EQ(late->stats().step_replays, 28);
}

// Adam's per-update values go up once a step of several updates: the first
// update's Prepare uploads every slot's (the same rate, the next steps);
// only a slot whose rate differs, or one beyond the buffer, uploads again.
// The parameters end as a CPU backend's given the same updates.
TEST(StepReplayTest, AdamUploadsItsValuesOnceAStepWhileTheRateHolds) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin);
  ASSERT_TRUE(pjrt);
  nn::CpuBackend cpu(1);
  Model a(*pjrt, 16, 8), b(cpu, 16, 8);
  constexpr int kPerStep = 4;
  // A step of one batch and rates.size() updates on it: the batch and
  // every update's Prepare, then every update's device part.
  const auto step = [&](Model& m, const std::vector<float>& rates) {
    m.Prepare(/*u=*/0, rates[0]);
    for (size_t u = 1; u < rates.size(); ++u) m.adam->Prepare(rates[u]);
    nn::StepScope scope(m.backend);
    for (size_t u = 0; u < rates.size(); ++u) m.DevicePart();
  };
  const std::vector<std::vector<float>> steps = {
      {1e-3f, 1e-3f, 1e-3f, 1e-3f},  // the first: the buffer grows to 4 slots (4 uploads)
      {1e-3f, 1e-3f, 1e-3f, 1e-3f},  // 1
      {1e-3f, 1e-3f, 2e-3f, 2e-3f},  // 2: the rate changes at slot 2
      {2e-3f, 2e-3f, 2e-3f, 2e-3f},  // 1
  };
  const std::vector<int64_t> expected = {4, 1, 2, 1};
  for (size_t s = 0; s < steps.size(); ++s) {
    const int64_t before = pjrt->stats().uploads;
    step(a, steps[s]);
    EXPECT_EQ(pjrt->stats().uploads - before, 2 + expected[s]) << "step " << s << " (2: its batch)";
    step(b, steps[s]);
  }
  ASSERT_EQ(a.adam->steps(), kPerStep * 4);
  EXPECT_TRUE(SameValues(a, b));
}

// Adam's per-update values in the step's own staging (Optimizer::Prepare
// with a StepStaging, as an agent gives it with the batch): steps of three
// updates on one batch, the rates changing within and between steps, each
// step one upload whatever the rates and replayed from the third on; the
// loss of each step's last update and the parameters the CPU backend's
// given the same updates.
TEST(StepReplayTest, AdamsValuesGoUpInTheStepsStagingOneUploadAStep) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin);
  ASSERT_TRUE(pjrt);
  nn::CpuBackend cpu(1);
  Model a(*pjrt, 16, 8), b(cpu, 16, 8);
  nn::StepStaging staging;
  nn::DeviceBuffer packed;
  constexpr int kPerStep = 3;
  for (int s = 0; s < 6; ++s) {
    const std::vector<float> xs = nn::RandomVector(16 * 8, 100 + s), ys = nn::RandomVector(16, 200 + s);
    // PJRT: the batch and the three updates' values in one staging, one upload.
    staging.Clear();
    const int64_t at_x = staging.Append(xs.data(), sizeof(float) * 16 * 8);
    const int64_t at_y = staging.Append(ys.data(), sizeof(float) * 16);
    for (int u = 0; u < kPerStep; ++u) a.adam->Prepare(LearningRate(s + u), &staging);
    ASSERT_EQ(staging.host.size(), 16u * 8 + 16 + 3 * kPerStep) << "three floats an update";
    if (packed.size() != static_cast<int64_t>(staging.host.size())) {
      packed = nn::DeviceBuffer(*pjrt, static_cast<int64_t>(staging.host.size()));
    }
    const int64_t uploads = pjrt->stats().uploads;
    packed.Upload(staging.host);
    staging.device = packed.data();
    pjrt->RunStep(a.Signature(), [&] {
      for (int u = 0; u < kPerStep; ++u) a.DevicePart(staging.device + at_x, staging.device + at_y);
    });
    EXPECT_EQ(pjrt->stats().uploads - uploads, 1) << "step " << s;
    // The CPU: the same batch and rates, Adam's values from the host.
    b.x.Upload(xs);
    b.y.Upload(ys);
    for (int u = 0; u < kPerStep; ++u) b.adam->Prepare(LearningRate(s + u));
    for (int u = 0; u < kPerStep; ++u) b.DevicePart();
    EXPECT_NEAR(a.loss, b.loss, 1e-5f) << "step " << s << ": its last update's loss";
  }
  EXPECT_EQ(pjrt->stats().step_replays, 4);
  EXPECT_TRUE(SameValues(a, b));
}

// The device's idle time: replays whose host part sleeps 30 ms after the
// step before ended are counted idle about that long each; the steps
// recorded are not counted (their program runs to its end before RunStep
// returns, so nothing is watched).
TEST(StepReplayTest, TheDeviceIdleTimeIsTheHostsGapBetweenReplays) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin);
  ASSERT_TRUE(pjrt);
  Model m(*pjrt, 16, 8);
  constexpr auto kGap = std::chrono::milliseconds(30);
  for (int u = 0; u < 8; ++u) {
    m.Step(u, LearningRate(u));  // the loss read at the step's end: the execution has ended
    std::this_thread::sleep_for(kGap);
  }
  // Replays 3..8 (6), each after a gap; the first replay follows a recording.
  EXPECT_EQ(pjrt->stats().step_replays, 6);
  EXPECT_EQ(pjrt->stats().idle_launches, 5);
  // An execution's end is stamped by the plugin's callback, on its own
  // thread: on a loaded machine that may run a few ms after the read
  // returned and the gap began, so each gap counts at least most of it.
  EXPECT_GE(pjrt->device_idle_seconds(), 5 * 0.8 * std::chrono::duration<double>(kGap).count());
  EXPECT_LT(pjrt->device_idle_seconds(), 5 * 10 * std::chrono::duration<double>(kGap).count());
}

// A replayed model learns: the loss on one fixed batch falls as it would
// recorded (the state a replay writes is the state the next one reads).
TEST(StepReplayTest, AReplayedModelLearnsAFixedBatch) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin);
  ASSERT_TRUE(pjrt);
  Model m(*pjrt, 16, 8);
  float first = 0;
  for (int u = 0; u < 200; ++u) {
    if (u == 0) {
      m.Prepare(0, 1e-2f);
    } else {
      m.adam->Prepare(1e-2f);  // the same batch, left on the device
    }
    pjrt->RunStep(m.Signature(), [&] { m.DevicePart(); });
    if (u == 0) first = m.loss;
  }
  EXPECT_GT(pjrt->stats().step_replays, 190);
  EXPECT_LT(m.loss, 0.2f * first) << "from " << first;
}

// A step of another shape (a new batch size: a new signature) is recorded
// anew and compiled once; going back to the first replays it at once.
TEST(StepReplayTest, ANewShapeRecordsAgainAndTheOldOneStillReplays) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin);
  ASSERT_TRUE(pjrt);
  Model small(*pjrt, 8, 4), large(*pjrt, 24, 4);
  for (int u = 0; u < 4; ++u) small.Step(u, 1e-3f);
  EXPECT_EQ(pjrt->stats().step_replays, 2);
  for (int u = 0; u < 4; ++u) large.Step(u, 1e-3f);
  EXPECT_EQ(pjrt->stats().step_replays, 4) << "two recordings of the new shape, then replays";
  EXPECT_EQ(pjrt->stats().step_compiles, 2);
  small.Step(4, 1e-3f);
  EXPECT_EQ(pjrt->stats().step_replays, 5);
}

// An argument's memory freed and allocated again between replays (the
// batch's buffer made anew: another allocation, at the same address or
// not) is found again: the step records twice more and replays on the new
// memory, the updates the CPU backend's given the same batches; memory
// allocated elsewhere meanwhile (another model's) leaves the replay bound.
TEST(StepReplayTest, AnArgumentMadeAnewRecordsAgainAndReplaysOnTheNewMemory) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin);
  ASSERT_TRUE(pjrt);
  nn::CpuBackend cpu(1);
  Model a(*pjrt, 16, 8), b(cpu, 16, 8);
  int u = 0;
  const auto steps = [&](int count) {
    for (int i = 0; i < count; ++i, ++u) {
      a.Step(u, 1e-2f);
      b.Step(u, 1e-2f);
    }
  };
  steps(4);
  ASSERT_EQ(pjrt->stats().step_replays, 2);
  Model other(*pjrt, 16, 8);  // allocations elsewhere: the step's own are unchanged
  steps(2);
  EXPECT_EQ(pjrt->stats().step_replays, 4);
  for (Model* m : {&a, &b}) {
    m->x = nn::DeviceBuffer();  // freed first: the range may be reserved again for the next
    m->x = nn::DeviceBuffer(m->backend, m->batch * m->inputs);
  }
  steps(5);
  EXPECT_EQ(pjrt->stats().step_replays, 7) << "two recordings on the new memory, then replays";
  EXPECT_EQ(pjrt->stats().steps, 11);
  EXPECT_NEAR(a.loss, b.loss, 1e-5f);
  EXPECT_TRUE(SameValues(a, b));
}

// What a replay could not repeat keeps a step recording every call, and
// correct: Adam prepared inside the step (its bias corrections then host
// scalars), and an upload inside the step.
TEST(StepReplayTest, AStepTakingHostDataInsideRecordsEveryCall) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin);
  ASSERT_TRUE(pjrt);
  Model m(*pjrt, 8, 4);
  m.Prepare(0, 1e-3f);
  for (int u = 0; u < 4; ++u) {
    pjrt->RunStep(m.Signature(), [&] {
      m.adam->Prepare(1e-3f);
      m.DevicePart();
    });
  }
  EXPECT_EQ(pjrt->stats().step_replays, 0);
  EXPECT_EQ(m.adam->steps(), 5);
  for (int u = 0; u < 4; ++u) {
    m.adam->Prepare(1e-3f);
    pjrt->RunStep(m.Signature(), [&] {
      m.y.Upload(nn::RandomVector(m.batch, 300 + u));
      m.DevicePart();
    });
  }
  EXPECT_EQ(pjrt->stats().step_replays, 0);
  EXPECT_EQ(pjrt->stats().steps, 8);
}

// Elsewhere RunStep is BeginStep, the device part, EndStep, every call.
TEST(StepReplayTest, TheCpuRunsTheDevicePartEveryCall) {
  nn::CpuBackend cpu(1);
  EXPECT_FALSE(cpu.replays_steps());
  Model m(cpu, 8, 4);
  int calls = 0;
  for (int u = 0; u < 3; ++u) {
    m.Prepare(u, 1e-3f);
    cpu.RunStep(m.Signature(), [&] {
      ++calls;
      EXPECT_TRUE(cpu.in_step());
      m.DevicePart();
    });
  }
  EXPECT_EQ(calls, 3);
}

// Four steps of one signature whose device part fills with a value from the
// host (1, then 2 from the third call on: not an input) and reads it back;
// the last value read.
float StepsTakingAHostValue(PjrtBackend& pjrt) {
  float* x = pjrt.AllocateFloats(8);
  float out = 0;
  for (int call = 0; call < 4; ++call) {
    pjrt.RunStep(7, [&] {
      pjrt.Fill(x, 8, call < 2 ? 1.0f : 2.0f);
      pjrt.ReadAtStepEnd(x, &out, sizeof(float));
    });
  }
  return out;
}

// The guard: with check_replay_every 1 every replay is recorded again
// first; a device part that takes a value from the host (here a fill's
// value that changes at the third call) stops the process naming it.
TEST(StepReplayDeathTest, TheGuardStopsAReplayWhoseRecordingDiffers) {
  REQUIRE_PLUGIN();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin, /*check_replay_every=*/1);
        StepsTakingAHostValue(*pjrt);
      },
      "differs from its replay in run-time scalar 0 \\(1.000000 replayed, 2.000000 recorded\\)");
}

// Without the guard the same device part replays its first value: the
// contract the guard is there to check (a host value must be an input).
TEST(StepReplayTest, WithoutTheGuardAHostValueIsReplayedAsRecorded) {
  REQUIRE_PLUGIN();
  std::unique_ptr<PjrtBackend> pjrt = NewPjrt(plugin);
  ASSERT_TRUE(pjrt);
  EXPECT_EQ(StepsTakingAHostValue(*pjrt), 1.0f);
  EXPECT_EQ(pjrt->stats().step_replays, 2);
}

}  // namespace
}  // namespace troupe::pjrt
