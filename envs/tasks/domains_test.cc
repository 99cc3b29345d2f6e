// Tests of the reacher, finger, cheetah, walker and ball_in_cup domains: each
// model loads, binds and runs an episode of random actions within its reward
// range and without numerical warnings, and each reward responds to the
// physical situation it names.
#include <mujoco/mujoco.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "envs/task.h"
#include "envs/tasks/tasks.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::envs {
namespace {

using ::testing::HasSubstr;

// The five tasks these domains define, each found by name.
TaskInfo FindInfo(const std::string& name) {
  for (auto list : {ReacherTasks, FingerTasks, CheetahTasks, WalkerTasks, BallInCupTasks}) {
    for (const TaskInfo& info : list()) {
      if (info.name == name) return info;
    }
  }
  ADD_FAILURE() << "no task " << name;
  return {};
}

// A task bound to its own freshly loaded model and data.
class LoadedTask {
 public:
  explicit LoadedTask(const std::string& name) : info_(FindInfo(name)) {
    const std::string path = AssetsDir() + "/" + info_.model_file;
    char error[1000] = "";
    model_ = mj_loadXML(path.c_str(), nullptr, error, sizeof(error));
    if (model_ == nullptr) {
      ADD_FAILURE() << "cannot load " << path << ": " << error;
      return;
    }
    data_ = mj_makeData(model_);
    task_ = info_.make();
    const absl::Status status = task_->Bind(model_);
    if (!status.ok()) {
      ADD_FAILURE() << status;
      task_ = nullptr;
    }
  }
  ~LoadedTask() {
    if (data_ != nullptr) mj_deleteData(data_);
    if (model_ != nullptr) mj_deleteModel(model_);
  }
  LoadedTask(const LoadedTask&) = delete;
  LoadedTask& operator=(const LoadedTask&) = delete;

  bool ok() const { return task_ != nullptr; }
  const TaskInfo& info() const { return info_; }
  const mjModel* model() const { return model_; }
  mjData* data() { return data_; }
  Task& task() { return *task_; }

  // Resets the data and starts an episode drawn from `seed`, as the env does.
  void Reset(uint64_t seed) {
    std::mt19937_64 rng(seed);
    mj_resetData(model_, data_);
    task_->InitializeEpisode(model_, data_, rng);
    mj_forward(model_, data_);
  }

  // One control step: `action` held for the task's physics substeps, then
  // derived quantities brought up to date. Returns the reward.
  double Step(const std::vector<double>& action) {
    std::copy(action.begin(), action.end(), data_->ctrl);
    for (int i = 0; i < info_.control_substeps; ++i) mj_step(model_, data_);
    mj_forward(model_, data_);
    return task_->Reward(model_, data_);
  }

  // Recomputes derived quantities after qpos/qvel were set by hand.
  double Forward() {
    mj_forward(model_, data_);
    return task_->Reward(model_, data_);
  }

  int ObservationSize() const {
    int size = 0;
    for (const ObservationField& field : task_->ObservationSpec()) size += field.size;
    return size;
  }

  std::vector<float> Observe() {
    std::vector<float> observation(ObservationSize());
    task_->Observe(model_, data_, observation.data());
    return observation;
  }

  int JointQpos(const char* name) const { return model_->jnt_qposadr[mj_name2id(model_, mjOBJ_JOINT, name)]; }
  int JointDof(const char* name) const { return model_->jnt_dofadr[mj_name2id(model_, mjOBJ_JOINT, name)]; }

  // The total count of MuJoCo warnings (instability, bad contacts, ...).
  int WarningCount() const {
    int count = 0;
    for (int i = 0; i < mjNWARNING; ++i) count += data_->warning[i].number;
    return count;
  }

