// The interface between common/video.cc and libtroupe_video_ffmpeg.so, the module
// that holds troupe's FFmpeg code (common/video_ffmpeg.cc). troupe loads the
// module with dlopen when it first needs a video, so that no troupe binary
// links FFmpeg's libraries: a relocated copy of troupe (tools/bundle.sh)
// runs without them and says so when asked for a video. Internal to
// common/: users include common/video.h.
#ifndef TROUPE_COMMON_VIDEO_MODULE_H_
#define TROUPE_COMMON_VIDEO_MODULE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/video.h"

namespace troupe::video_module {

// One open MP4 file being encoded (the module's side of Mp4Writer).
class Encoder {
 public:
  virtual ~Encoder() = default;
  // width*height*3 bytes of RGB, rows top-down.
  virtual absl::Status AddFrame(const uint8_t* rgb) = 0;
  // Flushes the encoder, writes the index and closes the file.
  virtual absl::Status Finish() = 0;
};

// Bumped whenever this table or the types it passes change; the loader
// refuses a module built against another version.
inline constexpr int kVersion = 2;

// Decoded frames, RGB, rows top-down.
struct Frames {
  int width = 0;
  int height = 0;
  std::vector<std::vector<uint8_t>> rgb;
};

struct Api {
  int version = kVersion;
  // FindVideoEncoder of common/video.h.
  absl::StatusOr<std::string> (*find_encoder)(const std::string& requested);
  // Opens `encoder` (a name find_encoder returned) writing to `file`;
  // `name` is the path messages call it by. Sizes are already checked.
  absl::StatusOr<std::unique_ptr<Encoder>> (*open)(const std::string& file, const std::string& name,
                                                   const VideoOptions& options, const std::string& encoder);
  // ReadVideoInfo of common/video.h, for an existing file.
  absl::StatusOr<VideoInfo> (*read_info)(const std::string& path);
  // The frames at `indices` (ascending) of an existing file. Errors:
  // OutOfRange for an index past its last frame.
  absl::StatusOr<Frames> (*read_frames)(const std::string& path, const std::vector<int64_t>& indices);
};

}  // namespace troupe::video_module

// The one symbol the module exports.
extern "C" const troupe::video_module::Api* TroupeVideoModule();

#endif  // TROUPE_COMMON_VIDEO_MODULE_H_
