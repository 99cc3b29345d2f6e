// Headless pixels: MuJoCo's renderer on an EGL context with no surface
// (Mesa's surfaceless platform on a CPU; an EGL device on an NVIDIA GPU).
//
// Threading: every thread that renders gets its own EGL context, made once
// and kept current on that thread until it exits, and its own MuJoCo GPU
// context (mjrContext, slow to make: docs/design.md, "Measured costs") per model it
// renders. Both live in
// thread-local storage; nothing here is shared between threads, so there is
// no locking. Envs hold no GL state: any thread may render any env.
#ifndef TROUPE_ENVS_RENDERER_H_
#define TROUPE_ENVS_RENDERER_H_

#include <mujoco/mujoco.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "envs/model.h"

namespace troupe::envs {

struct RenderOptions {
  int width = 84;
  int height = 84;
  bool shadows = false;
  bool reflections = false;
  // MSAA is fixed when the model is loaded (Model::Load's `multisample`).
};

// Renders `data` of `model` from fixed camera `camera_id` into `out` as RGB
// uint8, rows top-down, width*height*3 bytes. Makes this thread's EGL and
// MuJoCo contexts on first use. Errors: InvalidArgument if the size exceeds
// the model's offscreen buffer (<visual><global offwidth offheight>) or the
// camera id is out of range; Unavailable if no EGL display can be opened;
// Internal with MuJoCo's message if its renderer fails.
absl::Status RenderPixels(const std::shared_ptr<const Model>& model, const mjData* data, int camera_id,
                          const RenderOptions& options, uint8_t* out);

// Makes this thread's contexts for `model` now (so making them is not paid
// inside a timed loop or the first step). Same errors as RenderPixels.
absl::Status PrepareRenderer(const std::shared_ptr<const Model>& model);

}  // namespace troupe::envs

#endif  // TROUPE_ENVS_RENDERER_H_
