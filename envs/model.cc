#include "envs/model.h"

#include <atomic>
#include <filesystem>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace troupe::envs {
namespace {

void ThrowMujocoError(const char* message) { throw MujocoError(message); }
void QuietMujocoWarning(const char*) {}

}  // namespace

void InstallMujocoErrorHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    mju_user_error = ThrowMujocoError;
    mju_user_warning = QuietMujocoWarning;
  });
}

Model::~Model() { mj_deleteModel(model_); }

absl::StatusOr<std::shared_ptr<const Model>> Model::Load(const std::string& path, bool multisample) {
  InstallMujocoErrorHandlers();
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) {
    return absl::NotFoundError(absl::StrCat("MJCF model file not found: ", path));
  }
  // MuJoCo's parser writes "XML Error: ... Element 'x', line N" here.
  char error[1024] = "";
  mjModel* model = nullptr;
  try {
    model = mj_loadXML(path.c_str(), nullptr, error, sizeof(error));
  } catch (const MujocoError& e) {
    return absl::InvalidArgumentError(absl::StrCat("cannot load MJCF model ", path, ": ", e.what()));
  }
  if (!model) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot load MJCF model ", path, ": ", absl::StripAsciiWhitespace(error)));
  }
  model->vis.quality.offsamples = multisample ? 4 : 0;
  static std::atomic<uint64_t> next_id{1};
  return std::shared_ptr<const Model>(new Model(model, path, next_id++));
}

}  // namespace troupe::envs