 private:
  TaskInfo info_;
  mjModel* model_ = nullptr;
  mjData* data_ = nullptr;
  std::unique_ptr<Task> task_;
};

std::vector<double> Zeros(const mjModel* model) { return std::vector<double>(model->nu, 0.0); }

// ---------------------------------------------------------------------------
// Properties every domain has.

class DomainTest : public ::testing::TestWithParam<std::string> {};

TEST_P(DomainTest, TaskInfoDescribesAThousandStepEpisodeFromAFixedCamera) {
  LoadedTask loaded(GetParam());
  ASSERT_TRUE(loaded.ok());
  EXPECT_EQ(loaded.info().episode_steps, 1000);
  EXPECT_GE(mj_name2id(loaded.model(), mjOBJ_CAMERA, loaded.info().pixel_camera.c_str()), 0);
  EXPECT_GE(loaded.model()->vis.global.offwidth, 84);
  // Every actuator takes actions in [-1, 1].
  for (int i = 0; i < loaded.model()->nu; ++i) {
    EXPECT_TRUE(loaded.model()->actuator_ctrllimited[i]);
    EXPECT_EQ(loaded.model()->actuator_ctrlrange[2 * i], -1.0);
    EXPECT_EQ(loaded.model()->actuator_ctrlrange[2 * i + 1], 1.0);
  }
}

TEST_P(DomainTest, RandomActionsKeepRewardInUnitIntervalAndStateFinite) {
  LoadedTask loaded(GetParam());
  ASSERT_TRUE(loaded.ok());
  loaded.Reset(/*seed=*/7);
  std::mt19937_64 action_rng(/*seed=*/11);
  std::uniform_real_distribution<double> uniform(-1.0, 1.0);
  std::vector<double> action(loaded.model()->nu);
  for (int step = 0; step < loaded.info().episode_steps; ++step) {
    for (double& a : action) a = uniform(action_rng);
    const double reward = loaded.Step(action);
    ASSERT_GE(reward, 0.0) << "step " << step;
    ASSERT_LE(reward, 1.0) << "step " << step;
    for (float value : loaded.Observe()) ASSERT_TRUE(std::isfinite(value)) << "step " << step;
  }
  EXPECT_EQ(loaded.WarningCount(), 0);
}

TEST_P(DomainTest, ObserveWritesExactlyTheSpecifiedFields) {
  LoadedTask loaded(GetParam());
  ASSERT_TRUE(loaded.ok());
  loaded.Reset(/*seed=*/1);
  // A guard after the specified length must stay untouched.
  const int size = loaded.ObservationSize();
  ASSERT_GT(size, 0);
  constexpr float kGuard = -12345.0f;
  std::vector<float> buffer(size + 8, kGuard);
  loaded.task().Observe(loaded.model(), loaded.data(), buffer.data());
  for (int i = 0; i < size; ++i) EXPECT_TRUE(std::isfinite(buffer[i])) << "element " << i;
  for (int i = size; i < size + 8; ++i) EXPECT_EQ(buffer[i], kGuard) << "element " << i;
  for (const ObservationField& field : loaded.task().ObservationSpec()) {
    EXPECT_FALSE(field.name.empty());
    EXPECT_GT(field.size, 0);
  }
}

TEST_P(DomainTest, SameSeedGivesSameInitialStateAndOtherSeedsDiffer) {
  LoadedTask loaded(GetParam());
  ASSERT_TRUE(loaded.ok());
  loaded.Reset(/*seed=*/3);
  const std::vector<float> first = loaded.Observe();
  loaded.Reset(/*seed=*/3);
  EXPECT_EQ(loaded.Observe(), first);
  loaded.Reset(/*seed=*/4);
  EXPECT_NE(loaded.Observe(), first);
}

TEST_P(DomainTest, BindingAnotherDomainsModelNamesTheMissingElementAndFile) {
  LoadedTask loaded(GetParam());
  ASSERT_TRUE(loaded.ok());
  // Every task reads names that another domain's model lacks.
  const std::string other = loaded.info().model_file == "reacher.xml" ? "cheetah.xml" : "reacher.xml";
  char error[1000] = "";
  mjModel* other_model = mj_loadXML((AssetsDir() + "/" + other).c_str(), nullptr, error, sizeof(error));
  ASSERT_NE(other_model, nullptr) << error;
  const absl::Status status = loaded.info().make()->Bind(other_model);
  EXPECT_EQ(status.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(status.message()), HasSubstr(loaded.info().model_file));
  EXPECT_THAT(std::string(status.message()), HasSubstr("not found"));
  mj_deleteModel(other_model);
}

INSTANTIATE_TEST_SUITE_P(Domains, DomainTest,
                         ::testing::Values("reacher.easy", "finger.spin", "cheetah.run", "walker.walk",
                                           "ball_in_cup.catch"),
                         [](const ::testing::TestParamInfo<std::string>& info) {
                           std::string name = info.param;
                           std::replace(name.begin(), name.end(), '.', '_');
                           return name;
                         });

// ---------------------------------------------------------------------------
// Reacher: the reward is 1 exactly when the fingertip touches the target.

TEST(ReacherTest, RewardIsOneWithFingertipOnTargetAndZeroAway) {
  LoadedTask loaded("reacher.easy");
  ASSERT_TRUE(loaded.ok());
  const mjModel* model = loaded.model();
  for (uint64_t seed = 0; seed < 10; ++seed) {
    loaded.Reset(seed);
    // Observation's to_target (fields 2, 3) is the target relative to the
    // fingertip; add the fingertip to get the target relative to the arm.
    const int finger = mj_name2id(model, mjOBJ_GEOM, "finger");
    const std::vector<float> observation = loaded.Observe();
    const double target_x = observation[2] + loaded.data()->geom_xpos[3 * finger];
    const double target_y = observation[3] + loaded.data()->geom_xpos[3 * finger + 1];
    // Two-link inverse kinematics: upper arm to the wrist, forearm to the tip.
    const double upper = model->body_pos[3 * mj_name2id(model, mjOBJ_BODY, "hand")];
    const double fore = model->body_pos[3 * mj_name2id(model, mjOBJ_BODY, "finger")];
    const double distance_squared = target_x * target_x + target_y * target_y;
    const double cos_wrist = (distance_squared - upper * upper - fore * fore) / (2 * upper * fore);
    ASSERT_LE(std::abs(cos_wrist), 1.0) << "target out of reach, seed " << seed;
    const double wrist = std::acos(cos_wrist);
    const double shoulder =
        std::atan2(target_y, target_x) - std::atan2(fore * std::sin(wrist), upper + fore * std::cos(wrist));
    loaded.data()->qpos[loaded.JointQpos("shoulder")] = shoulder;
    loaded.data()->qpos[loaded.JointQpos("wrist")] = wrist;
    EXPECT_EQ(loaded.Forward(), 1.0) << "seed " << seed;
    // Turning the arm half a turn takes the tip away from the target.
    loaded.data()->qpos[loaded.JointQpos("shoulder")] = shoulder + M_PI;
    EXPECT_EQ(loaded.Forward(), 0.0) << "seed " << seed;
  }
}

// ---------------------------------------------------------------------------
// Finger: the reward is 1 while the spinner turns at <= -15 rad/s, and the
// finger can get it there.

TEST(FingerTest, RewardIsOneOnlyWhenSpinningFastInTheNegativeSense) {
  LoadedTask loaded("finger.spin");
  ASSERT_TRUE(loaded.ok());
  loaded.Reset(/*seed=*/0);
  const int hinge = loaded.JointDof("hinge");
  loaded.data()->qvel[hinge] = -20.0;
  EXPECT_EQ(loaded.Forward(), 1.0);
  loaded.data()->qvel[hinge] = -10.0;
  EXPECT_EQ(loaded.Forward(), 0.0);
  loaded.data()->qvel[hinge] = 20.0;
  EXPECT_EQ(loaded.Forward(), 0.0);
}

TEST(FingerTest, FlickingTheFingerSpinsTheSpinner) {
  LoadedTask loaded("finger.spin");
  ASSERT_TRUE(loaded.ok());
  // An open-loop flick from the model's home state (the finger hanging
  // down): each motor a full-scale square wave at 1.7 Hz, the distal one a
  // quarter period behind (the parity test's scripted policy).
  mj_resetData(loaded.model(), loaded.data());
  mj_forward(loaded.model(), loaded.data());
  constexpr double kFrequency = 1.7;
  double episode_return = 0.0;
  double fastest = 0.0;
  for (int step = 0; step < 1000; ++step) {
    const double phase = 2 * M_PI * kFrequency * loaded.data()->time;
    const double proximal = std::sin(phase) > 0 ? 1.0 : -1.0;
    const double distal = std::sin(phase - M_PI / 2) > 0 ? 1.0 : -1.0;
    episode_return += loaded.Step({proximal, distal});
    fastest = std::min(fastest, loaded.data()->qvel[loaded.JointDof("hinge")]);
  }
  EXPECT_LT(fastest, -15.0);
  EXPECT_GT(episode_return, 20.0);
  // Without action the spinner never moves that fast.
  loaded.Reset(/*seed=*/0);
  double idle_return = 0.0;
  for (int step = 0; step < 1000; ++step) idle_return += loaded.Step(Zeros(loaded.model()));
  EXPECT_EQ(idle_return, 0.0);
}

// ---------------------------------------------------------------------------
// Cheetah: no reward at rest, some for running forward.

TEST(CheetahTest, RestingEarnsNothingAndAGaitRunsForward) {
  LoadedTask loaded("cheetah.run");
  ASSERT_TRUE(loaded.ok());
  const int rootx = loaded.JointQpos("rootx");
  for (uint64_t seed = 0; seed < 3; ++seed) {
    // At rest after settling: no forward speed, (almost) no reward.
    loaded.Reset(seed);
    double rest_return = 0.0;
    for (int step = 0; step < 200; ++step) rest_return += loaded.Step(Zeros(loaded.model()));
    EXPECT_LT(rest_return, 1.0) << "seed " << seed;

    // A bang-bang gait: each joint a square wave at 4.5 Hz with its own
    // phase (found by a small random search on dm_control's cheetah, the
    // same model: 11-13 m in 5 s from four of its initial states), run for 5 s.
    constexpr double kFrequency = 4.498;
    constexpr double kPhases[6] = {4.945, 1.504, 5.507, 0.368, 2.112, 0.944};
    loaded.Reset(seed);
    const double start = loaded.data()->qpos[rootx];
    double run_return = 0.0;
    std::vector<double> action(6);
    for (int step = 0; step < 500; ++step) {
      for (int j = 0; j < 6; ++j) {
        action[j] = std::sin(2 * M_PI * kFrequency * loaded.data()->time + kPhases[j]) > 0 ? 1.0 : -1.0;
      }
      run_return += loaded.Step(action);
    }
    EXPECT_GT(loaded.data()->qpos[rootx] - start, 3.0) << "seed " << seed;
    EXPECT_GT(run_return, 10.0) << "seed " << seed;
  }
}

TEST(CheetahTest, RewardIsOneAtTenMetresPerSecond) {
  LoadedTask loaded("cheetah.run");
  ASSERT_TRUE(loaded.ok());
  loaded.Reset(/*seed=*/0);
  // The whole body moving forward as one: its centre of mass moves too.
  mju_zero(loaded.data()->qvel, loaded.model()->nv);
  loaded.data()->qvel[loaded.JointDof("rootx")] = 10.0;
  EXPECT_NEAR(loaded.Forward(), 1.0, 1e-9);
  loaded.data()->qvel[loaded.JointDof("rootx")] = 5.0;
  EXPECT_NEAR(loaded.Forward(), 0.5, 1e-9);
}

// ---------------------------------------------------------------------------
// Walker: standing still upright earns 1/6, walking upright at 1 m/s earns 1,
// and without action the walker falls and earns less.

TEST(WalkerTest, UprightRewardsAndFallingUnderZeroAction) {
  LoadedTask loaded("walker.walk");
  ASSERT_TRUE(loaded.ok());
  // The home pose: upright, torso 1.3 m up, at rest.
  mj_resetData(loaded.model(), loaded.data());
  EXPECT_NEAR(loaded.Forward(), 1.0 / 6.0, 1e-9);
  loaded.data()->qvel[loaded.JointDof("rootx")] = 1.0;
  EXPECT_NEAR(loaded.Forward(), 1.0, 1e-9);
  loaded.data()->qvel[loaded.JointDof("rootx")] = 0.0;
  loaded.Forward();
  // With no torque the knees buckle: the torso drops and the reward decays.
  for (int step = 0; step < 300; ++step) loaded.Step(Zeros(loaded.model()));
  const std::vector<float> observation = loaded.Observe();
  EXPECT_LT(observation[14], 0.9) << "torso height";
  EXPECT_LT(loaded.task().Reward(loaded.model(), loaded.data()), 0.1);
}

// ---------------------------------------------------------------------------
// Ball in cup: 1 while the ball sits in the cup, 0 while it hangs below.

TEST(BallInCupTest, RewardIsOneWithBallInCupAndZeroHangingBelow) {
  LoadedTask loaded("ball_in_cup.catch");
  ASSERT_TRUE(loaded.ok());
  const mjModel* model = loaded.model();
  // The home state: the ball hangs below the cup, on the string.
  mj_resetData(model, loaded.data());
  EXPECT_EQ(loaded.Forward(), 0.0);
  double hanging_return = 0.0;
  for (int step = 0; step < 200; ++step) hanging_return += loaded.Step(Zeros(model));
  EXPECT_EQ(hanging_return, 0.0);

  // Put the ball in the cup, just above its floor (0.1 m below the rim): it
  // stays there, the cup sagging on its springs under the ball's weight.
  mj_resetData(model, loaded.data());
  const int ball_body = mj_name2id(model, mjOBJ_BODY, "ball");
  const int cup_body = mj_name2id(model, mjOBJ_BODY, "cup");
  const double ball_in_cup_z = model->body_pos[3 * cup_body + 2] - 0.06;
  loaded.data()->qpos[loaded.JointQpos("ball_z")] = ball_in_cup_z - model->body_pos[3 * ball_body + 2];
  EXPECT_EQ(loaded.Forward(), 1.0);
  double caught_return = 0.0;
  for (int step = 0; step < 200; ++step) caught_return += loaded.Step(Zeros(model));
  EXPECT_EQ(caught_return, 200.0);
}

TEST(BallInCupTest, EpisodesStartAsDmControlsWithNothingTouchingAndTheStringSlack) {
  LoadedTask loaded("ball_in_cup.catch");
  ASSERT_TRUE(loaded.ok());
  const int string = mj_name2id(loaded.model(), mjOBJ_TENDON, "string");
  const int ball_x = loaded.JointQpos("ball_x"), ball_z = loaded.JointQpos("ball_z");
  for (uint64_t seed = 0; seed < 20; ++seed) {
    loaded.Reset(seed);
    // dm_control's draw: ball x in [-0.2, 0.2], z in [0.2, 0.5], the cup at home.
    EXPECT_LE(std::abs(loaded.data()->qpos[ball_x]), 0.2) << "seed " << seed;
    EXPECT_GE(loaded.data()->qpos[ball_z], 0.2) << "seed " << seed;
    EXPECT_LE(loaded.data()->qpos[ball_z], 0.5) << "seed " << seed;
    EXPECT_EQ(loaded.data()->qpos[loaded.JointQpos("cup_x")], 0.0) << "seed " << seed;
    EXPECT_EQ(loaded.data()->ncon, 0) << "seed " << seed;
    EXPECT_LE(loaded.data()->ten_length[string], loaded.model()->tendon_range[2 * string + 1]) << "seed " << seed;
  }
}

}  // namespace
}  // namespace troupe::envs
