#include "common/video.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

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

}  // namespace

absl::StatusOr<std::string> FindVideoEncoder(const std::string& requested) {
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

struct Mp4Writer::Impl {
  AVFormatContext* format = nullptr;
  AVCodecContext* codec = nullptr;
  AVStream* stream = nullptr;
  AVFrame* frame = nullptr;
  AVPacket* packet = nullptr;
  SwsContext* scale = nullptr;
  int width = 0;
  int height = 0;
  std::string partial;
  bool header_written = false;

  ~Impl() {
    if (scale) sws_freeContext(scale);
    if (packet) av_packet_free(&packet);
    if (frame) av_frame_free(&frame);
    if (codec) avcodec_free_context(&codec);
    if (format) {
      if (format->pb) avio_closep(&format->pb);
      avformat_free_context(format);
    }
  }
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
    return absl::InvalidArgumentError(absl::StrCat("video size ", options.width, "x", options.height,
                                                   " for ", path, ": width and height must be even and >= 2"));
  }
  if (!(options.frame_seconds > 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("video frame_seconds ", options.frame_seconds, " for ", path, ": must be > 0"));
  }
  auto encoder_name = FindVideoEncoder(options.encoder);
  if (!encoder_name.ok()) return encoder_name.status();
  const AVCodec* encoder = avcodec_find_encoder_by_name(encoder_name->c_str());

  auto impl = std::make_unique<Impl>();
  impl->width = options.width;
  impl->height = options.height;
  impl->partial = path + ".partial";
  auto fail = [&](const std::string& what, int code) {
    return absl::InternalError(absl::StrCat("video ", path, ": ", what, ": ", AvError(code)));
  };

  // The container (MP4 whatever the file is called) and its one stream.
  int rc = avformat_alloc_output_context2(&impl->format, nullptr, "mp4", impl->partial.c_str());
  if (rc < 0 || impl->format == nullptr) return fail("cannot make an MP4 muxer", rc);
  impl->stream = avformat_new_stream(impl->format, nullptr);
  if (impl->stream == nullptr) return absl::InternalError(absl::StrCat("video ", path, ": cannot add a stream"));

  // The encoder: frame rate from the simulated time per frame, 4:2:0.
  impl->codec = avcodec_alloc_context3(encoder);
  if (impl->codec == nullptr) return absl::InternalError(absl::StrCat("video ", path, ": cannot allocate encoder"));
  const AVRational frame_duration = av_d2q(options.frame_seconds, 100000);
  impl->codec->width = options.width;
  impl->codec->height = options.height;
  impl->codec->time_base = frame_duration;
  impl->codec->framerate = av_inv_q(frame_duration);
  impl->codec->pix_fmt = AV_PIX_FMT_YUV420P;
  impl->codec->gop_size = 50;
  // No B-frames: every packet's timestamp is its frame's, so the MP4 holds
  // exactly the frames given (with B-frames the MP4 edit list hides one).
  impl->codec->max_b_frames = 0;
  impl->codec->thread_count = std::max(1, options.threads);
  if (*encoder_name == "mpeg4") impl->codec->bit_rate = int64_t(options.width) * options.height * 8;
  if (impl->format->oformat->flags & AVFMT_GLOBALHEADER) impl->codec->flags |= AV_CODEC_FLAG_GLOBAL_HEADER;
  AVDictionary* codec_options = nullptr;
  if (*encoder_name == "libx264") {
    av_dict_set(&codec_options, "preset", "veryfast", 0);
    av_dict_set(&codec_options, "crf", "23", 0);
  }
  rc = avcodec_open2(impl->codec, encoder, &codec_options);
  av_dict_free(&codec_options);
  if (rc < 0) return fail(absl::StrCat("cannot open encoder ", *encoder_name), rc);
  rc = avcodec_parameters_from_context(impl->stream->codecpar, impl->codec);
  if (rc < 0) return fail("cannot copy encoder parameters", rc);
  impl->stream->time_base = impl->codec->time_base;

  // Frames: one YUV frame reused, RGB converted into it.
  impl->frame = av_frame_alloc();
  impl->packet = av_packet_alloc();
  if (!impl->frame || !impl->packet) return absl::InternalError(absl::StrCat("video ", path, ": out of memory"));
  impl->frame->format = AV_PIX_FMT_YUV420P;
  impl->frame->width = options.width;
  impl->frame->height = options.height;
  rc = av_frame_get_buffer(impl->frame, 0);
  if (rc < 0) return fail("cannot allocate a frame", rc);
  impl->scale = sws_getContext(options.width, options.height, AV_PIX_FMT_RGB24, options.width, options.height,
                               AV_PIX_FMT_YUV420P, SWS_BILINEAR, nullptr, nullptr, nullptr);
  if (impl->scale == nullptr) return absl::InternalError(absl::StrCat("video ", path, ": cannot make a converter"));

  // The file.
  rc = avio_open(&impl->format->pb, impl->partial.c_str(), AVIO_FLAG_WRITE);
  if (rc < 0) return fail(absl::StrCat("cannot open ", impl->partial, " for writing"), rc);
  rc = avformat_write_header(impl->format, nullptr);
  if (rc < 0) return fail("cannot write the MP4 header", rc);
  impl->header_written = true;
  return std::unique_ptr<Mp4Writer>(new Mp4Writer(std::move(impl), path, *encoder_name));
}

