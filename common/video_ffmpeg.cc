// libtroupe_video_ffmpeg.so: troupe's FFmpeg code, loaded by common/video.cc with
// dlopen (see common/video_module.h). H.264 through Debian's libavcodec
// (libx264), MPEG-4 part 2 where no H.264 encoder is.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/video_module.h"

extern "C" {
#include <libavcodec/avcodec.h>
#include <libavformat/avformat.h>
#include <libavutil/imgutils.h>
#include <libavutil/opt.h>
#include <libswscale/swscale.h>
}

namespace troupe {
namespace {

std::string AvError(int code) {
  char text[AV_ERROR_MAX_STRING_SIZE] = {};
  av_strerror(code, text, sizeof(text));
  return text;
}

// H.264 first (libx264 is in Debian's libavcodec; OpenH264 in some builds),
// MPEG-4 part 2 where neither is.
constexpr const char* kPreferredEncoders[] = {"libx264", "libopenh264", "h264_vaapi", "mpeg4"};

absl::StatusOr<std::string> FindEncoder(const std::string& requested) {
  av_log_set_level(AV_LOG_ERROR);  // the encoder's banner and statistics are noise in a run's log
  if (!requested.empty()) {
    const AVCodec* codec = avcodec_find_encoder_by_name(requested.c_str());
    if (codec == nullptr || !av_codec_is_encoder(codec)) {
      return absl::NotFoundError(absl::StrCat("video encoder \"", requested, "\" is not in this FFmpeg (libavcodec ",
                                              LIBAVCODEC_IDENT, "); try libx264, libopenh264 or mpeg4"));
    }
    return std::string(codec->name);
  }
  for (const char* name : kPreferredEncoders) {
    if (std::string(name) == "h264_vaapi") continue;  // needs a device; listed for the record only
    if (avcodec_find_encoder_by_name(name) != nullptr) return std::string(name);
  }
  return absl::NotFoundError(absl::StrCat(
      "this FFmpeg (libavcodec ", LIBAVCODEC_IDENT,
      ") has no H.264 or MPEG-4 encoder (libx264, libopenh264, mpeg4): install Debian's libavcodec59 "
      "(or libavcodec-extra59), or turn videos off with evaluator.record_video: false"));
}

// An MP4 file being encoded: the muxer, the encoder, one YUV frame reused
// and the RGB->YUV converter.
class FfmpegEncoder : public video_module::Encoder {
 public:
  static absl::StatusOr<std::unique_ptr<video_module::Encoder>> Open(const std::string& file, const std::string& name,
                                                                     const VideoOptions& options,
                                                                     const std::string& encoder_name);
  ~FfmpegEncoder() override {
    if (scale_) sws_freeContext(scale_);
    if (packet_) av_packet_free(&packet_);
    if (frame_) av_frame_free(&frame_);
    if (codec_) avcodec_free_context(&codec_);
    if (format_) {
      if (format_->pb) avio_closep(&format_->pb);
      avformat_free_context(format_);
    }
  }

  absl::Status AddFrame(const uint8_t* rgb) override {
    int rc = av_frame_make_writable(frame_);
    if (rc < 0) return absl::InternalError(absl::StrCat("video ", name_, ": frame not writable: ", AvError(rc)));
    const uint8_t* source[1] = {rgb};
    const int source_stride[1] = {3 * width_};
    sws_scale(scale_, source, source_stride, 0, height_, frame_->data, frame_->linesize);
    frame_->pts = frames_;
    rc = avcodec_send_frame(codec_, frame_);
    if (rc < 0) return absl::InternalError(absl::StrCat("video ", name_, ": encoder refused a frame: ", AvError(rc)));
    ++frames_;
    return Drain();
  }

  absl::Status Finish() override {
    int rc = avcodec_send_frame(codec_, nullptr);
    if (rc < 0) return absl::InternalError(absl::StrCat("video ", name_, ": flush failed: ", AvError(rc)));
    if (absl::Status s = Drain(); !s.ok()) return s;
    rc = av_write_trailer(format_);
    if (rc < 0) return absl::InternalError(absl::StrCat("video ", name_, ": cannot write the index: ", AvError(rc)));
    avio_closep(&format_->pb);
    return absl::OkStatus();
  }

 private:
  explicit FfmpegEncoder(std::string name) : name_(std::move(name)) {}

  // Every packet the encoder has ready goes to the file.
  absl::Status Drain() {
    for (;;) {
      const int rc = avcodec_receive_packet(codec_, packet_);
      if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return absl::OkStatus();
      if (rc < 0) return absl::InternalError(absl::StrCat("video ", name_, ": encoding failed: ", AvError(rc)));
      if (packet_->duration <= 0) packet_->duration = 1;  // one frame, so the last one is shown too
      av_packet_rescale_ts(packet_, codec_->time_base, stream_->time_base);
      packet_->stream_index = stream_->index;
      const int written = av_interleaved_write_frame(format_, packet_);
      if (written < 0) return absl::InternalError(absl::StrCat("video ", name_, ": write failed: ", AvError(written)));
    }
  }

