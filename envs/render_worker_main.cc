// troupe_render_worker MODEL_PATH MULTISAMPLE SHARED_FD SOCKET_FD
// Started by envs::RenderWorker (envs/render_worker.h), not by hand.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "envs/render_worker.h"

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: %s MODEL_PATH MULTISAMPLE SHARED_FD SOCKET_FD\n"
                 "(started by troupe's env pool to render in a process of its own; not run by hand)\n",
                 argv[0]);
    return 2;
  }
  return troupe::envs::RunRenderWorker(argv[1], std::string(argv[2]) == "1", std::atoi(argv[3]), std::atoi(argv[4]));
}
