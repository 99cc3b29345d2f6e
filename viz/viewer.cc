#include "viz/viewer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/status_macros.h"
#include "envs/model.h"

namespace troupe::viz {
namespace {
using Clock = std::chrono::steady_clock;

constexpr int kMargin = 10;
constexpr int kBarHeight = 16;
constexpr int kBarGap = 6;
constexpr int kBarWidth = 180;
constexpr double kMaxFramesPerSecond = 60;  // Run()'s cap when vsync does not limit

const char kHelpKeys[] =
    "Space\nRight arrow\nR\nC\n[  ]\nP\nH\nEsc\nLeft drag\nRight drag\nWheel";
const char kHelpActions[] =
    "pause / resume\none step (paused)\nnew episode\nnext camera\nslower / faster\nsave PNG screenshot\n"
    "this help\nquit\norbit\npan\nzoom";

std::string Getenv(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

std::string FormatSpeed(double speed) {
  return speed >= 1 ? absl::StrFormat("%gx", speed) : absl::StrFormat("1/%gx", 1 / speed);
}

}  // namespace

absl::Status CheckDisplay() {
  if (!Getenv("DISPLAY").empty() || !Getenv("WAYLAND_DISPLAY").empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "troupe view needs a display, and neither DISPLAY nor WAYLAND_DISPLAY is set. On a machine without a screen "
      "(ssh, a container, CI) run it under a virtual X server: xvfb-run -a troupe view ... (Debian package xvfb); "
      "over ssh, `ssh -X` forwards your own display");
}

absl::StatusOr<std::unique_ptr<Viewer>> Viewer::Create(ViewerOptions options) {
  RETURN_IF_ERROR(CheckDisplay());
  if (options.width <= 0 || options.height <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("window size ", options.width, "x", options.height, " is not positive"));
  }
  std::unique_ptr<Viewer> viewer(new Viewer(std::move(options)));
  const std::string display = absl::StrCat("DISPLAY=", Getenv("DISPLAY"), " WAYLAND_DISPLAY=", Getenv("WAYLAND_DISPLAY"));
  // SDL's video subsystem, then a window with a double-buffered GL context
  // (a compatibility profile: MuJoCo's renderer uses fixed-function GL) with
  // the depth and stencil buffers its shadows and reflections use.
  if (SDL_Init(SDL_INIT_VIDEO) != 0) {
    return absl::UnavailableError(absl::StrCat("SDL cannot open the display (", display, "): ", SDL_GetError(),
                                               ". Without a screen, run under xvfb-run -a"));
  }
  viewer->sdl_initialized_ = true;
  SDL_GL_SetAttribute(SDL_GL_DOUBLEBUFFER, 1);
  SDL_GL_SetAttribute(SDL_GL_DEPTH_SIZE, 24);
  SDL_GL_SetAttribute(SDL_GL_STENCIL_SIZE, 8);
  SDL_GL_SetAttribute(SDL_GL_RED_SIZE, 8);
  SDL_GL_SetAttribute(SDL_GL_GREEN_SIZE, 8);
  SDL_GL_SetAttribute(SDL_GL_BLUE_SIZE, 8);
  const ViewerOptions& o = viewer->options_;
  viewer->window_ = SDL_CreateWindow(o.title.c_str(), SDL_WINDOWPOS_CENTERED, SDL_WINDOWPOS_CENTERED, o.width, o.height,
                                     SDL_WINDOW_OPENGL | SDL_WINDOW_RESIZABLE | SDL_WINDOW_ALLOW_HIGHDPI);
  if (!viewer->window_) {
    return absl::UnavailableError(absl::StrCat("SDL cannot open a ", o.width, "x", o.height, " OpenGL window (",
                                               display, "): ", SDL_GetError()));
  }
  viewer->gl_context_ = SDL_GL_CreateContext(viewer->window_);
  if (!viewer->gl_context_) {
    return absl::UnavailableError(absl::StrCat("SDL cannot create an OpenGL context (", display, "): ", SDL_GetError()));
  }
  SDL_GL_MakeCurrent(viewer->window_, viewer->gl_context_);
  SDL_GL_SetSwapInterval(o.vsync ? 1 : 0);
  return viewer;
}

Viewer::~Viewer() {
  // The physics thread first, then MuJoCo's GL objects while the context is
  // still current, then the context, the window and SDL.
  simulation_.reset();
  if (context_made_) {
    SDL_GL_MakeCurrent(window_, gl_context_);
    mjr_freeContext(&context_);
    mjv_freeScene(&scene_);
  }
  if (empty_model_) mj_deleteModel(empty_model_);
  if (gl_context_) SDL_GL_DeleteContext(gl_context_);
  if (window_) SDL_DestroyWindow(window_);
  if (sdl_initialized_) SDL_Quit();
}

absl::Status Viewer::Show(std::unique_ptr<Simulation> simulation) {
  gan_.reset();
  simulation_ = std::move(simulation);
  const mjModel* m = simulation_->model();
  RETURN_IF_ERROR(MakeRenderContext(m));
  // The free camera starts closer than MuJoCo's default (which frames the
  // whole floor) and a little above the scene.
  mjv_defaultFreeCamera(m, &free_camera_);
  free_camera_.distance *= 0.5;
  free_camera_.elevation = -15;
  camera_ = -1;
  return absl::OkStatus();
}

absl::Status Viewer::ShowGan(std::unique_ptr<GanSamples> samples) {
  simulation_.reset();
  gan_ = std::move(samples);
  // MuJoCo's 2D drawing (pixels, overlays, figures) needs a context made
  // from some model: an empty one, from an in-memory file.
  if (!empty_model_) {
    envs::InstallMujocoErrorHandlers();
    static const char kEmpty[] = "<mujoco/>";
    mjVFS vfs;
    mj_defaultVFS(&vfs);
    mj_makeEmptyFileVFS(&vfs, "empty.xml", sizeof(kEmpty) - 1);
    std::copy_n(kEmpty, sizeof(kEmpty) - 1, static_cast<char*>(vfs.filedata[mj_findFileVFS(&vfs, "empty.xml")]));
    char error[500] = "";
    empty_model_ = mj_loadXML("empty.xml", &vfs, error, sizeof(error));
    mj_deleteVFS(&vfs);
    if (!empty_model_) return absl::InternalError(absl::StrCat("MuJoCo cannot make the GAN view's model: ", error));
  }
  RETURN_IF_ERROR(MakeRenderContext(empty_model_));
  gan_->Refresh();
  return absl::OkStatus();
}

absl::Status Viewer::MakeRenderContext(const mjModel* m) {
  if (context_made_) {
    mjr_freeContext(&context_);
    mjv_freeScene(&scene_);
    context_made_ = false;
  }
  SDL_GL_MakeCurrent(window_, gl_context_);
  envs::InstallMujocoErrorHandlers();
  mjv_defaultScene(&scene_);
  mjr_defaultContext(&context_);
  mjv_defaultOption(&option_);
  int width = 0, height = 0;
  SDL_GL_GetDrawableSize(window_, &width, &height);
  try {
    mjv_makeScene(m, &scene_, /*maxgeom=*/2000);
    mjr_makeContext(m, &context_, height >= 1200 ? mjFONTSCALE_150 : mjFONTSCALE_100);
  } catch (const envs::MujocoError& e) {
    mjv_freeScene(&scene_);
    return absl::InternalError(absl::StrCat("MuJoCo renderer in the viewer's window: ", e.what()));
  }
  context_made_ = true;
  // For people: shadows and reflections on (pixels for agents have them off).
  scene_.flags[mjRND_SHADOW] = 1;
  scene_.flags[mjRND_REFLECTION] = 1;
  figure_ = std::make_unique<mjvFigure>();
  next_curve_refresh_ = Clock::now();
  return absl::OkStatus();
}

std::string Viewer::CameraName() const {
  if (camera_ < 0 || !simulation_) return "free";
  const char* name = mj_id2name(simulation_->model(), mjOBJ_CAMERA, camera_);
  return name ? name : absl::StrCat("camera ", camera_);
}

void Viewer::InjectKey(SDL_Keycode key) {
  SDL_Event event{};
  event.type = SDL_KEYDOWN;
  event.key.windowID = SDL_GetWindowID(window_);
  event.key.state = SDL_PRESSED;
  event.key.keysym.sym = key;
  event.key.keysym.scancode = SDL_GetScancodeFromKey(key);
  SDL_PushEvent(&event);
  event.type = SDL_KEYUP;
  event.key.state = SDL_RELEASED;
  SDL_PushEvent(&event);
}

void Viewer::InjectDrag(int button, int dx, int dy) {
  SDL_Event event{};
  event.type = SDL_MOUSEBUTTONDOWN;
  event.button.windowID = SDL_GetWindowID(window_);
  event.button.button = uint8_t(button);
  event.button.state = SDL_PRESSED;
  SDL_PushEvent(&event);
  SDL_Event motion{};
  motion.type = SDL_MOUSEMOTION;
  motion.motion.windowID = event.button.windowID;
  motion.motion.xrel = dx;
  motion.motion.yrel = dy;
  SDL_PushEvent(&motion);
  event.type = SDL_MOUSEBUTTONUP;
  event.button.state = SDL_RELEASED;
  SDL_PushEvent(&event);
}

void Viewer::InjectWheel(int clicks) {
  SDL_Event event{};
  event.type = SDL_MOUSEWHEEL;
  event.wheel.windowID = SDL_GetWindowID(window_);
  event.wheel.y = clicks;
  SDL_PushEvent(&event);
}

void Viewer::HandleKey(SDL_Keycode key) {
  switch (key) {
    case SDLK_ESCAPE:
      quit_ = true;
      break;
    case SDLK_p:
      screenshot_requested_ = true;
      break;
    case SDLK_h:
    case SDLK_F1:
      options_.show_help = !options_.show_help;
      break;
    default:
      break;
  }
  // The rest acts on the simulation (none in the GAN view).
  if (!simulation_) return;
  switch (key) {
    case SDLK_SPACE:
      simulation_->TogglePaused();
      break;
    case SDLK_RIGHT:
      simulation_->RequestStep();
      break;
    case SDLK_r:
      simulation_->RequestReset();
      break;
    case SDLK_c:
      // free -> fixed camera 0 -> 1 -> ... -> free
      camera_ = camera_ + 1 < simulation_->model()->ncam ? camera_ + 1 : -1;
      break;
    case SDLK_LEFTBRACKET:
      simulation_->ScaleSpeed(0.5);
      break;
    case SDLK_RIGHTBRACKET:
      simulation_->ScaleSpeed(2.0);
      break;
    default:
      break;
  }
}

void Viewer::HandleEvent(const SDL_Event& event) {
  switch (event.type) {
    case SDL_QUIT:
      quit_ = true;
      break;
    case SDL_KEYDOWN:
      HandleKey(event.key.keysym.sym);
      break;
    case SDL_MOUSEBUTTONDOWN:
    case SDL_MOUSEBUTTONUP: {
      const bool down = event.type == SDL_MOUSEBUTTONDOWN;
      if (event.button.button == SDL_BUTTON_LEFT) button_left_ = down;
      if (event.button.button == SDL_BUTTON_RIGHT) button_right_ = down;
      if (event.button.button == SDL_BUTTON_MIDDLE) button_middle_ = down;
      break;
    }
    case SDL_MOUSEMOTION: {
      if ((!button_left_ && !button_right_ && !button_middle_) || !simulation_) break;
      // Dragging takes over from a fixed camera, starting where it looked.
      if (camera_ >= 0) camera_ = -1;
      // MuJoCo simulate's mapping: left orbits, right pans, middle zooms;
      // shift swaps vertical for horizontal motion.
      const bool shift = SDL_GetModState() & KMOD_SHIFT;
      int action = mjMOUSE_ZOOM;
      if (button_right_) action = shift ? mjMOUSE_MOVE_H : mjMOUSE_MOVE_V;
      else if (button_left_) action = shift ? mjMOUSE_ROTATE_H : mjMOUSE_ROTATE_V;
      int width = 0, height = 0;
      SDL_GetWindowSize(window_, &width, &height);
      mjv_moveCamera(simulation_->model(), action, double(event.motion.xrel) / std::max(height, 1),
                     double(event.motion.yrel) / std::max(height, 1), &scene_, &free_camera_);
      break;
    }
    case SDL_MOUSEWHEEL:
      if (!simulation_) break;
      if (camera_ >= 0) camera_ = -1;
      mjv_moveCamera(simulation_->model(), mjMOUSE_ZOOM, 0, -0.05 * event.wheel.y, &scene_, &free_camera_);
      break;
    default:
      break;  // resizes need nothing: each frame reads the drawable size
  }
}

absl::StatusOr<bool> Viewer::RunFrames(int frames) {
  if (!simulation_ && !gan_) return absl::FailedPreconditionError("Viewer::RunFrames before Show or ShowGan");
  for (int i = 0; i < frames && !quit_; ++i) {
    SDL_Event event;
    while (SDL_PollEvent(&event)) HandleEvent(event);
    if (quit_) break;
    RETURN_IF_ERROR(DrawFrame(nullptr));
  }
  return !quit_;
}

absl::Status Viewer::Run() {
  const auto min_frame = std::chrono::duration<double>(1.0 / kMaxFramesPerSecond);
  while (true) {
    const auto start = Clock::now();
    ASSIGN_OR_RETURN(bool running, RunFrames(1));
    if (!running) return absl::OkStatus();
    const auto spent = Clock::now() - start;
    if (spent < min_frame) std::this_thread::sleep_for(min_frame - spent);
  }
}

absl::StatusOr<Image> Viewer::Screenshot() {
  if (!simulation_ && !gan_) return absl::FailedPreconditionError("Viewer::Screenshot before Show or ShowGan");
  Image image;
  RETURN_IF_ERROR(DrawFrame(&image));
  return image;
}

absl::StatusOr<std::string> Viewer::SaveScreenshot() {
  ASSIGN_OR_RETURN(Image image, Screenshot());
  RETURN_IF_ERROR(WriteScreenshot(image));
  return last_screenshot_;
}

absl::Status Viewer::WriteScreenshot(const Image& image) {
  std::string task = options_.task.empty() ? "view" : options_.task;
  std::replace(task.begin(), task.end(), '.', '_');
  const std::string stamp = absl::FormatTime("%Y%m%d-%H%M%S", absl::Now(), absl::LocalTimeZone());
  std::string path = absl::StrCat(options_.screenshot_dir, "/troupe-", task, "-", stamp, ".png");
  for (int n = 2; std::filesystem::exists(path); ++n) {
    path = absl::StrCat(options_.screenshot_dir, "/troupe-", task, "-", stamp, "-", n, ".png");
  }
  RETURN_IF_ERROR(WritePng(path, image));
  last_screenshot_ = path;
  return absl::OkStatus();
}

absl::Status Viewer::DrawFrame(Image* capture) {
  SDL_GL_MakeCurrent(window_, gl_context_);
  int width = 0, height = 0;
  SDL_GL_GetDrawableSize(window_, &width, &height);
  const mjrRect viewport = {0, 0, width, height};
  if (gan_) {
    mjr_setBuffer(mjFB_WINDOW, &context_);
    DrawGan(viewport);
  } else {
    RETURN_IF_ERROR(DrawScene(viewport));
  }

  // Read back the frame before the swap (the back buffer) if asked to.
  if (capture || screenshot_requested_) {
    rgb_.resize(size_t(width) * height * 3);
    mjr_readPixels(rgb_.data(), nullptr, viewport, &context_);
    Image image(width, height, 3);
    const size_t row = size_t(width) * 3;
    for (int y = 0; y < height; ++y) {
      std::copy_n(rgb_.data() + size_t(height - 1 - y) * row, row, image.pixels.data() + size_t(y) * row);
    }
    if (screenshot_requested_) {
      screenshot_requested_ = false;
      const absl::Status written = WriteScreenshot(image);
      message_ = written.ok() ? absl::StrCat("saved ", last_screenshot_) : std::string(written.message());
      message_until_ = Clock::now() + std::chrono::seconds(4);
      std::fprintf(stderr, "troupe view: %s\n", message_.c_str());
    }
    if (capture) *capture = std::move(image);
  }
  SDL_GL_SwapWindow(window_);

  // Frames per second over half-second windows.
  ++fps_frames_;
  const double elapsed = std::chrono::duration<double>(Clock::now() - fps_start_).count();
  if (elapsed >= 0.5) {
    frames_per_second_ = fps_frames_ / elapsed;
    fps_frames_ = 0;
    fps_start_ = Clock::now();
  }
  return absl::OkStatus();
}

absl::Status Viewer::DrawScene(const mjrRect& viewport) {
  const int width = viewport.width;
  // The state, copied under the simulation's lock.
  mjvCamera fixed;
  mjv_defaultCamera(&fixed);
  fixed.type = mjCAMERA_FIXED;
  fixed.fixedcamid = camera_;
  mjvCamera* camera = camera_ >= 0 ? &fixed : &free_camera_;
  simulation_->Read([&](const mjModel* m, const mjData* d, const SimulationStatus& status) {
    // mjv_updateScene takes a non-const mjData but only reads it.
    mjv_updateScene(m, const_cast<mjData*>(d), &option_, nullptr, camera, mjCAT_ALL, &scene_);
    status_ = status;
  });

  // The scene, then the 2D layers over it.
  mjr_setBuffer(mjFB_WINDOW, &context_);
  mjr_render(viewport, &scene_, &context_);
  int inset_left = width - kMargin;
  if (options_.show_agent_view) DrawAgentView(viewport, &inset_left);
  if (options_.show_actions) DrawActions(viewport, inset_left);
  if (options_.show_curve) DrawCurve(viewport);
  if (options_.show_hud) DrawHud(viewport);
  if (options_.show_help) DrawHelp(viewport);
  return absl::OkStatus();
}

void Viewer::DrawAgentView(const mjrRect& viewport, int* inset_left) {
  const int pw = status_.pixel_width, ph = status_.pixel_height;
  if (pw <= 0 || ph <= 0 || status_.pixels.empty()) return;
  // An integer scale, about a third of the window's height: each agent
  // pixel becomes a scale x scale block (no smoothing).
  const int scale = std::max(1, std::min(int(viewport.height * 0.35 / ph), int(viewport.width * 0.3 / pw)));
  const int w = pw * scale, h = ph * scale;
  const mjrRect rect = {viewport.width - kMargin - w, kMargin, w, h};
  if (rect.left < 0 || rect.height + 2 * kMargin > viewport.height) return;
  // Scale up and flip to OpenGL's bottom-up rows.
  rgb_.resize(size_t(w) * h * 3);
  for (int y = 0; y < h; ++y) {
    const uint8_t* src_row = status_.pixels.data() + size_t(ph - 1 - y / scale) * pw * 3;
    uint8_t* dst = rgb_.data() + size_t(y) * w * 3;
    for (int x = 0; x < w; ++x) std::copy_n(src_row + (x / scale) * 3, 3, dst + x * 3);
  }
  mjr_rectangle({rect.left - 2, rect.bottom - 2, w + 4, h + 4}, 0.9f, 0.9f, 0.9f, 1.0f);
  mjr_drawPixels(rgb_.data(), nullptr, rect, &context_);
  const std::string label = absl::StrCat("agent view ", pw, "x", ph);
  mjr_overlay(mjFONT_NORMAL, mjGRID_BOTTOMLEFT, {rect.left - 2, rect.bottom + h + 4, w + 4, 40}, label.c_str(),
              nullptr, &context_);
  *inset_left = rect.left - 2;
}

void Viewer::DrawActions(const mjrRect& viewport, int right) {
  const int n = int(status_.action.size());
  if (n == 0) return;
  const int left = right - kMargin - kBarWidth;
  if (left < 0) return;
  for (int i = 0; i < n; ++i) {
    // One bar per action dimension, filled from zero to the value, in the
    // action spec's range (unbounded dimensions shown in [-1, 1]).
    const float low = std::isfinite(status_.action_minimum[i]) ? status_.action_minimum[i] : -1.0f;
    const float high = std::isfinite(status_.action_maximum[i]) ? status_.action_maximum[i] : 1.0f;
    auto to_x = [&](float v) { return left + int(std::clamp((v - low) / (high - low), 0.0f, 1.0f) * kBarWidth); };
    const int bottom = kMargin + (n - 1 - i) * (kBarHeight + kBarGap);
    const int zero = to_x(0.0f), value = to_x(status_.action[i]);
    mjr_rectangle({left, bottom, kBarWidth, kBarHeight}, 0.15f, 0.15f, 0.15f, 0.8f);
    mjr_rectangle({std::min(zero, value), bottom, std::max(std::abs(value - zero), 1), kBarHeight}, 0.95f, 0.6f, 0.15f,
                  1.0f);
    mjr_rectangle({zero - 1, bottom - 2, 2, kBarHeight + 4}, 1.0f, 1.0f, 1.0f, 1.0f);
  }
  const int top = kMargin + n * (kBarHeight + kBarGap);
  mjr_overlay(mjFONT_NORMAL, mjGRID_BOTTOMLEFT, {left, top, kBarWidth, 40}, "actions", nullptr, &context_);
}

void Viewer::DrawCurve(const mjrRect& viewport) {
  // Re-read the metrics files about once a second.
  const auto now = Clock::now();
  if (now >= next_curve_refresh_) {
    for (CurveFile& curve : options_.curves) curve.Refresh();
    next_curve_refresh_ = now + std::chrono::seconds(1);
  }
  int lines = 0;
  for (const CurveFile& curve : options_.curves) lines += !curve.curve().points.empty();
  if (lines == 0) return;

  mjvFigure& figure = *figure_;
  mjv_defaultFigure(&figure);
  std::snprintf(figure.title, sizeof(figure.title), "return");
  std::snprintf(figure.xlabel, sizeof(figure.xlabel), "env frames");
  std::snprintf(figure.xformat, sizeof(figure.xformat), "%%.3g");
  std::snprintf(figure.yformat, sizeof(figure.yformat), "%%.0f");
  figure.flg_legend = 1;
  figure.flg_extend = 1;
  figure.figurergba[3] = 0.7f;
  const float colors[3][3] = {{0.95f, 0.6f, 0.15f}, {0.3f, 0.8f, 1.0f}, {0.6f, 1.0f, 0.4f}};
  int line = 0;
  for (const CurveFile& file : options_.curves) {
    const auto& points = file.curve().points;
    if (points.empty() || line >= 3) continue;
    // At most mjMAXLINEPNT points: an even subsample, always with the last.
    const int n = std::min<int>(points.size(), mjMAXLINEPNT);
    for (int i = 0; i < n; ++i) {
      const size_t source = n == 1 ? 0 : size_t(double(i) * (points.size() - 1) / (n - 1));
      figure.linedata[line][2 * i] = float(points[source].first);
      figure.linedata[line][2 * i + 1] = float(points[source].second);
    }
    figure.linepnt[line] = n;
    std::copy_n(colors[line], 3, figure.linergb[line]);
    std::snprintf(figure.linename[line], sizeof(figure.linename[line]), "%s", file.curve().label.c_str());
    ++line;
  }
  const int w = std::min(420, int(viewport.width * 0.35)), h = std::min(280, int(viewport.height * 0.35));
  mjr_figure({kMargin, kMargin, w, h}, &figure, &context_);
}

void Viewer::DrawHud(const mjrRect& viewport) {
  const SimulationStatus& s = status_;
  std::string titles = "Task\nPolicy\nVersion\nEpisode\nStep\nReturn\nLast return\nSpeed\nSteps/s\nFrames/s\nCamera";
  std::string values = absl::StrFormat(
      "%s\n%s\n%s\n%d\n%d\n%.1f\n%s\n%s%s\n%.0f\n%.0f\n%s", options_.task.empty() ? "-" : options_.task, s.policy,
      s.version.empty() ? "-" : s.version, s.episode, s.step, s.episode_return,
      s.has_last_episode ? absl::StrFormat("%.1f", s.last_episode_return) : "-", FormatSpeed(s.speed),
      s.paused ? " (paused)" : "", s.steps_per_second, frames_per_second_, CameraName());
  if (!s.error.ok()) {
    titles += "\nError";
    values += absl::StrCat("\n", s.error.message());
  }
  if (!message_.empty() && Clock::now() < message_until_) {
    titles += "\nMessage";
    values += absl::StrCat("\n", message_);
  }
  titles += "\n\nh: help";
  values += "\n\n ";
  mjr_overlay(mjFONT_NORMAL, mjGRID_TOPLEFT, viewport, titles.c_str(), values.c_str(), &context_);
  // A big PAUSED at the top centre.
  if (s.paused) {
    mjr_overlay(mjFONT_BIG, mjGRID_TOPLEFT, {viewport.width / 2 - 60, 0, viewport.width / 2 + 60, viewport.height},
                "PAUSED", nullptr, &context_);
  }
}

void Viewer::DrawHelp(const mjrRect& viewport) {
  mjr_overlay(mjFONT_NORMAL, mjGRID_TOPRIGHT, viewport, kHelpKeys, kHelpActions, &context_);
}

void Viewer::DrawGan(const mjrRect& viewport) {
  // Re-read the run's files about once a second.
  const auto now = Clock::now();
  if (now >= next_curve_refresh_) {
    gan_->Refresh();
    next_curve_refresh_ = now + std::chrono::seconds(1);
  }
  mjr_rectangle(viewport, 0.1f, 0.1f, 0.12f, 1.0f);

  // The sample grid on the left, as large as fits, nearest-neighbour (no
  // smoothing), flipped to OpenGL's bottom-up rows.
  const int label_height = 30;
  int grid_right = kMargin;
  if (const std::optional<Image>& grid = gan_->grid(); grid && grid->width > 0 && grid->height > 0) {
    const double scale = std::min(double(viewport.width) * 0.6 / grid->width,
                                  double(viewport.height - 2 * kMargin - label_height) / grid->height);
    const int w = std::max(1, int(grid->width * scale)), h = std::max(1, int(grid->height * scale));
    const mjrRect rect = {kMargin, (viewport.height - label_height - h) / 2, w, h};
    rgb_.resize(size_t(w) * h * 3);
    const int c = grid->channels;
    for (int y = 0; y < h; ++y) {
      const int source_y = std::min(grid->height - 1, int((h - 1 - y) / scale));
      uint8_t* dst = rgb_.data() + size_t(y) * w * 3;
      for (int x = 0; x < w; ++x) {
        const uint8_t* p = grid->at(std::min(grid->width - 1, int(x / scale)), source_y);
        dst[3 * x] = p[0];
        dst[3 * x + 1] = p[c >= 3 ? 1 : 0];
        dst[3 * x + 2] = p[c >= 3 ? 2 : 0];
      }
    }
    mjr_drawPixels(rgb_.data(), nullptr, rect, &context_);
    const std::string label =
        absl::StrCat("samples: ", std::filesystem::path(gan_->grid_path()).filename().string());
    mjr_overlay(mjFONT_NORMAL, mjGRID_BOTTOMLEFT, {rect.left, rect.bottom + h + 4, w, label_height}, label.c_str(),
                nullptr, &context_);
    grid_right = rect.left + w + kMargin;
  } else {
    mjr_overlay(mjFONT_BIG, mjGRID_BOTTOMLEFT, {kMargin, viewport.height / 2, viewport.width / 2, 60},
                "waiting for the first sample grid", nullptr, &context_);
  }

  // The FID curve on the right, lower half.
  const Curve& fid = gan_->fid();
  if (!fid.points.empty() && options_.show_curve) {
    mjvFigure& figure = *figure_;
    mjv_defaultFigure(&figure);
    std::snprintf(figure.title, sizeof(figure.title), "FID (lower is better)");
    std::snprintf(figure.xlabel, sizeof(figure.xlabel), "images seen");
    std::snprintf(figure.xformat, sizeof(figure.xformat), "%%.3g");
    std::snprintf(figure.yformat, sizeof(figure.yformat), "%%.1f");
    figure.flg_extend = 1;
    const int n = std::min<int>(fid.points.size(), mjMAXLINEPNT);
    for (int i = 0; i < n; ++i) {
      const size_t source = n == 1 ? 0 : size_t(double(i) * (fid.points.size() - 1) / (n - 1));
      figure.linedata[0][2 * i] = float(fid.points[source].first);
      figure.linedata[0][2 * i + 1] = float(fid.points[source].second);
    }
    figure.linepnt[0] = n;
    figure.linergb[0][0] = 0.95f, figure.linergb[0][1] = 0.6f, figure.linergb[0][2] = 0.15f;
    const int w = std::max(viewport.width - grid_right - kMargin, 0);
    if (w > 100) mjr_figure({grid_right, kMargin, w, std::min(viewport.height / 2, 360)}, &figure, &context_);
  }

  // The HUD, top right.
  if (options_.show_hud) {
    std::string age = "-";
    if (!gan_->grid_path().empty()) {
      const auto seconds =
          std::chrono::duration_cast<std::chrono::seconds>(std::filesystem::file_time_type::clock::now() - gan_->grid_time());
      age = absl::StrCat(std::max<int64_t>(seconds.count(), 0), "s ago");
    }
    std::string titles = "Run\nMode\nEvaluations\nImages seen\nLatest FID\nSamples written\nFrames/s";
    std::string values = absl::StrFormat(
        "%s\nGAN\n%d\n%s\n%s\n%s\n%.0f", gan_->run_dir(), fid.points.size(),
        fid.points.empty() ? "-" : absl::StrFormat("%.0f", fid.points.back().first),
        fid.points.empty() ? "-" : absl::StrFormat("%.2f", fid.points.back().second), age, frames_per_second_);
    if (!gan_->error().empty()) {
      titles += "\nError";
      values += absl::StrCat("\n", gan_->error());
    }
    if (!message_.empty() && Clock::now() < message_until_) {
      titles += "\nMessage";
      values += absl::StrCat("\n", message_);
    }
    mjr_overlay(mjFONT_NORMAL, mjGRID_TOPRIGHT, viewport, titles.c_str(), values.c_str(), &context_);
  }
  if (options_.show_help) {
    mjr_overlay(mjFONT_NORMAL, mjGRID_TOPLEFT, viewport, "P\nH\nEsc", "save PNG screenshot\nthis help\nquit",
                &context_);
  }
}

}  // namespace troupe::viz
