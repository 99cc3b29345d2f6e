// troupe._native: the C++ half of the `troupe` Python package (python/troupe/
// holds the Python half, which is what users import).
#include <pybind11/pybind11.h>

#include "python/bindings.h"
#include "python/status.h"

PYBIND11_MODULE(_native, module) {
  module.doc() = "troupe's C++ core: env pools, the replay client, run directories and policies";
  troupe::python::BindErrors(module);
  troupe::python::BindEnvs(module);
  troupe::python::BindReplay(module);
  troupe::python::BindRuns(module);
}
