#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "envs/task.h"
#include "envs/tasks/tasks.h"

namespace troupe::envs {

const std::vector<TaskInfo>& Tasks() {
  static const std::vector<TaskInfo> tasks = [] {
    std::vector<TaskInfo> all;
    for (auto domain : {CartpoleTasks, PendulumTasks, ReacherTasks, FingerTasks, CheetahTasks, WalkerTasks,
                        BallInCupTasks}) {
      for (auto& info : domain()) all.push_back(std::move(info));
    }
    return all;
  }();
  return tasks;
}

absl::StatusOr<const TaskInfo*> FindTask(std::string_view name) {
  for (const auto& info : Tasks()) {
    if (info.name == name) return &info;
  }
  std::vector<std::string> names;
  for (const auto& info : Tasks()) names.push_back(info.name);
  return absl::NotFoundError(absl::StrCat("unknown task '", std::string(name), "'; known tasks: ", absl::StrJoin(names, ", ")));
}

std::string AssetsDir() {
  if (const char* dir = std::getenv("TROUPE_ASSETS_DIR"); dir && *dir) return dir;
  return ProjectPath("envs/assets");
}

}  // namespace troupe::envs
