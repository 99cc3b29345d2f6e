// troupe._native's run half: a run directory's config and checkpoints
// (viz::OpenRunDirectory, the reader `troupe view` uses) and the run's
// agent's inference policy of a checkpoint (agents::CreatePolicy, what
// actors and the evaluator run). The CSV and JSONL files are read in Python
// (python/troupe/runs.py), by the names and columns of python/troupe/layout.py,
// which run_files() and run_columns() (common/run_layout.h's) let a test
// check.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "agents/policies.h"
#include "common/run_layout.h"
#include "envs/env.h"
#include "python/bindings.h"
#include "python/status.h"
#include "viz/run_directory.h"

namespace troupe::python {
namespace py = pybind11;
namespace {

std::string ToJson(const google::protobuf::Message& message) {
  std::string json;
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  options.always_print_primitive_fields = true;
  (void)google::protobuf::util::MessageToJsonString(message, &json, options);
  return json;
}

class Policy {
 public:
  // The policy of `checkpoint` (empty: the run's newest) for the agent of
  // the run at `run_dir`.
  Policy(const std::string& run_dir, const std::string& checkpoint, int num_threads) {
    absl::StatusOr<std::unique_ptr<agents::Policy>> made;
    absl::StatusOr<int64_t> updates;
    {
      py::gil_scoped_release release;
      updates = [&]() -> absl::StatusOr<int64_t> {
        absl::StatusOr<viz::RunDirectory> run = viz::OpenRunDirectory(run_dir);
        if (!run.ok()) return run.status();
        absl::StatusOr<std::string> path = viz::ChooseCheckpoint(*run, checkpoint);
        if (!path.ok()) return path.status();
        path_ = *path;
        absl::StatusOr<envs::EnvSpec> env = envs::DescribeEnv(run->config.env());
        if (!env.ok()) return env.status();
        env_ = *env;
        made = agents::CreatePolicy(run->config, agents::ObservationSpecOf(env_), env_.action_size, num_threads);
        if (!made.ok()) return made.status();
        return (*made)->LoadAgentCheckpoint(path_);
      }();
    }
    updates_ = ValueOrThrow(std::move(updates));
    policy_ = *std::move(made);
  }

  // Deterministic actions float32 [B, A] for observations in the env's
  // layout: state float32 [B, S], or pixels uint8 [B, H, W, 3k].
  py::array_t<float> Act(const py::array& observation) {
    const agents::ObservationSpec& spec = policy_->spec();
    const int A = policy_->action_size();
    absl::Status status;
    py::array_t<float> actions;
    if (!spec.pixels()) {
      auto state = py::array_t<float, py::array::c_style | py::array::forcecast>::ensure(observation);
      if (!state || state.ndim() != 2 || state.shape(1) != spec.state_size || state.shape(0) < 1) {
        ThrowInvalidArgument(absl::StrCat("policy: observations are float32 [batch, ", spec.state_size, "]; got ",
                                          Describe(observation)));
      }
      const int batch = int(state.shape(0));
      actions = py::array_t<float>({py::ssize_t(batch), py::ssize_t(A)});
      float* out = actions.mutable_data();
      py::gil_scoped_release release;
      status = policy_->Act(state.data(), nullptr, batch, out);
    } else {
      const int k = spec.frames;
      if (!py::isinstance<py::array_t<uint8_t>>(observation) || observation.ndim() != 4 ||
          observation.shape(1) != spec.height || observation.shape(2) != spec.width ||
          observation.shape(3) != 3 * k || observation.shape(0) < 1) {
        ThrowInvalidArgument(absl::StrCat("policy: observations are uint8 [batch, ", spec.height, ", ", spec.width,
                                          ", ", 3 * k, "]; got ", Describe(observation)));
      }
      auto pixels = py::array_t<uint8_t, py::array::c_style>::ensure(observation);
      const int batch = int(pixels.shape(0));
      actions = py::array_t<float>({py::ssize_t(batch), py::ssize_t(A)});
      float* out = actions.mutable_data();
      py::gil_scoped_release release;
      // The env's [H, W, 3k] (frames oldest first along channels) to the
      // policy's [k, H, W, 3], as the evaluator and viewer do.
      const size_t hw = size_t(spec.height) * spec.width;
      stacked_.resize(size_t(batch) * hw * 3 * k);
      for (int b = 0; b < batch; ++b) {
        const uint8_t* in = pixels.data() + size_t(b) * hw * 3 * k;
        for (int f = 0; f < k; ++f) {
          uint8_t* to = stacked_.data() + (size_t(b) * k + f) * hw * 3;
          for (size_t i = 0; i < hw; ++i) std::copy_n(in + i * 3 * k + 3 * f, 3, to + 3 * i);
        }
      }
      status = policy_->Act(nullptr, stacked_.data(), batch, out);
    }
    ThrowIfError(status);
    return actions;
  }

  const std::string& path() const { return path_; }
  int64_t updates() const { return updates_; }
  bool pixels() const { return policy_->spec().pixels(); }
  int action_size() const { return policy_->action_size(); }
  const envs::EnvSpec& env() const { return env_; }
  std::vector<float> parameters() const { return policy_->DownloadParameters(); }

 private:
  static std::string Describe(const py::array& array) {
    std::string shape;
    for (py::ssize_t d = 0; d < array.ndim(); ++d) absl::StrAppend(&shape, d ? ", " : "", array.shape(d));
    return absl::StrCat(array.dtype().attr("name").cast<std::string>(), " [", shape, "]");
  }

  std::unique_ptr<agents::Policy> policy_;
  envs::EnvSpec env_;
  std::string path_;
  int64_t updates_ = 0;
  std::vector<uint8_t> stacked_;
};

}  // namespace

void BindRuns(py::module_& module) {
  module.def("run_files", &RunFileNames, "[(key, name)] of a run directory's files (common/run_layout.h).");
  module.def(
      "run_columns",
      [] {
        // (mode, CSV file, its columns) of each run log.
        std::vector<std::tuple<std::string, std::string, std::vector<std::string>>> logs;
        auto add = [&](const char* mode, const LogSchema& schema) {
          logs.emplace_back(mode, schema.csv_file, schema.CsvColumns());
        };
        add("RL", RlMetricsRow::Schema());
        add("RL", RlEvalRow::Schema());
        add("GAN", GanMetricsRow::Schema());
        add("GAN", GanEvalRow::Schema());
        add("SCRIPTED", EpisodeRow::Schema());
        return logs;
      },
      "[(mode, CSV file name, [columns])] of each run log (common/run_layout.h).");
  module.def(
      "open_run",
      [](const std::string& path) {
        absl::StatusOr<viz::RunDirectory> run;
        {
          py::gil_scoped_release release;
          run = viz::OpenRunDirectory(path);
        }
        ThrowIfError(run.status());
        return py::make_tuple(ToJson(run->config), run->checkpoints);
      },
      py::arg("path"), "(config as JSON, checkpoints oldest first) of a run directory.");

  py::class_<Policy>(module, "Policy")
      .def(py::init<const std::string&, const std::string&, int>(), py::arg("run_dir"), py::arg("checkpoint"),
           py::arg("num_threads"))
      .def("act", &Policy::Act, py::arg("observation"))
      .def_property_readonly("path", &Policy::path)
      .def_property_readonly("updates", &Policy::updates)
      .def_property_readonly("pixels", &Policy::pixels)
      .def_property_readonly("action_size", &Policy::action_size)
      .def_property_readonly("task", [](const Policy& p) { return p.env().task; })
      .def("parameters", &Policy::parameters);
}

}  // namespace troupe::python