absl::Status Mp4Writer::Drain() {
  // Every packet the encoder has ready goes to the file.
  for (;;) {
    const int rc = avcodec_receive_packet(impl_->codec, impl_->packet);
    if (rc == AVERROR(EAGAIN) || rc == AVERROR_EOF) return absl::OkStatus();
    if (rc < 0) return absl::InternalError(absl::StrCat("video ", path_, ": encoding failed: ", AvError(rc)));
    if (impl_->packet->duration <= 0) impl_->packet->duration = 1;  // one frame, so the last one is shown too
    av_packet_rescale_ts(impl_->packet, impl_->codec->time_base, impl_->stream->time_base);
    impl_->packet->stream_index = impl_->stream->index;
    const int written = av_interleaved_write_frame(impl_->format, impl_->packet);
    if (written < 0) return absl::InternalError(absl::StrCat("video ", path_, ": write failed: ", AvError(written)));
  }
}

absl::Status Mp4Writer::AddFrame(const uint8_t* rgb) {
  if (finished_) return absl::FailedPreconditionError(absl::StrCat("video ", path_, ": already finished"));
  int rc = av_frame_make_writable(impl_->frame);
  if (rc < 0) return absl::InternalError(absl::StrCat("video ", path_, ": frame not writable: ", AvError(rc)));
  const uint8_t* source[1] = {rgb};
  const int source_stride[1] = {3 * impl_->width};
  sws_scale(impl_->scale, source, source_stride, 0, impl_->height, impl_->frame->data, impl_->frame->linesize);
  impl_->frame->pts = frames_;
  rc = avcodec_send_frame(impl_->codec, impl_->frame);
  if (rc < 0) return absl::InternalError(absl::StrCat("video ", path_, ": encoder refused a frame: ", AvError(rc)));
  ++frames_;
  return Drain();
}

absl::Status Mp4Writer::Finish() {
  if (finished_) return absl::OkStatus();
  if (frames_ == 0) return absl::FailedPreconditionError(absl::StrCat("video ", path_, ": no frames"));
  // Flush the encoder, write the index, close and move into place.
  int rc = avcodec_send_frame(impl_->codec, nullptr);
  if (rc < 0) return absl::InternalError(absl::StrCat("video ", path_, ": flush failed: ", AvError(rc)));
  if (absl::Status s = Drain(); !s.ok()) return s;
  rc = av_write_trailer(impl_->format);
  if (rc < 0) return absl::InternalError(absl::StrCat("video ", path_, ": cannot write the index: ", AvError(rc)));
  avio_closep(&impl_->format->pb);
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

}  // namespace troupe
