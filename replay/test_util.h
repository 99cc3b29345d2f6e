// Helpers shared by replay's tests: configs and a stacked-pixel episode.
#ifndef TROUPE_REPLAY_TEST_UTIL_H_
#define TROUPE_REPLAY_TEST_UTIL_H_

#include <zstd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "google/protobuf/text_format.h"
#include "proto/config.pb.h"
#include "replay/client.h"

namespace troupe::replay::testing {

constexpr int kH = 16, kW = 16, kC = 3, kStack = 3;

// Parses a ReplayConfig text proto (aborts the test on a parse error).
inline config::ReplayConfig ParseConfig(const std::string& text) {
  config::ReplayConfig c;
  if (!google::protobuf::TextFormat::ParseFromString(text, &c)) std::abort();
  return c;
}

// Tables: "pixels" (uniform, stacked 16x16x3 frames x3: obs, action[2],
// reward, next_obs), "state" (float32[24] obs, action[2]), "queue" (FIFO of
// state items). `extra` is appended to the text.
inline config::ReplayConfig TestConfig(const std::string& pixels_extra = "max_size: 1000",
                                      const std::string& extra = "") {
  return ParseConfig(R"pb(
    tables {
      name: "pixels"
      fields { name: "obs" dtype: uint8 shape: [16, 16, 3] frames: 3 }
      fields { name: "action" shape: 2 }
      fields { name: "reward" }
      fields { name: "next_obs" dtype: uint8 shape: [16, 16, 3] frames: 3 }
      )pb" + pixels_extra + R"pb(
    }
    tables { name: "state" max_size: 1000 fields { name: "obs" shape: 24 } fields { name: "action" shape: 2 } }
    tables { name: "queue" max_size: 1000 selector: fifo fields { name: "obs" shape: 24 } fields { name: "action" shape: 2 } }
  )pb" + extra);
}

// A deterministic frame with structure (a background and a moving block),
// distinct for each t.
inline std::vector<uint8_t> TestFrame(int t) {
  std::vector<uint8_t> f(kH * kW * kC);
  for (int y = 0; y < kH; ++y) {
    for (int x = 0; x < kW; ++x) {
      for (int c = 0; c < kC; ++c) {
        const bool block = (x - t % kW + kW) % kW < 4 && y > 6 && y < 11;
        f[(y * kW + x) * kC + c] = block ? static_cast<uint8_t>(200 + c + t / kW) : static_cast<uint8_t>(30 + 10 * c + y);
      }
    }
  }
  return f;
}

// Frame index (into the episode's frames) of stack slot j of the observation at step t.
inline int StackFrame(int t, int j) { return std::max(0, t - (kStack - 1) + j); }

// Writes one episode of `steps` transitions (steps + 1 frames) into "pixels":
// transition t has obs frames StackFrame(t, .), next_obs StackFrame(t + 1, .),
// action {t, -t}, reward t / 10.
inline absl::Status WriteEpisode(Writer& writer, int steps, int frame_offset = 0) {
  std::vector<uint64_t> keys;
  for (int t = 0; t <= steps; ++t) {
    const std::vector<uint8_t> frame = TestFrame(frame_offset + t);
    auto key = writer.AppendFrame(frame.data(), kH, kW, kC);
    if (!key.ok()) return key.status();
    keys.push_back(*key);
    if (t == 0) continue;
    const int s = t - 1;
    const float action[2] = {static_cast<float>(s), static_cast<float>(-s)};
    const float reward = s / 10.0f;
    absl::Status status = writer.Insert(
        "pixels", /*priority=*/1.0,
        {FieldValue::Frames({keys[StackFrame(s, 0)], keys[StackFrame(s, 1)], keys[StackFrame(s, 2)]}),
         FieldValue::Dense(proto::DTYPE_FLOAT32, {2}, action), FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &reward),
         FieldValue::Frames({keys[StackFrame(s + 1, 0)], keys[StackFrame(s + 1, 1)], keys[StackFrame(s + 1, 2)]})});
    if (!status.ok()) return status;
  }
  return writer.Flush();
}

