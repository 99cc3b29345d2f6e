// troupe_env_worker SHARED_FD SOCKET_FD
// Started by envs::EnvWorker (envs/env_worker.h), not by hand.
#include <cstdio>
#include <cstdlib>

#include "envs/env_worker.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr,
                 "usage: %s SHARED_FD SOCKET_FD\n"
                 "(started by troupe's env pool to step envs in a process of its own; not run by hand)\n",
                 argv[0]);
    return 2;
  }
  return troupe::envs::RunEnvWorker(std::atoi(argv[1]), std::atoi(argv[2]));
}
