// troupe_task_probe TASK: a task's env driven line by line over stdin, for
// tests that compare troupe's tasks with another implementation on the same
// physics states (tests/parity/dm_control_parity.py). One JSON line out per
// line in:
//   spec                        {"nq","nv","nu","episode_steps","timestep","substeps","fields":[[name,size]...],
//                                "joints":[...]}
//   reset QPOS... QVEL...       a new episode (the env's Reset) put in that state
//                               -> {"obs":[...]}
//   set QPOS... QVEL... CTRL... that state and last control, mid-episode
//                               -> {"obs":[...],"reward":r}
//   step ACTION...              the env's Step -> {"obs","reward","last","discount","qpos","qvel"}
//   mocap X Y Z                 the first mocap body's position (reacher's target) -> {"obs":[...]}
// Errors print {"error": "..."}. Not a user tool: a test helper.
#include <cstdio>
#include <iostream>
#include <sstream>
#include <string>
#include <vector>

#include "envs/env.h"

namespace {

std::string Json(const std::vector<double>& values) {
  std::string out = "[";
  char number[32];
  for (size_t i = 0; i < values.size(); ++i) {
    std::snprintf(number, sizeof(number), "%s%.17g", i ? "," : "", values[i]);
    out += number;
  }
  return out + "]";
}

std::vector<double> Floats(const std::vector<float>& values) { return {values.begin(), values.end()}; }

}  // namespace

int main(int argc, char** argv) {
  using namespace troupe::envs;
  if (argc != 2) {
    std::fprintf(stderr, "usage: troupe_task_probe TASK\n");
    return 2;
  }
  EnvOptions options;
  options.task = argv[1];
  options.pixels = false;
  auto made = MakeEnv(options);
  if (!made.ok()) {
    std::fprintf(stderr, "troupe_task_probe: %s\n", made.status().ToString().c_str());
    return 1;
  }
  Environment& env = **made;
  auto info = FindTask(options.task);
  const mjModel* m = env.model();
  // The env's own mjData: a test helper may set its state between steps.
  mjData* d = const_cast<mjData*>(env.data());
  std::vector<float> obs(env.spec().state_size);
  std::vector<float> action(m->nu);

  std::string line;
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string command;
    in >> command;
    std::vector<double> numbers;
    for (double x; in >> x;) numbers.push_back(x);
    if (command == "spec") {
      std::string fields, joints;
      for (const auto& field : env.spec().state_fields) {
        fields += (fields.empty() ? "" : ",") + ("[\"" + field.name + "\"," + std::to_string(field.size) + "]");
      }
      for (int j = 0; j < m->njnt; ++j) {
        joints += (joints.empty() ? "\"" : ",\"") + std::string(mj_id2name(m, mjOBJ_JOINT, j)) + "\"";
      }
      std::printf("{\"nq\":%d,\"nv\":%d,\"nu\":%d,\"episode_steps\":%d,\"timestep\":%.17g,\"substeps\":%d,"
                  "\"fields\":[%s],\"joints\":[%s],\"model\":\"%s\"}\n",
                  m->nq, m->nv, m->nu, env.spec().episode_steps, m->opt.timestep, (*info)->control_substeps,
                  fields.c_str(), joints.c_str(), (AssetsDir() + "/" + (*info)->model_file).c_str());
    } else if (command == "reset" || command == "set") {
      const size_t want = size_t(m->nq + m->nv) + (command == "set" ? m->nu : 0);
      if (numbers.size() != want) {
        std::printf("{\"error\":\"%s takes %zu numbers, got %zu\"}\n", command.c_str(), want, numbers.size());
      } else {
        if (command == "reset" && !env.Reset({obs.data(), nullptr}).ok()) {
          std::printf("{\"error\":\"reset failed\"}\n");
          continue;
        }
        std::copy_n(numbers.data(), m->nq, d->qpos);
        std::copy_n(numbers.data() + m->nq, m->nv, d->qvel);
        if (command == "set") std::copy_n(numbers.data() + m->nq + m->nv, m->nu, d->ctrl);
        mj_forward(m, d);
        (void)env.Observe({obs.data(), nullptr});
        if (command == "reset") {
          std::printf("{\"obs\":%s}\n", Json(Floats(obs)).c_str());
        } else {
          std::printf("{\"obs\":%s,\"reward\":%.17g}\n", Json(Floats(obs)).c_str(), env.task().Reward(m, d));
        }
      }
    } else if (command == "mocap" && numbers.size() == 3 && m->nmocap > 0) {
      std::copy_n(numbers.data(), 3, d->mocap_pos);
      mj_forward(m, d);
      (void)env.Observe({obs.data(), nullptr});
      std::printf("{\"obs\":%s}\n", Json(Floats(obs)).c_str());
    } else if (command == "step" && numbers.size() == size_t(m->nu)) {
      for (int i = 0; i < m->nu; ++i) action[i] = float(numbers[i]);
      auto step = env.Step(action, {obs.data(), nullptr});
      if (!step.ok()) {
        std::printf("{\"error\":\"%s\"}\n", std::string(step.status().message()).c_str());
        continue;
      }
      std::printf("{\"obs\":%s,\"reward\":%.17g,\"last\":%d,\"discount\":%g,\"qpos\":%s,\"qvel\":%s}\n",
                  Json(Floats(obs)).c_str(), double(step->reward), step->step_type == StepType::kLast,
                  double(step->discount), Json({d->qpos, d->qpos + m->nq}).c_str(),
                  Json({d->qvel, d->qvel + m->nv}).c_str());
    } else {
      std::printf("{\"error\":\"unknown command or wrong count: %s\"}\n", command.c_str());
    }
    std::fflush(stdout);
  }
  return 0;
}
