// The parts of the `troupe._native` extension module, each bound by one
// function (python/module.cc calls them in order).
#ifndef TROUPE_PYTHON_BINDINGS_H_
#define TROUPE_PYTHON_BINDINGS_H_

#include <pybind11/pybind11.h>

namespace troupe::python {

// EnvPool as troupe._native.EnvPool (python/env_bindings.cc).
void BindEnvs(pybind11::module_& module);
// The replay client (gRPC) and an embedded server (python/replay_bindings.cc).
void BindReplay(pybind11::module_& module);
// Run directories and the run's agent's policy of a checkpoint (python/run_bindings.cc).
void BindRuns(pybind11::module_& module);

}  // namespace troupe::python

#endif  // TROUPE_PYTHON_BINDINGS_H_
