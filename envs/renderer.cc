#include "envs/renderer.h"

#include <EGL/egl.h>
#include <EGL/eglext.h>

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace troupe::envs {
namespace {

// The process's EGL display: Mesa's surfaceless platform first (CPU
// rendering with llvmpipe), then the first EGL device (NVIDIA's driver).
absl::StatusOr<EGLDisplay> Display() {
  static absl::StatusOr<EGLDisplay> display = []() -> absl::StatusOr<EGLDisplay> {
    // llvmpipe's rasterizer threads only add hand-offs at 84x84; render on
    // the calling thread unless the user says otherwise.
    setenv("LP_NUM_THREADS", "0", /*overwrite=*/0);
    auto get_platform_display =
        reinterpret_cast<PFNEGLGETPLATFORMDISPLAYEXTPROC>(eglGetProcAddress("eglGetPlatformDisplayEXT"));
    if (!get_platform_display) return absl::UnavailableError("EGL: eglGetPlatformDisplayEXT is missing (libEGL too old?)");
    EGLint major = 0, minor = 0;
    EGLDisplay d = get_platform_display(EGL_PLATFORM_SURFACELESS_MESA, EGL_DEFAULT_DISPLAY, nullptr);
    if (d != EGL_NO_DISPLAY && eglInitialize(d, &major, &minor)) return d;
    auto query_devices = reinterpret_cast<PFNEGLQUERYDEVICESEXTPROC>(eglGetProcAddress("eglQueryDevicesEXT"));
    EGLDeviceEXT devices[8];
    EGLint num_devices = 0;
    if (query_devices && query_devices(8, devices, &num_devices) && num_devices > 0) {
      d = get_platform_display(EGL_PLATFORM_DEVICE_EXT, devices[0], nullptr);
      if (d != EGL_NO_DISPLAY && eglInitialize(d, &major, &minor)) return d;
    }
    return absl::UnavailableError(absl::StrCat(
        "EGL: cannot open a headless display (surfaceless Mesa or an EGL device); EGL error 0x",
        absl::Hex(eglGetError()), ". Is Mesa's libegl-mesa0 installed?"));
  }();
  return display;
}

// One thread's EGL context, current on that thread for its lifetime.
class ThreadGlContext {
 public:
  ~ThreadGlContext() {
    if (context_ != EGL_NO_CONTEXT) {
      eglMakeCurrent(display_, EGL_NO_SURFACE, EGL_NO_SURFACE, EGL_NO_CONTEXT);
      eglDestroyContext(display_, context_);
    }
  }

  absl::Status MakeCurrent() {
    if (context_ != EGL_NO_CONTEXT) return absl::OkStatus();
    auto display = Display();
    if (!display.ok()) return display.status();
    display_ = *display;
    const EGLint attributes[] = {EGL_RED_SIZE, 8, EGL_GREEN_SIZE, 8, EGL_BLUE_SIZE, 8, EGL_ALPHA_SIZE, 8,
                                 EGL_DEPTH_SIZE, 24, EGL_STENCIL_SIZE, 8, EGL_COLOR_BUFFER_TYPE, EGL_RGB_BUFFER,
                                 EGL_SURFACE_TYPE, EGL_PBUFFER_BIT, EGL_RENDERABLE_TYPE, EGL_OPENGL_BIT, EGL_NONE};
    EGLConfig config = nullptr;
    EGLint num_configs = 0;
    if (!eglChooseConfig(display_, attributes, &config, 1, &num_configs) || num_configs < 1) {
      return absl::UnavailableError(absl::StrCat("EGL: no RGBA8/depth24 config, error 0x", absl::Hex(eglGetError())));
    }
    if (!eglBindAPI(EGL_OPENGL_API)) return absl::UnavailableError("EGL: cannot bind the desktop OpenGL API");
    context_ = eglCreateContext(display_, config, EGL_NO_CONTEXT, nullptr);
    if (context_ == EGL_NO_CONTEXT) {
      return absl::UnavailableError(absl::StrCat("EGL: cannot create a context, error 0x", absl::Hex(eglGetError())));
    }
    if (!eglMakeCurrent(display_, EGL_NO_SURFACE, EGL_NO_SURFACE, context_)) {
      return absl::UnavailableError(absl::StrCat("EGL: surfaceless eglMakeCurrent failed, error 0x", absl::Hex(eglGetError())));
    }
    return absl::OkStatus();
  }

 private:
  EGLDisplay display_ = EGL_NO_DISPLAY;
  EGLContext context_ = EGL_NO_CONTEXT;
};

// MuJoCo's GPU context and scene for one model on one thread.
struct ModelContext {
  std::weak_ptr<const Model> model;
  uint64_t model_id = 0;
  mjrContext context;
  mjvScene scene;
  mjvOption option;
  std::vector<uint8_t> scratch;  // bottom-up rows from mjr_readPixels

  ~ModelContext() {
    mjr_freeContext(&context);
    mjv_freeScene(&scene);
  }
};

// Everything a thread renders with. Members are destroyed in reverse order:
// the MuJoCo contexts first, while the GL context is still current.
struct ThreadRenderState {
  ThreadGlContext gl;
  std::vector<std::unique_ptr<ModelContext>> models;
};

thread_local ThreadRenderState render_state;

absl::StatusOr<ModelContext*> ContextFor(const std::shared_ptr<const Model>& model) {
  for (auto& entry : render_state.models) {
    if (entry->model_id == model->id()) return entry.get();
  }
  // A miss: drop contexts of models that no longer exist, then make one.
  std::erase_if(render_state.models, [](const auto& entry) { return entry->model.expired(); });
  if (auto status = render_state.gl.MakeCurrent(); !status.ok()) return status;
  auto entry = std::make_unique<ModelContext>();
  entry->model = model;
  entry->model_id = model->id();
  const mjModel* m = model->get();
  mjr_defaultContext(&entry->context);
  mjv_defaultScene(&entry->scene);
  mjv_defaultOption(&entry->option);
  try {
    mjv_makeScene(m, &entry->scene, /*maxgeom=*/2000);
    mjr_makeContext(m, &entry->context, mjFONTSCALE_100);
    mjr_setBuffer(mjFB_OFFSCREEN, &entry->context);
  } catch (const MujocoError& e) {
    return absl::InternalError(absl::StrCat("MuJoCo renderer for ", model->path(), ": ", e.what()));
  }
  if (entry->context.currentBuffer != mjFB_OFFSCREEN) {
    return absl::InternalError(absl::StrCat("MuJoCo renderer for ", model->path(), ": no offscreen buffer"));
  }
  entry->scratch.resize(size_t(entry->context.offWidth) * entry->context.offHeight * 3);
  render_state.models.push_back(std::move(entry));
  return render_state.models.back().get();
}

}  // namespace

absl::Status PrepareRenderer(const std::shared_ptr<const Model>& model) { return ContextFor(model).status(); }

absl::Status RenderPixels(const std::shared_ptr<const Model>& model, const mjData* data, int camera_id,
                          const RenderOptions& options, uint8_t* out) {
  const mjModel* m = model->get();
  // Check the request against what the model's offscreen buffer holds.
  if (options.width <= 0 || options.height <= 0 || options.width > m->vis.global.offwidth ||
      options.height > m->vis.global.offheight) {
    return absl::InvalidArgumentError(absl::StrCat(
        "render size ", options.width, "x", options.height, " is outside the offscreen buffer ", m->vis.global.offwidth,
        "x", m->vis.global.offheight, " of ", model->path(),
        " (raise <visual><global offwidth= offheight=> in the model, or render smaller)"));
  }
  if (camera_id < 0 || camera_id >= m->ncam) {
    return absl::InvalidArgumentError(absl::StrCat("camera id ", camera_id, " out of range: ", model->path(), " has ",
                                                   m->ncam, " cameras"));
  }
  auto context = ContextFor(model);
  if (!context.ok()) return context.status();
  ModelContext& c = **context;

  // Scene from the current state, then draw and read back.
  mjvCamera camera;
  mjv_defaultCamera(&camera);
  camera.type = mjCAMERA_FIXED;
  camera.fixedcamid = camera_id;
  c.scene.flags[mjRND_SHADOW] = options.shadows;
  c.scene.flags[mjRND_REFLECTION] = options.reflections;
  const mjrRect viewport = {0, 0, options.width, options.height};
  try {
    // mjv_updateScene takes a non-const mjData but only reads it.
    mjv_updateScene(m, const_cast<mjData*>(data), &c.option, nullptr, &camera, mjCAT_ALL, &c.scene);
    mjr_setBuffer(mjFB_OFFSCREEN, &c.context);  // other MuJoCo contexts may share this GL context
    mjr_render(viewport, &c.scene, &c.context);
    mjr_readPixels(c.scratch.data(), nullptr, viewport, &c.context);
  } catch (const MujocoError& e) {
    return absl::InternalError(absl::StrCat("MuJoCo renderer for ", model->path(), ": ", e.what()));
  }

  // OpenGL rows are bottom-up; observations are top-down.
  const size_t row = size_t(options.width) * 3;
  for (int y = 0; y < options.height; ++y) {
    std::memcpy(out + y * row, c.scratch.data() + (options.height - 1 - y) * row, row);
  }
  return absl::OkStatus();
}

}  // namespace troupe::envs