// Checks that sampled row `i` of a "pixels" batch is byte-identical to what
// WriteEpisode inserted (the transition is identified by its action).
inline ::testing::AssertionResult RowMatchesEpisode(const SampledBatch& batch, int i, int frame_offset = 0) {
  const float* action = batch.fields[1].as<float>() + 2 * i;
  const int s = static_cast<int>(action[0]);
  if (action[1] != -action[0]) return ::testing::AssertionFailure() << "row " << i << ": action corrupt";
  if (batch.fields[2].as<float>()[i] != s / 10.0f) return ::testing::AssertionFailure() << "row " << i << ": reward";
  const size_t frame_bytes = kH * kW * kC;
  for (int field : {0, 3}) {
    const int step = field == 0 ? s : s + 1;
    for (int j = 0; j < kStack; ++j) {
      const std::vector<uint8_t> expected = TestFrame(frame_offset + StackFrame(step, j));
      const uint8_t* got = batch.fields[field].data.data() + (i * kStack + j) * frame_bytes;
      if (std::memcmp(got, expected.data(), frame_bytes) != 0) {
        return ::testing::AssertionFailure() << "row " << i << " (step " << s << ") field " << field << " frame " << j
                                             << " differs from what was inserted";
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// The 32 real rendered frames of replay/testdata (16 cartpole.swingup, then
// 16 walker.walk, each run consecutive), 84x84x3.
constexpr int kRendered = 84;
constexpr size_t kRenderedBytes = kRendered * kRendered * 3;

inline std::vector<std::vector<uint8_t>> RenderedFrames() {
  std::ifstream in(ProjectPath("replay/testdata/rendered_frames.zst"), std::ios::binary);
  const std::string packed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string raw(32 * kRenderedBytes, '\0');
  const size_t n = ZSTD_decompress(raw.data(), raw.size(), packed.data(), packed.size());
  EXPECT_EQ(n, raw.size()) << "replay/testdata/rendered_frames.zst";
  std::vector<std::vector<uint8_t>> frames;
  for (size_t i = 0; n == raw.size() && i < 32; ++i) {
    frames.emplace_back(raw.begin() + i * kRenderedBytes, raw.begin() + (i + 1) * kRenderedBytes);
  }
  return frames;
}

// Reference-coding scenes: 64x64x3 frames of a fixed textured background
// (it compresses poorly alone, like a rendered floor) with a block that
// moves along it, so a frame coded against a recent one is far smaller.
constexpr int kSceneSize = 64;

inline std::vector<uint8_t> SceneFrame(int t) {
  std::vector<uint8_t> f(kSceneSize * kSceneSize * 3);
  uint32_t noise = 12345;
  for (int y = 0; y < kSceneSize; ++y) {
    for (int x = 0; x < kSceneSize; ++x) {
      const bool block = std::abs(x - (10 + t % 40)) < 5 && std::abs(y - (20 + (t / 40) % 20)) < 6;
      for (int c = 0; c < 3; ++c) {
        noise = noise * 1664525u + 1013904223u;
        f[(y * kSceneSize + x) * 3 + c] = block ? static_cast<uint8_t>(250 - 20 * c) : static_cast<uint8_t>(noise >> 27);
      }
    }
  }
  return f;
}

// A table "scene" of {obs: scene frames x3, step: float32, next_obs: x3}.
inline config::ReplayConfig SceneConfig(int max_size) {
  return ParseConfig(absl::StrCat(R"pb(
    tables {
      name: "scene"
      max_size: )pb", max_size, R"pb(
      fields { name: "obs" dtype: uint8 shape: [64, 64, 3] frames: 3 }
      fields { name: "step" }
      fields { name: "next_obs" dtype: uint8 shape: [64, 64, 3] frames: 3 }
    })pb"));
}

// Writes `steps` transitions of scene frames first_frame, first_frame + 1,
// ... into "scene" (each frame appended raw: the writer picks references).
inline absl::Status WriteScene(Writer& writer, int steps, int first_frame = 0) {
  std::vector<uint64_t> keys;
  for (int t = 0; t <= steps; ++t) {
    const std::vector<uint8_t> frame = SceneFrame(first_frame + t);
    auto key = writer.AppendFrame(frame.data(), kSceneSize, kSceneSize, 3);
    if (!key.ok()) return key.status();
    keys.push_back(*key);
    if (t == 0) continue;
    const int s = t - 1;
    const float step = static_cast<float>(first_frame + s);
    auto at = [&](int u, int j) { return keys[std::max(0, u - 2 + j)]; };
    absl::Status status = writer.Insert("scene", /*priority=*/1.0,
                                        {FieldValue::Frames({at(s, 0), at(s, 1), at(s, 2)}),
                                         FieldValue::Dense(proto::DTYPE_FLOAT32, {}, &step),
                                         FieldValue::Frames({at(s + 1, 0), at(s + 1, 1), at(s + 1, 2)})});
    if (!status.ok()) return status;
  }
  return writer.Flush();
}

// Checks that every row of a "scene" batch is byte-identical to what
// WriteScene inserted (the row's step says which frames; `first_frame` as
// given to WriteScene for that step's episode).
inline ::testing::AssertionResult SceneBatchMatches(const SampledBatch& batch, int first_frame = 0) {
  const size_t frame_bytes = kSceneSize * kSceneSize * 3;
  for (size_t i = 0; i < batch.keys.size(); ++i) {
    const int step = static_cast<int>(batch.fields[1].as<float>()[i]);
    for (int field : {0, 2}) {
      const int u = step - first_frame + (field == 2 ? 1 : 0);
      for (int j = 0; j < 3; ++j) {
        const std::vector<uint8_t> expected = SceneFrame(first_frame + std::max(0, u - 2 + j));
        const uint8_t* got = batch.fields[field].data.data() + (i * 3 + j) * frame_bytes;
        if (std::memcmp(got, expected.data(), frame_bytes) != 0) {
          return ::testing::AssertionFailure() << "row " << i << " (step " << step << ") field " << field << " frame "
                                               << j << " differs from what was inserted";
        }
      }
    }
  }
  return ::testing::AssertionSuccess();
}

// Inserts one state item {obs: 24 x value, action: {value, value}} into `table`.
inline absl::Status InsertState(Writer& writer, const std::string& table, float value) {
  std::vector<float> obs(24, value);
  const float action[2] = {value, value};
  return writer.Insert(table, /*priority=*/1.0,
                       {FieldValue::Dense(proto::DTYPE_FLOAT32, {24}, obs.data()),
                        FieldValue::Dense(proto::DTYPE_FLOAT32, {2}, action)});
}

}  // namespace troupe::replay::testing

#endif  // TROUPE_REPLAY_TEST_UTIL_H_
