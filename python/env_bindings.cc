// troupe._native.EnvPool: envs::EnvPool for Python. Results are numpy
// arrays that view the pool's batch buffers (no copy): in sync mode one
// buffer that every reset/step rewrites, in async mode a ring of them, each
// reused by a later recv. The arrays are read-only; their base is a
// PoolMemory object that keeps the pool (and so its buffers) alive while any
// array is, even after the pool object is closed or collected.
//
// The GIL is released while envs reset or step. A pool is used from one
// Python thread at a time (as envs::EnvPool from one C++ thread); a second
// thread that calls it meanwhile gets a RuntimeError instead of a data race.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "envs/env.h"
#include "envs/env_pool.h"
#include "python/bindings.h"
#include "python/status.h"

namespace troupe::python {
namespace py = pybind11;
namespace {

using FloatArray = py::array_t<float, py::array::c_style | py::array::forcecast>;
using IdArray = py::array_t<int32_t, py::array::c_style | py::array::forcecast>;

// The base of every array a pool returns: owns a reference to the pool.
struct PoolMemory {
  std::shared_ptr<envs::EnvPool> pool;
};

// What Python's `troupe.make` passes, as EnvPoolOptions. InvalidArgument for
// an observation other than "pixels" / "state", then the options' Validate().
absl::StatusOr<envs::EnvPoolOptions> MakeOptions(const std::string& task, int num_envs, const std::string& observation,
                                                 int action_repeat, int frame_stack, uint64_t seed, int batch_size,
                                                 int num_threads, int height, int width, const std::string& camera,
                                                 bool render_in_processes) {
  envs::EnvPoolOptions options;
  if (observation != "pixels" && observation != "state") {
    return absl::InvalidArgumentError(
        absl::StrCat("observation: '", observation, "' is neither 'pixels' nor 'state'"));
  }
  options.env.task = task;
  options.env.pixels = observation == "pixels";
  options.env.action_repeat = action_repeat;
  options.env.frame_stack = frame_stack;
  options.env.seed = seed;
  options.env.render.height = height;
  options.env.render.width = width;
  options.env.camera = camera;
  options.num_envs = num_envs;
  options.batch_size = batch_size;
  options.num_threads = num_threads;
  options.render_in_processes = render_in_processes;
  if (absl::Status valid = options.Validate(); !valid.ok()) return valid;
  return options;
}

// Checks an actions array against the spec before the pool sees it. A
// (rows, action_size) array goes to the pool as is (which checks rows and
// values, with its own messages), as does any array whose size is wrong
// (the pool names the size it expected); an array of the right size in
// another shape is refused here.
void CheckActionShape(const FloatArray& actions, size_t rows, int action_size, const std::string& task) {
  if (actions.ndim() == 2 && actions.shape(1) == action_size) return;
  if (size_t(actions.size()) != rows * action_size) return;
  std::vector<std::string> shape;
  for (py::ssize_t d = 0; d < actions.ndim(); ++d) shape.push_back(std::to_string(actions.shape(d)));
  ThrowInvalidArgument(absl::StrCat(task, ": actions of shape (", absl::StrJoin(shape, ", "), "); expected (", rows,
                                    ", ", action_size, ")"));
}

class Pool {
 public:
  explicit Pool(const envs::EnvPoolOptions& options) : pixels_(options.env.pixels) {
    absl::StatusOr<std::unique_ptr<envs::EnvPool>> pool;
    {
      py::gil_scoped_release release;
      pool = envs::EnvPool::Create(options);
    }
    std::shared_ptr<envs::EnvPool> shared = ValueOrThrow(std::move(pool));
    pool_ = shared.get();
    memory_ = py::cast(PoolMemory{std::move(shared)});
  }

  const envs::EnvSpec& spec() const { return Open().spec(); }
  int num_envs() const { return Open().num_envs(); }
  int batch_size() const { return Open().batch_size(); }
  int num_threads() const { return Open().num_threads(); }
  int64_t physics_errors() const { return Open().physics_errors(); }
  py::object memory() const { return memory_; }
  bool closed() const { return pool_ == nullptr; }

  py::tuple Reset() {
    return Run([&](envs::EnvPool& pool) { return pool.Reset(); });
  }

  py::tuple Step(const FloatArray& actions) {
    envs::EnvPool& pool = Open();
    CheckActionShape(actions, pool.num_envs(), pool.spec().action_size, pool.spec().task);
    const std::span<const float> values(actions.data(), actions.size());
    return Run([&](envs::EnvPool& p) { return p.Step(values); });
  }

