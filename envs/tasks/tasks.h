// Each domain file (envs/tasks/<domain>.cc) lists its tasks; envs/registry.cc
// joins the lists. One MJCF model per domain in envs/assets/<domain>.xml.
#ifndef TROUPE_ENVS_TASKS_TASKS_H_
#define TROUPE_ENVS_TASKS_TASKS_H_

#include <vector>

#include "envs/task.h"

namespace troupe::envs {

std::vector<TaskInfo> CartpoleTasks();    // cartpole.balance, cartpole.swingup
std::vector<TaskInfo> PendulumTasks();    // pendulum.swingup
std::vector<TaskInfo> ReacherTasks();     // reacher.easy
std::vector<TaskInfo> FingerTasks();      // finger.spin
std::vector<TaskInfo> CheetahTasks();     // cheetah.run
std::vector<TaskInfo> WalkerTasks();      // walker.walk
std::vector<TaskInfo> BallInCupTasks();   // ball_in_cup.catch

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_TASKS_TASKS_H_
