// Mp4Writer and ReadVideoInfo over libtroupe_video_ffmpeg.so (common/video_ffmpeg.cc),
// loaded with dlopen the first time a video is asked for; see
// common/video_module.h for why.
#include "common/video.h"

#include <dlfcn.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/video_module.h"

namespace troupe {
namespace {

constexpr char kModuleName[] = "libtroupe_video_ffmpeg.so";

// Where the module may be: $TROUPE_VIDEO_MODULE alone when set; otherwise
// beside the running program or in its ../lib, then where this build tree
// puts it.
std::vector<std::string> ModuleCandidates() {
  if (const char* path = std::getenv("TROUPE_VIDEO_MODULE"); path != nullptr && *path != '\0') return {path};
  std::vector<std::string> candidates;
  std::error_code error;
  const std::filesystem::path program = std::filesystem::read_symlink("/proc/self/exe", error);
  if (!error) {
    candidates.push_back((program.parent_path() / kModuleName).string());
    candidates.push_back((program.parent_path().parent_path() / "lib" / kModuleName).string());
  }
#ifdef TROUPE_VIDEO_MODULE_BUILD_PATH
  candidates.push_back(TROUPE_VIDEO_MODULE_BUILD_PATH);
#endif
  return candidates;
}

absl::StatusOr<const video_module::Api*> LoadModule() {
  const std::vector<std::string> candidates = ModuleCandidates();
  for (const std::string& path : candidates) {
    if (!std::filesystem::exists(path)) continue;
    // Found: a failure from here on is this module's, and says why.
    void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          "videos: cannot load ", path, ": ", dlerror(),
          " (FFmpeg's libraries missing? tools/install_deps.sh installs them), or turn videos off with "
          "evaluator.record_video: false"));
    }
    using Entry = const video_module::Api* (*)();
    auto entry = reinterpret_cast<Entry>(dlsym(handle, "TroupeVideoModule"));
    const video_module::Api* api = entry != nullptr ? entry() : nullptr;
    if (api == nullptr || api->version != video_module::kVersion) {
      return absl::FailedPreconditionError(
          absl::StrCat("videos: ", path, " is not a libtroupe_video_ffmpeg.so of this troupe (no TroupeVideoModule of ",
                       "version ", video_module::kVersion, ")"));
    }
    return api;  // never unloaded: encoders may outlive any one caller
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "videos need ", kModuleName, " (troupe's FFmpeg encoder), which this troupe does not have (looked at ",
      absl::StrJoin(candidates, ", "),
      "); a build with FFmpeg makes it (tools/install_deps.sh), TROUPE_VIDEO_MODULE names it, "
      "or turn videos off with evaluator.record_video: false"));
}

absl::StatusOr<const video_module::Api*> Module() {
  static const absl::StatusOr<const video_module::Api*> module = LoadModule();
  return module;
}

}  // namespace

absl::Status VideoAvailable() { return Module().status(); }

absl::StatusOr<std::string> FindVideoEncoder(const std::string& requested) {
  auto module = Module();
  if (!module.ok()) return module.status();
  return (*module)->find_encoder(requested);
}

struct Mp4Writer::Impl {
  std::unique_ptr<video_module::Encoder> encoder;
  std::string partial;
};

Mp4Writer::Mp4Writer(std::unique_ptr<Impl> impl, std::string path, std::string encoder)
    : impl_(std::move(impl)), path_(std::move(path)), encoder_(std::move(encoder)) {}

Mp4Writer::~Mp4Writer() {
  if (finished_) return;
  const std::string partial = impl_->partial;
  impl_.reset();  // closes the file
  std::error_code ignored;
  std::filesystem::remove(partial, ignored);
}

absl::StatusOr<std::unique_ptr<Mp4Writer>> Mp4Writer::Open(const std::string& path, const VideoOptions& options) {
  if (options.width < 2 || options.height < 2 || options.width % 2 || options.height % 2) {
    return absl::InvalidArgumentError(absl::StrCat("video size ", options.width, "x", options.height, " for ", path,
                                                   ": width and height must be even and >= 2"));
  }
  if (!(options.frame_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("video frame_seconds ", options.frame_seconds, " for ", path, ": must be > 0"));
  }
  auto module = Module();
  if (!module.ok()) return module.status();
  auto encoder_name = (*module)->find_encoder(options.encoder);
  if (!encoder_name.ok()) return encoder_name.status();
  auto impl = std::make_unique<Impl>();
  impl->partial = path + ".partial";
  auto encoder = (*module)->open(impl->partial, path, options, *encoder_name);
  if (!encoder.ok()) {
    std::error_code ignored;
    std::filesystem::remove(impl->partial, ignored);
    return encoder.status();
  }
  impl->encoder = std::move(*encoder);
  return std::unique_ptr<Mp4Writer>(new Mp4Writer(std::move(impl), path, *encoder_name));
}

absl::Status Mp4Writer::AddFrame(const uint8_t* rgb) {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat("video ", path_, ": already finished"));
  if (absl::Status s = impl_->encoder->AddFrame(rgb); !s.ok()) return s;
  ++frames_;
  return absl::OkStatus();
}

absl::Status Mp4Writer::Finish() {
  if (finished_) return absl::OkStatus();
  if (frames_ == 0) return absl::FailedPreconditionError(absl::StrCat("video ", path_, ": no frames"));
  // Flush the encoder, write the index, close and move into place.
  if (absl::Status s = impl_->encoder->Finish(); !s.ok()) return s;
  std::error_code error;
  std::filesystem::rename(impl_->partial, path_, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("video: cannot move ", impl_->partial, " to ", path_, ": ", error.message()));
  }
  finished_ = true;
  return absl::OkStatus();
}

absl::StatusOr<VideoInfo> ReadVideoInfo(const std::string& path) {
  if (!std::filesystem::exists(path)) return absl::NotFoundError(absl::StrCat("video ", path, ": no such file"));
  auto module = Module();
  if (!module.ok()) return module.status();
  return (*module)->read_info(path);
}

absl::StatusOr<std::vector<Image>> ReadVideoFrames(const std::string& path, int count) {
  if (count < 1) return absl::InvalidArgumentError(absl::StrCat("video ", path, ": ", count, " frames asked for"));
  auto info = ReadVideoInfo(path);
  if (!info.ok()) return info.status();
  if (info->frames == 0) return std::vector<Image>{};
  // Evenly spaced, the first and the last included.
  std::vector<int64_t> indices;
  const int64_t n = std::min<int64_t>(count, info->frames);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t index = n == 1 ? 0 : i * (info->frames - 1) / (n - 1);
    if (indices.empty() || indices.back() != index) indices.push_back(index);
  }
  auto frames = (*Module())->read_frames(path, indices);
  if (!frames.ok()) return frames.status();
  std::vector<Image> images;
  for (std::vector<uint8_t>& rgb : frames->rgb) {
    Image& image = images.emplace_back();
    image.width = frames->width;
    image.height = frames->height;
    image.channels = 3;
    image.pixels = std::move(rgb);
  }
  return images;
}

}  // namespace troupe