  std::string name_;
  AVFormatContext* format_ = nullptr;
  AVCodecContext* codec_ = nullptr;
  AVStream* stream_ = nullptr;
  AVFrame* frame_ = nullptr;
  AVPacket* packet_ = nullptr;
  SwsContext* scale_ = nullptr;
  int width_ = 0;
  int height_ = 0;
  int64_t frames_ = 0;
};

absl::StatusOr<std::unique_ptr<video_module::Encoder>> FfmpegEncoder::Open(const std::string& file,
                                                                           const std::string& name,
                                                                           const VideoOptions& options,
                                                                           const std::string& encoder_name) {
  const AVCodec* encoder = avcodec_find_encoder_by_name(encoder_name.c_str());
  if (encoder == nullptr) return absl::NotFoundError(absl::StrCat("video encoder \"", encoder_name, "\" vanished"));
  std::unique_ptr<FfmpegEncoder> self(new FfmpegEncoder(name));
  self->width_ = options.width;
  self->height_ = options.height;
  auto fail = [&](const std::string& what, int code) {
    return absl::InternalError(absl::StrCat("video ", name, ": ", what, ": ", AvError(code)));
  };

  // The container (MP4 whatever the file is called) and its one stream.
  int rc = avformat_alloc_output_context2(&self->format_, nullptr, "mp4", file.c_str());
  if (rc < 0 || self->format_ == nullptr) return fail("cannot make an MP4 muxer", rc);
  self->stream_ = avformat_new_stream(self->format_, nullptr);
  if (self->stream_ == nullptr) return absl::InternalError(absl::StrCat("video ", name, ": cannot add a stream"));

  // The encoder: frame rate from the simulated time per frame, 4:2:0.
  AVCodecContext* codec = self->codec_ = avcodec_alloc_context3(encoder);
  if (codec == nullptr) return absl::InternalError(absl::StrCat("video ", name, ": cannot allocate encoder"));
  const AVRational frame_duration = av_d2q(options.frame_seconds, 100000);
  codec->width = options.width;
  codec->height = options.height;
  codec->time_base = frame_duration;
  codec->framerate = av_inv_q(frame_duration);
  codec->pix_fmt = AV_PIX_FMT_YUV420P;
  codec->gop_size = 50;
  // No B-frames: every packet's timestamp is its frame's, so the MP4 holds
  // exactly the frames given (with B-frames the MP4 edit list hides one).
  codec->max_b_frames = 0;
  codec->thread_count = std::max(1, options.threads);
  if (encoder_name == "mpeg4") codec->bit_rate = int64_t(options.width) * options.height * 8;
  if (self->format_->oformat->flags & AVFMT_GLOBALHEADER) codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  AVDictionary* codec_options = nullptr;
  if (encoder_name == "libx264") {
    av_dict_set(&codec_options, "preset", "veryfast", 0);
    av_dict_set(&codec_options, "crf", "23", 0);
  }
  rc = avcodec_open2(codec, encoder, &codec_options);
  av_dict_free(&codec_options);
  if (rc < 0) return fail(absl::StrCat("cannot open encoder ", encoder_name), rc);
  rc = avcodec_parameters_from_context(self->stream_->codecpar, codec);
  if (rc < 0) return fail("cannot copy encoder parameters", rc);
  self->stream_->time_base = codec->time_base;

  // Frames: one YUV frame reused, RGB converted into it.
  self->frame_ = av_frame_alloc();
  self->packet_ = av_packet_alloc();
  if (!self->frame_ || !self->packet_) return absl::InternalError(absl::StrCat("video ", name, ": out of memory"));
  self->frame_->format = AV_PIX_FMT_YUV420P;
  self->frame_->width = options.width;
  self->frame_->height = options.height;
  rc = av_frame_get_buffer(self->frame_, 0);
  if (rc < 0) return fail("cannot allocate a frame", rc);
  self->scale_ = sws_getContext(options.width, options.height, AV_PIX_FMT_RGB24, options.width, options.height,
                                AV_PIX_FMT_YUV420P, SWS_BILINEAR, nullptr, nullptr, nullptr);
  if (self->scale_ == nullptr) return absl::InternalError(absl::StrCat("video ", name, ": cannot make a converter"));

  // The file.
  rc = avio_open(&self->format_->pb, file.c_str(), AVIO_FLAG_WRITE);
  if (rc < 0) return fail(absl::StrCat("cannot open ", file, " for writing"), rc);
  rc = avformat_write_header(self->format_, nullptr);
  if (rc < 0) return fail("cannot write the MP4 header", rc);
  return std::unique_ptr<video_module::Encoder>(std::move(self));
}

// Decodes every frame of the video at `path`, calling on_frame(frame, index)
// for each in order; the VideoInfo of what it decoded.
absl::StatusOr<VideoInfo> Decode(const std::string& path,
                                 const std::function<absl::Status(const AVFrame&, int64_t)>& on_frame) {
  AVFormatContext* format = nullptr;
  int rc = avformat_open_input(&format, path.c_str(), nullptr, nullptr);
  if (rc < 0) return absl::InternalError(absl::StrCat("video ", path, ": cannot open: ", AvError(rc)));
  struct Closer {
    AVFormatContext** format;
    AVCodecContext* codec = nullptr;
    AVPacket* packet = nullptr;
    AVFrame* frame = nullptr;
    ~Closer() {
      av_frame_free(&frame);
      av_packet_free(&packet);
      avcodec_free_context(&codec);
      avformat_close_input(format);
    }
  } closer{&format};
  rc = avformat_find_stream_info(format, nullptr);
  if (rc < 0) return absl::InternalError(absl::StrCat("video ", path, ": no stream info: ", AvError(rc)));
  const AVCodec* decoder = nullptr;
  const int stream = av_find_best_stream(format, AVMEDIA_TYPE_VIDEO, -1, -1, &decoder, 0);
  if (stream < 0 || decoder == nullptr) {
    return absl::InternalError(absl::StrCat("video ", path, ": no decodable video stream: ", AvError(stream)));
  }
  closer.codec = avcodec_alloc_context3(decoder);
  avcodec_parameters_to_context(closer.codec, format->streams[stream]->codecpar);
  rc = avcodec_open2(closer.codec, decoder, nullptr);
  if (rc < 0) return absl::InternalError(absl::StrCat("video ", path, ": cannot open decoder: ", AvError(rc)));
  closer.packet = av_packet_alloc();
  closer.frame = av_frame_alloc();

  VideoInfo info;
  info.codec = decoder->name;
  info.seconds = format->duration > 0 ? double(format->duration) / AV_TIME_BASE : 0;
  auto receive = [&]() -> absl::Status {
    for (;;) {
      const int got = avcodec_receive_frame(closer.codec, closer.frame);
      if (got == AVERROR(EAGAIN) || got == AVERROR_EOF) return absl::OkStatus();
      if (got < 0) return absl::InternalError(absl::StrCat("video ", path, ": decoding failed: ", AvError(got)));
      info.width = closer.frame->width;
      info.height = closer.frame->height;
      if (absl::Status s = on_frame(*closer.frame, info.frames); !s.ok()) return s;
      ++info.frames;
    }
  };
  // Decode every packet of the stream, then flush the decoder.
  while (av_read_frame(format, closer.packet) >= 0) {
    if (closer.packet->stream_index == stream) {
      rc = avcodec_send_packet(closer.codec, closer.packet);
      av_packet_unref(closer.packet);
      if (rc < 0) return absl::InternalError(absl::StrCat("video ", path, ": bad packet: ", AvError(rc)));
      if (absl::Status s = receive(); !s.ok()) return s;
    } else {
      av_packet_unref(closer.packet);
    }
  }
  avcodec_send_packet(closer.codec, nullptr);
  if (absl::Status s = receive(); !s.ok()) return s;
  return info;
}

absl::StatusOr<VideoInfo> ReadInfo(const std::string& path) {
  return Decode(path, [](const AVFrame&, int64_t) { return absl::OkStatus(); });
}

// The frames at `indices` (ascending) as RGB, converted from the decoder's format.
absl::StatusOr<video_module::Frames> ReadFrames(const std::string& path, const std::vector<int64_t>& indices) {
  video_module::Frames frames;
  SwsContext* scale = nullptr;
  size_t next = 0;
  auto decoded = Decode(path, [&](const AVFrame& frame, int64_t index) -> absl::Status {
    if (next >= indices.size() || indices[next] != index) return absl::OkStatus();
    ++next;
    frames.width = frame.width;
    frames.height = frame.height;
    scale = sws_getCachedContext(scale, frame.width, frame.height, static_cast<AVPixelFormat>(frame.format),
                                 frame.width, frame.height, AV_PIX_FMT_RGB24, SWS_BILINEAR, nullptr, nullptr, nullptr);
    if (scale == nullptr) return absl::InternalError(absl::StrCat("video ", path, ": cannot make a converter"));
    std::vector<uint8_t>& rgb = frames.rgb.emplace_back(size_t(frame.width) * frame.height * 3);
    uint8_t* target[1] = {rgb.data()};
    const int target_stride[1] = {3 * frame.width};
    sws_scale(scale, frame.data, frame.linesize, 0, frame.height, target, target_stride);
    return absl::OkStatus();
  });
  sws_freeContext(scale);
  if (!decoded.ok()) return decoded.status();
  if (next < indices.size()) {
    return absl::OutOfRangeError(
        absl::StrCat("video ", path, ": frame ", indices[next], " asked for, but it has ", decoded->frames));
  }
  return frames;
}

}  // namespace
}  // namespace troupe

extern "C" __attribute__((visibility("default"))) const troupe::video_module::Api* TroupeVideoModule() {
  static const troupe::video_module::Api api{.version = troupe::video_module::kVersion,
                                             .find_encoder = troupe::FindEncoder,
                                             .open = troupe::FfmpegEncoder::Open,
                                             .read_info = troupe::ReadInfo,
                                             .read_frames = troupe::ReadFrames};
  return &api;
}
