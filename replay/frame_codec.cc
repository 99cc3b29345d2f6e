#include "replay/frame_codec.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_c_literalCompressionMode
#include <lz4.h>
#include <lz4hc.h>
#include <zstd.h>

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace troupe::replay {

namespace {

constexpr int kLz4MaxLevel = 12;  // LZ4HC_CLEVEL_MAX

}  // namespace

FrameCompressor::FrameCompressor(int level, proto::Compression codec) : codec_(codec), level_(level) {
  TROUPE_CHECK(codec == proto::COMPRESSION_LZ4 || codec == proto::COMPRESSION_ZSTD);
  if (codec == proto::COMPRESSION_ZSTD) {
    zstd_ = ZSTD_createCCtx();
    TROUPE_CHECK(zstd_ != nullptr);
  } else if (level <= 1) {
    lz4_ = LZ4_createStream();
    TROUPE_CHECK(lz4_ != nullptr);
  } else {
    lz4hc_ = LZ4_createStreamHC();
    TROUPE_CHECK(lz4hc_ != nullptr);
    level_ = std::min(level, kLz4MaxLevel);
  }
}

FrameCompressor::~FrameCompressor() {
  ZSTD_freeCCtx(zstd_);
  LZ4_freeStream(lz4_);
  LZ4_freeStreamHC(lz4hc_);
}

void FrameCompressor::Compress(const void* raw, size_t bytes, std::string* out, const void* reference) {
  if (codec_ == proto::COMPRESSION_ZSTD) {
    // Parameters for fast decoding; a reference applies to this frame only.
    ZSTD_CCtx_reset(zstd_, ZSTD_reset_session_and_parameters);
    ZSTD_CCtx_setParameter(zstd_, ZSTD_c_compressionLevel, level_);
    ZSTD_CCtx_setParameter(zstd_, ZSTD_c_literalCompressionMode, ZSTD_ps_disable);
    ZSTD_CCtx_setParameter(zstd_, ZSTD_c_minMatch, 6);
    if (reference != nullptr) TROUPE_CHECK(!ZSTD_isError(ZSTD_CCtx_refPrefix(zstd_, reference, bytes)));
    out->resize(ZSTD_compressBound(bytes));
    const size_t n = ZSTD_compress2(zstd_, out->data(), out->size(), raw, bytes);
    TROUPE_CHECK(!ZSTD_isError(n));  // the bound always suffices
    out->resize(n);
    return;
  }
  // LZ4 block; the reference (when set) is the history before the frame.
  TROUPE_CHECK(bytes <= static_cast<size_t>(LZ4_MAX_INPUT_SIZE));
  const int size = static_cast<int>(bytes);
  out->resize(static_cast<size_t>(LZ4_compressBound(size)));
  int n = 0;
  if (lz4_ != nullptr) {
    LZ4_resetStream_fast(lz4_);
    if (reference != nullptr) LZ4_loadDict(lz4_, static_cast<const char*>(reference), size);
    n = LZ4_compress_fast_continue(lz4_, static_cast<const char*>(raw), out->data(), size,
                                   static_cast<int>(out->size()), /*acceleration=*/1);
  } else {
    LZ4_resetStreamHC_fast(lz4hc_, level_);
    if (reference != nullptr) LZ4_loadDictHC(lz4hc_, static_cast<const char*>(reference), size);
    n = LZ4_compress_HC_continue(lz4hc_, static_cast<const char*>(raw), out->data(), size,
                                 static_cast<int>(out->size()));
  }
  TROUPE_CHECK(n > 0);  // the bound always suffices
  out->resize(static_cast<size_t>(n));
}

namespace {

// Whether zstd bytes declare exactly `raw` bytes of content.
bool DeclaresSize(const std::string& zstd, int64_t raw) {
  const unsigned long long size = ZSTD_getFrameContentSize(zstd.data(), zstd.size());
  return size != ZSTD_CONTENTSIZE_ERROR && size != ZSTD_CONTENTSIZE_UNKNOWN && static_cast<int64_t>(size) == raw;
}

// Parses an LZ4 block (lz4_Block_format.md) without decoding it: OK when
// it decodes to exactly `raw` bytes with `dict` bytes of history before
// them, under the end-of-block rules LZ4_decompress_safe* enforce (this is
// as strict or stricter; LZ4's compressors always meet it).
absl::Status CheckLz4Block(const std::string& block, int64_t raw, int64_t dict) {
  constexpr int64_t kMinMatch = 4, kLastLiterals = 5, kMatchStartLimit = 12;
  const auto* const begin = reinterpret_cast<const uint8_t*>(block.data());
  const uint8_t* const end = begin + block.size();
  const uint8_t* ip = begin;
  int64_t out = 0;
  auto error = [&](const char* what) {
    return absl::InvalidArgumentError(absl::StrCat("LZ4 block (", block.size(), " bytes) ", what, " at input byte ",
                                                   ip - begin, ", output byte ", out, " of ", raw));
  };
  // A length nibble of 15 continues in bytes while they are 255. The
  // decoder wants more than `keep_before` input bytes left before the first
  // of them (literal lengths) or more than `keep_after` left after each
  // (match lengths).
  auto extend = [&](int64_t* length, int64_t keep_before, int64_t keep_after) -> bool {
    if (end - ip <= keep_before) return false;
    uint8_t b = 255;
    while (b == 255) {
      if (ip >= end) return false;
      b = *ip++;
      *length += b;
      if (*length > raw || end - ip <= keep_after) return false;
    }
    return true;
  };
  if (raw <= 0 || block.empty()) return error("is empty");
  while (true) {
    if (ip >= end) return error("ends inside a sequence");
    const uint8_t token = *ip++;
    // Literals.
    int64_t literals = token >> 4;
    if (literals == 15 && !extend(&literals, /*keep_before=*/15, /*keep_after=*/-1)) {
      return error("has a bad literal length");
    }
    if (literals > end - ip || literals > raw - out) return error("has literals past its end");
    ip += literals;
    out += literals;
    // The last sequence is literals only and ends both the block and the frame.
    if (ip == end) {
      if (out != raw) return error("ends early");
      return absl::OkStatus();
    }
    // A match follows: it starts 12+ bytes before the frame's end, with room for
    // offset, token and the last literals behind it.
    if (out > raw - kMatchStartLimit || end - ip < 2 + 1 + kLastLiterals) return error("has a match too near its end");
    const int64_t offset = int64_t{ip[0]} | (int64_t{ip[1]} << 8);
    ip += 2;
    if (offset == 0 || offset > out + dict) return error("has a match before its history");
    int64_t length = token & 15;
    if (length == 15 && !extend(&length, /*keep_before=*/0, /*keep_after=*/kLastLiterals - 1)) {
      return error("has a bad match length");
    }
    length += kMinMatch;
    if (length > raw - kLastLiterals - out) return error("has a match past the last literals");
    out += length;
  }
}

}  // namespace

absl::Status CheckCompressedFrame(const std::string& data, proto::Compression codec, int64_t raw_bytes,
                                  int64_t reference_bytes) {
  switch (codec) {
    case proto::COMPRESSION_LZ4:
      // A frame's block is never larger than LZ4's bound for its size.
      if (raw_bytes > LZ4_MAX_INPUT_SIZE ||
          static_cast<int64_t>(data.size()) > LZ4_compressBound(static_cast<int>(raw_bytes))) {
        return absl::InvalidArgumentError(absl::StrCat("LZ4 frame of ", data.size(), " bytes for ", raw_bytes,
                                                       " raw bytes exceeds LZ4's bound"));
      }
      return CheckLz4Block(data, raw_bytes, reference_bytes);
    case proto::COMPRESSION_ZSTD:
      if (!DeclaresSize(data, raw_bytes)) {
        return absl::InvalidArgumentError(
            absl::StrCat("zstd frame content size does not match shape (", raw_bytes, " bytes expected)"));
      }
      return absl::OkStatus();
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("unknown compression ", static_cast<int>(codec), " (expected LZ4 or ZSTD)"));
  }
}