  void Send(const FloatArray& actions, const IdArray& env_ids) {
    envs::EnvPool& pool = Open();
    CheckActionShape(actions, env_ids.size(), pool.spec().action_size, pool.spec().task);
    const std::span<const float> values(actions.data(), actions.size());
    const std::span<const int32_t> ids(env_ids.data(), env_ids.size());
    Call([&](envs::EnvPool& p) { return p.Send(values, ids); });
  }

  void SendReset(const IdArray& env_ids) {
    const std::span<const int32_t> ids(env_ids.data(), env_ids.size());
    Call([&](envs::EnvPool& p) { return p.SendReset(ids); });
  }

  py::tuple Recv() {
    return Run([&](envs::EnvPool& pool) { return pool.Recv(); });
  }

  // Drops this object's hold on the pool: the workers stop once no array
  // views its buffers any more. Idempotent.
  void Close() {
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) throw std::runtime_error("troupe pool: close() while another thread uses the pool");
    cache_.clear();
    memory_ = py::none();
    pool_ = nullptr;
  }

 private:
  envs::EnvPool& Open() const {
    if (pool_ == nullptr) throw std::runtime_error("troupe pool: used after close()");
    return *pool_;
  }

  // Runs `call` on the pool with the GIL released, one thread at a time.
  template <typename F>
  auto Locked(F&& call) {
    envs::EnvPool& pool = Open();
    std::unique_lock lock(mutex_, std::try_to_lock);
    if (!lock.owns_lock()) {
      throw std::runtime_error("troupe pool: called from two threads at once (use one pool per thread)");
    }
    py::gil_scoped_release release;
    return call(pool);
  }

  template <typename F>
  void Call(F&& call) {
    ThrowIfError(Locked(std::forward<F>(call)));
  }

  template <typename F>
  py::tuple Run(F&& call) {
    absl::StatusOr<envs::EnvBatch> batch = Locked(std::forward<F>(call));
    ThrowIfError(batch.status());
    return Arrays(*batch);
  }

  // (observation, reward, discount, step_type, env_id, state, episode_step)
  // viewing `batch`'s buffer; made once per buffer.
  py::tuple Arrays(const envs::EnvBatch& batch) {
    const void* key = batch.env_id.data();
    for (const auto& [buffer, arrays] : cache_) {
      if (buffer == key) return arrays;
    }
    const envs::EnvSpec& spec = pool_->spec();
    const py::ssize_t rows = batch.size;
    py::array state = View(batch.state.data(), {rows, py::ssize_t(spec.state_size)});
    py::array observation =
        pixels_ ? View(batch.pixels.data(), {rows, py::ssize_t(spec.height), py::ssize_t(spec.width),
                                             py::ssize_t(spec.channels)})
                : state;
    py::tuple arrays = py::make_tuple(observation, View(batch.reward.data(), {rows}), View(batch.discount.data(), {rows}),
                                      View(batch.step_type.data(), {rows}), View(batch.env_id.data(), {rows}), state,
                                      View(batch.episode_step.data(), {rows}));
    cache_.emplace_back(key, arrays);
    return arrays;
  }

  template <typename T>
  py::array View(const T* data, std::vector<py::ssize_t> shape) {
    py::array array(py::dtype::of<T>(), std::move(shape), {}, data, memory_);
    array.attr("setflags")(py::arg("write") = false);
    return array;
  }

