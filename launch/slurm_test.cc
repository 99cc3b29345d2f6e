#include "launch/slurm.h"

#include <google/protobuf/text_format.h>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace troupe::launch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::Not;

config::ExperimentConfig Config(const std::string& text) {
  config::ExperimentConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString("mode: RL " + text, &config)) << text;
  return config;
}

TEST(PlanSlurmJobTest, PutsTheLearnerOnTheFirstNodeAndSpreadsActorsOverTheOthers) {
  auto plan = PlanSlurmJob(Config("actors { count: 5 } slurm { nodes: 3 }"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(plan->learner_ranks, 1);
  EXPECT_FALSE(plan->mpi);
  EXPECT_EQ(plan->tasks_per_node, 2);  // 6 processes over 3 nodes
  EXPECT_THAT(plan->learner_rank_nodes, ElementsAre(0));
  EXPECT_THAT(plan->actor_nodes, ElementsAre(1, 2, 0, 1, 2));
  EXPECT_EQ(plan->cpus_per_task, 2);  // max(cpus_per_actor 1, cpus_per_learner_rank 2)
}

TEST(PlanSlurmJobTest, GivesMpiReplicasOneTaskEach) {
  auto plan = PlanSlurmJob(Config(
      "learner { engine { collectives: MPI replicas: 3 } } actors { count: 2 } slurm { nodes: 2 tasks_per_node: 3 }"));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_TRUE(plan->mpi);
  EXPECT_EQ(plan->learner_ranks, 3);
  EXPECT_THAT(plan->learner_rank_nodes, ElementsAre(0, 0, 0));
  EXPECT_THAT(plan->actor_nodes, ElementsAre(1, 1));
}

TEST(PlanSlurmJobTest, RefusesAnAllocationTooSmallAndOtherModes) {
  auto small = PlanSlurmJob(Config("actors { count: 4 } slurm { nodes: 2 tasks_per_node: 2 }"));
  EXPECT_EQ(small.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(small.status().message(), HasSubstr("slurm.nodes 2 x slurm.tasks_per_node 2 = 4 task slots, but the job "
                                                  "runs 1 learner rank(s) and 4 actors (actors.count) = 5 tasks"));
  EXPECT_THAT(PlanSlurmJob(Config("actors { count: 1 } slurm { nodes: 3 }")).status().message(),
              HasSubstr("slurm.nodes 3: more nodes than the job's 2 processes"));
  EXPECT_THAT(PlanSlurmJob(Config("slurm { cpus_per_actor: 0 }")).status().message(),
              HasSubstr("slurm.cpus_per_actor 0"));
  config::ExperimentConfig gan = Config("");
  gan.set_mode(config::ExperimentConfig::GAN);
  EXPECT_THAT(PlanSlurmJob(gan).status().message(), HasSubstr("troupe run --slurm runs RL experiments"));
}

TEST(CheckPlanFitsPartitionTest, NamesWhatDoesNotFit) {
  auto plan = PlanSlurmJob(Config("actors { count: 3 } slurm { nodes: 2 cpus_per_actor: 4 }"));
  ASSERT_TRUE(plan.ok());
  EXPECT_TRUE(CheckPlanFitsPartition(*plan, {.name = "cpu", .nodes = 2, .cpus_per_node = 8}, "slurm.partition").ok());
  EXPECT_THAT(CheckPlanFitsPartition(*plan, {.name = "cpu", .nodes = 1, .cpus_per_node = 64}, "slurm.partition")
                  .message(),
              HasSubstr("slurm.nodes 2, but slurm.partition \"cpu\" has 1 node(s)"));
  EXPECT_THAT(CheckPlanFitsPartition(*plan, {.name = "cpu", .nodes = 2, .cpus_per_node = 4}, "slurm.partition")
                  .message(),
              HasSubstr("2 tasks per node x 4 CPUs each"));
}

TEST(SlurmJobScriptTest, AsksForThePlanAndRunsTheJobInTheRunDirectory) {
  const config::ExperimentConfig config = Config(
      R"(name: "walk" actors { count: 3 } slurm { nodes: 2 partition: "cpu" time_limit: "1:00:00" warn_before_end_s: 90 })");
  auto plan = PlanSlurmJob(config);
  ASSERT_TRUE(plan.ok());
  const std::string script = SlurmJobScript(config, *plan, "/shared/runs/walk-1", "/opt/troupe/bin/troupe");
  EXPECT_THAT(script, HasSubstr("#!/bin/bash\n"));
  EXPECT_THAT(script, HasSubstr("#SBATCH --job-name=troupe-walk\n"));
  EXPECT_THAT(script, HasSubstr("#SBATCH --output=/shared/runs/walk-1/slurm/job-%j.out\n"));
  EXPECT_THAT(script, HasSubstr("#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=2\n#SBATCH --cpus-per-task=2\n"));
  EXPECT_THAT(script, HasSubstr("#SBATCH --partition=cpu\n#SBATCH --time=1:00:00\n"));
  EXPECT_THAT(script, HasSubstr("#SBATCH --signal=B:USR1@90\n#SBATCH --requeue\n"));
  EXPECT_THAT(script, HasSubstr("exec '/opt/troupe/bin/troupe' slurm-job '/shared/runs/walk-1'\n"));
  EXPECT_THAT(script, Not(HasSubstr("--gpus")));
}

TEST(RunProgramTest, ReturnsOutputAndExitStatusOrNotFound) {
  auto result = RunProgram({"sh", "-c", "echo out; echo err >&2; exit 3"});
  ASSERT_TRUE(result.ok());
  EXPECT_EQ(result->exit_code, 3);
  EXPECT_THAT(result->output, HasSubstr("out\n"));
  EXPECT_THAT(result->output, HasSubstr("err\n"));
  EXPECT_EQ(RunProgram({"no-such-program-troupe"}).status().code(), absl::StatusCode::kNotFound);
}

TEST(SlurmTimeLimitTest, ReadsEverySlurmFormatAndNothingElse) {
  EXPECT_EQ(SlurmTimeLimitSeconds("90"), 90 * 60);
  EXPECT_EQ(SlurmTimeLimitSeconds("10:30"), 10 * 60 + 30);
  EXPECT_EQ(SlurmTimeLimitSeconds("1:30:00"), 5400);
  EXPECT_EQ(SlurmTimeLimitSeconds("2-12"), (2 * 24 + 12) * 3600);
  EXPECT_EQ(SlurmTimeLimitSeconds("1-2:03"), ((24 + 2) * 60 + 3) * 60);
  EXPECT_EQ(SlurmTimeLimitSeconds("1-2:03:04"), ((24 + 2) * 60 + 3) * 60 + 4);
  EXPECT_EQ(SlurmTimeLimitSeconds("UNLIMITED"), -1);
  for (const char* bad : {"", "soon", "-30", "1:xx", "1:2:3:4", "1-", "-1-2", "1.5", " 90", "90m", "99999999"}) {
    EXPECT_EQ(SlurmTimeLimitSeconds(bad), std::nullopt) << bad;
  }
}

TEST(ValidateSlurmConfigTest, NamesTheFieldAndWhatWouldBeRight) {
  config::SlurmConfig slurm;
  EXPECT_TRUE(ValidateSlurmConfig(slurm).ok());
  slurm.set_time_limit("0");
  EXPECT_THAT(ValidateSlurmConfig(slurm).message(), ::testing::HasSubstr("slurm.time_limit \"0\": must be more than 0"));
  slurm.set_time_limit("1:00:00");
  slurm.set_warn_before_end_s(3600);
  EXPECT_THAT(ValidateSlurmConfig(slurm).message(),
              ::testing::HasSubstr("slurm.warn_before_end_s 3600: not shorter than slurm.time_limit \"1:00:00\""));
  slurm.set_warn_before_end_s(120);
  EXPECT_TRUE(ValidateSlurmConfig(slurm).ok());
  slurm.set_partition("gpu; rm -rf");
  EXPECT_THAT(ValidateSlurmConfig(slurm).message(), ::testing::HasSubstr("slurm.partition"));
}

// Options troupe sets itself are refused in every spelling sbatch reads;
// others, and options that merely begin alike, pass.
TEST(CheckSbatchOptionsAvoidTest, RefusesReservedOptionsInEverySpelling) {
  const std::vector<std::string> reserved = {"-N", "--nodes"};
  for (const std::string option : {"-N", "-N2", "--nodes", "--nodes=2"}) {
    const absl::Status status = CheckSbatchOptionsAvoid({"--time=10", option}, reserved, "the config says");
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << option;
    EXPECT_EQ(status.message(), "--slurm " + option + ": the config says; nothing was submitted");
  }
  EXPECT_TRUE(CheckSbatchOptionsAvoid({"--time=10", "--nodelist=n0", "-p", "debug"}, reserved, "").ok());
  EXPECT_TRUE(CheckSbatchOptionsAvoid({}, reserved, "").ok());
}

}  // namespace
}  // namespace troupe::launch