FrameDecompressor::FrameDecompressor() : ctx_(ZSTD_createDCtx()) { TROUPE_CHECK(ctx_ != nullptr); }
FrameDecompressor::~FrameDecompressor() { ZSTD_freeDCtx(ctx_); }

absl::Status FrameDecompressor::Decode(const std::string& data, proto::Compression codec, int64_t raw_bytes, void* dst,
                                  const void* reference) {
  if (codec == proto::COMPRESSION_LZ4) {
    // LZ4 block, the reference as external dictionary.
    if (raw_bytes > LZ4_MAX_INPUT_SIZE || data.size() > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) {
      return absl::DataLossError(absl::StrCat("LZ4 frame of ", raw_bytes, " bytes is too large"));
    }
    const int size = static_cast<int>(data.size()), capacity = static_cast<int>(raw_bytes);
    char* const out = static_cast<char*>(dst);
    const int n = reference != nullptr ? LZ4_decompress_safe_usingDict(data.data(), out, size, capacity,
                                                                       static_cast<const char*>(reference), capacity)
                                       : LZ4_decompress_safe(data.data(), out, size, capacity);
    if (n != raw_bytes) {
      return absl::DataLossError(n < 0 ? std::string("LZ4 frame does not decode")
                                       : absl::StrCat("LZ4 frame decodes to ", n, " bytes, expected ", raw_bytes));
    }
    return absl::OkStatus();
  }
  if (codec != proto::COMPRESSION_ZSTD) {
    return absl::DataLossError(absl::StrCat("frame has unknown compression ", static_cast<int>(codec)));
  }
  if (reference != nullptr) {
    ZSTD_DCtx_reset(ctx_, ZSTD_reset_session_only);
    const size_t r = ZSTD_DCtx_refPrefix(ctx_, reference, static_cast<size_t>(raw_bytes));
    if (ZSTD_isError(r)) return absl::InternalError(absl::StrCat("zstd prefix: ", ZSTD_getErrorName(r)));
  }
  const size_t n = ZSTD_decompressDCtx(ctx_, dst, static_cast<size_t>(raw_bytes), data.data(), data.size());
  if (ZSTD_isError(n)) {
    ZSTD_DCtx_reset(ctx_, ZSTD_reset_session_only);  // drop an unused prefix
    return absl::DataLossError(absl::StrCat("frame does not decode: ", ZSTD_getErrorName(n)));
  }
  if (static_cast<int64_t>(n) != raw_bytes) {
    return absl::DataLossError(absl::StrCat("frame decodes to ", n, " bytes, expected ", raw_bytes));
  }
  return absl::OkStatus();
}

