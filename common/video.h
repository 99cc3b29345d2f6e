// Videos: RGB frames encoded to an MP4 file (H.264 through FFmpeg's
// libavcodec/libavformat; Debian's libavcodec has libx264), and an MP4 read
// back (tests, reports). Used for evaluation videos and `troupe view --record`.
// The FFmpeg code lives in libtroupe_video_ffmpeg.so, loaded on first use (see
// common/video_module.h): without it every call here is FailedPrecondition
// saying where it was looked for and how to turn videos off.
#ifndef TROUPE_COMMON_VIDEO_H_
#define TROUPE_COMMON_VIDEO_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/image.h"

namespace troupe {

struct VideoOptions {
  int width = 480;   // even (H.264's 4:2:0 chroma halves it)
  int height = 480;  // even
  double frame_seconds = 1.0 / 25;  // simulated seconds per frame (1 / frame rate)
  // The libavcodec encoder by name ("libx264", "libopenh264", "mpeg4");
  // "" = the first of those this FFmpeg has.
  std::string encoder;
  int threads = 1;  // encoder threads: videos are encoded beside training, not instead of it
};

// OK when videos can be made here (the module loads); the error otherwise.
absl::Status VideoAvailable();

// The encoder Mp4Writer::Open would use for `requested` ("" = the best one
// available). Errors: NotFound naming the encoder asked for, or, for "",
// saying that this FFmpeg has no H.264 or MPEG-4 encoder and what to install.
absl::StatusOr<std::string> FindVideoEncoder(const std::string& requested = "");

// Writes frames into an MP4 file. Not thread-safe: one thread feeds it.
class Mp4Writer {
 public:
  // Opens the encoder and `path` + ".partial"; Finish renames it to `path`,
  // so a reader never sees half a video. Errors: InvalidArgument for an odd
  // or non-positive size or frame_seconds <= 0; FindVideoEncoder's;
  // Internal with FFmpeg's message if the encoder or file cannot be opened.
  static absl::StatusOr<std::unique_ptr<Mp4Writer>> Open(const std::string& path, const VideoOptions& options);
  ~Mp4Writer();  // without Finish: the partial file is removed
  Mp4Writer(const Mp4Writer&) = delete;
  Mp4Writer& operator=(const Mp4Writer&) = delete;

  // Encodes one frame: width*height*3 bytes of RGB, rows top-down.
  // Errors: Internal with FFmpeg's message.
  absl::Status AddFrame(const uint8_t* rgb);
  // Flushes the encoder, writes the MP4 index and moves the file into place.
  // Errors: Internal with FFmpeg's message, or FailedPrecondition with no frames.
  absl::Status Finish();

  int64_t frames() const { return frames_; }
  const std::string& encoder() const { return encoder_; }

 private:
  struct Impl;
  Mp4Writer(std::unique_ptr<Impl> impl, std::string path, std::string encoder);
  std::unique_ptr<Impl> impl_;
  std::string path_;
  std::string encoder_;
  int64_t frames_ = 0;
  bool finished_ = false;
};

// What a video file holds, found by decoding every frame.
struct VideoInfo {
  int width = 0;
  int height = 0;
  int64_t frames = 0;  // decoded frames
  std::string codec;   // "h264", "mpeg4", ...
  double seconds = 0;  // the container's duration
};

// Errors: NotFound for a missing file; Internal with FFmpeg's message for one
// that is not a decodable video.
absl::StatusOr<VideoInfo> ReadVideoInfo(const std::string& path);

// `count` frames of the video at `path`, evenly spaced from its first frame
// to its last (all of them when it has fewer), as RGB images. Errors:
// ReadVideoInfo's; InvalidArgument for count < 1.
absl::StatusOr<std::vector<Image>> ReadVideoFrames(const std::string& path, int count);

}  // namespace troupe

#endif  // TROUPE_COMMON_VIDEO_H_