  const bool pixels_;
  envs::EnvPool* pool_ = nullptr;  // owned by memory_'s PoolMemory; null after Close
  py::object memory_;
  std::mutex mutex_;
  std::vector<std::pair<const void*, py::tuple>> cache_;  // by the buffer's env_id pointer
};

py::dict SpecDict(const envs::EnvSpec& spec) {
  py::dict d;
  d["task"] = spec.task;
  py::list fields;
  for (const auto& field : spec.state_fields) fields.append(py::make_tuple(field.name, field.size));
  d["state_fields"] = fields;
  d["state_size"] = spec.state_size;
  d["height"] = spec.height;
  d["width"] = spec.width;
  d["channels"] = spec.channels;
  d["action_size"] = spec.action_size;
  d["action_minimum"] = py::array_t<float>(py::ssize_t(spec.action_minimum.size()), spec.action_minimum.data());
  d["action_maximum"] = py::array_t<float>(py::ssize_t(spec.action_maximum.size()), spec.action_maximum.data());
  d["episode_steps"] = spec.episode_steps;
  d["action_repeat"] = spec.action_repeat;
  return d;
}

// The C++ pool stepped from C++ for `seconds` with the same actions every
// batch (num_envs x action_size), after `warmup` batches: what a Python loop
// over the same pool is compared with. Returns {steps_per_second, batches,
// seconds}. The GIL is released throughout.
py::dict BenchPool(const envs::EnvPoolOptions& options, const FloatArray& actions, double seconds, int warmup) {
  std::vector<float> values(actions.data(), actions.data() + actions.size());
  absl::Status status;
  int64_t batches = 0;
  double elapsed = 0;
  {
    py::gil_scoped_release release;
    status = [&]() -> absl::Status {
      auto pool = envs::EnvPool::Create(options);
      if (!pool.ok()) return pool.status();
      if (auto reset = (*pool)->Reset(); !reset.ok()) return reset.status();
      for (int i = 0; i < warmup; ++i) {
        if (auto step = (*pool)->Step(values); !step.ok()) return step.status();
      }
      const auto start = std::chrono::steady_clock::now();
      do {
        for (int i = 0; i < 10; ++i) {
          if (auto step = (*pool)->Step(values); !step.ok()) return step.status();
        }
        batches += 10;
        elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      } while (elapsed < seconds);
      return absl::OkStatus();
    }();
  }
  ThrowIfError(status);
  py::dict result;
  result["steps_per_second"] = double(batches) * options.num_envs / elapsed;
  result["batches"] = batches;
  result["seconds"] = elapsed;
  return result;
}

}  // namespace

void BindEnvs(py::module_& module) {
  py::class_<PoolMemory>(module, "PoolMemory",
                         "The batch buffers of an env pool: the base of every array the pool returns.");

  py::class_<Pool>(module, "EnvPool")
      .def(py::init([](const std::string& task, int num_envs, const std::string& observation, int action_repeat,
                       int frame_stack, uint64_t seed, int batch_size, int num_threads, int height, int width,
                       const std::string& camera, bool render_in_processes) {
             return std::make_unique<Pool>(ValueOrThrow(MakeOptions(task, num_envs, observation, action_repeat,
                                                                    frame_stack, seed, batch_size, num_threads, height,
                                                                    width, camera, render_in_processes)));
           }),
           py::arg("task"), py::arg("num_envs"), py::arg("observation"), py::arg("action_repeat"),
           py::arg("frame_stack"), py::arg("seed"), py::arg("batch_size"), py::arg("num_threads"), py::arg("height"),
           py::arg("width"), py::arg("camera"), py::arg("render_in_processes"))
      .def("reset", &Pool::Reset)
      .def("step", &Pool::Step, py::arg("actions"))
      .def("send", &Pool::Send, py::arg("actions"), py::arg("env_ids"))
      .def("send_reset", &Pool::SendReset, py::arg("env_ids"))
      .def("recv", &Pool::Recv)
      .def("close", &Pool::Close)
      .def_property_readonly("closed", &Pool::closed)
      .def_property_readonly("spec", [](const Pool& pool) { return SpecDict(pool.spec()); })
      .def_property_readonly("num_envs", &Pool::num_envs)
      .def_property_readonly("batch_size", &Pool::batch_size)
      .def_property_readonly("num_threads", &Pool::num_threads)
      .def_property_readonly("physics_errors", &Pool::physics_errors)
      .def_property_readonly("memory", &Pool::memory);

  module.def("seed_for", &envs::EnvPool::SeedFor, py::arg("base"), py::arg("index"),
             "The seed of env `index` in a pool seeded with `base`.");

  module.def(
      "bench_cpp_pool",
      [](const std::string& task, int num_envs, const std::string& observation, int action_repeat, int frame_stack,
         int num_threads, const FloatArray& actions, double seconds, int warmup) {
        return BenchPool(ValueOrThrow(MakeOptions(task, num_envs, observation, action_repeat, frame_stack,
                                                  /*seed=*/0, /*batch_size=*/0, num_threads, /*height=*/84,
                                                  /*width=*/84, /*camera=*/"", /*render_in_processes=*/true)),
                         actions, seconds, warmup);
      },
      py::arg("task"), py::arg("num_envs"), py::arg("observation"), py::arg("action_repeat"), py::arg("frame_stack"),
      py::arg("num_threads"), py::arg("actions"), py::arg("seconds"), py::arg("warmup"),
      "Steps a C++ pool from C++ (bench/python_bench.py's reference).");
}

}  // namespace troupe::python