FrameEncoder::FrameEncoder(const Options& options)
    : options_(options), compressor_(options.level, options.codec), keys_(std::max(1, options.slots)) {}

double FrameEncoder::Similarity(const uint8_t* a, const uint8_t* b, size_t bytes) {
  // 509 samples spread over the frame (a prime stride avoids row aliasing).
  constexpr size_t kSamples = 509;
  const size_t stride = std::max<size_t>(1, bytes / kSamples);
  size_t equal = 0, n = 0;
  for (size_t i = stride / 2; i < bytes; i += stride, ++n) equal += a[i] == b[i];
  return n == 0 ? 0.0 : static_cast<double>(equal) / static_cast<double>(n);
}

void FrameEncoder::MakeKey(Key* slot, uint64_t key, const uint8_t* pixels, int height, int width, int channels,
                           int64_t plain_bytes) {
  slot->key = key;
  slot->pixels.assign(pixels, pixels + static_cast<size_t>(height) * width * channels);
  slot->height = height;
  slot->width = width;
  slot->channels = channels;
  slot->plain_bytes = plain_bytes;
  slot->coded = 0;
  slot->last_used = ++uses_;
}

void FrameEncoder::Encode(uint64_t key, const uint8_t* pixels, int height, int width, int channels, Encoded* out) {
  const size_t bytes = static_cast<size_t>(height) * width * channels;
  out->has_reference = false;
  if (options_.group <= 0) {
    compressor_.Compress(pixels, bytes, &out->data);
    return;
  }
  // The most similar usable key frame: same shape, still inside the window.
  Key* best = nullptr;
  double best_similarity = 0;
  for (Key& k : keys_) {
    if (k.pixels.empty() || k.height != height || k.width != width || k.channels != channels) continue;
    if (k.key + static_cast<uint64_t>(options_.window) <= key) {
      k.pixels.clear();  // left the window: the server may have forgotten it
      continue;
    }
    const double s = Similarity(pixels, k.pixels.data(), bytes);
    if (s > best_similarity) best = &k, best_similarity = s;
  }
  if (best_similarity < 0.5) best = nullptr;
  // Coded against it when it is not used up and references paid lately.
  if (best != nullptr && best->plain_left == 0 && best->coded < options_.group) {
    compressor_.Compress(pixels, bytes, &out->data, best->pixels.data());
    if (static_cast<double>(out->data.size()) <= options_.min_saving * static_cast<double>(best->plain_bytes)) {
      out->has_reference = true;
      out->reference_key = best->key;
      ++best->coded;
      best->last_used = ++uses_;
      return;
    }
    // Too little saved (the view moves): this env's frames stay plain for a while.
    best->plain_left = 4 * options_.group + 1;
  }
  // A key frame: it replaces the matched slot (this env's old key), else an
  // empty or the least recently used one.
  compressor_.Compress(pixels, bytes, &out->data);
  Key* slot = best;
  if (slot == nullptr) {
    slot = &keys_[0];
    for (Key& k : keys_) {
      if (k.pixels.empty()) {
        slot = &k;
        break;
      }
      if (k.last_used < slot->last_used) slot = &k;
    }
    slot->plain_left = 0;
  }
  if (slot->plain_left > 0) --slot->plain_left;
  MakeKey(slot, key, pixels, height, width, channels, static_cast<int64_t>(out->data.size()));
}

}  // namespace troupe::replay
