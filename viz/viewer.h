// The SDL2 viewer: an OpenGL window drawn by MuJoCo's renderer at window
// resolution (shadows and reflections on), a free camera and the task's
// fixed cameras, the agent's pixel observation scaled up without smoothing,
// action bars, a HUD, a learning-curve panel and a help overlay.
//
// Threading: a Viewer lives on one thread (the main thread: SDL wants its
// events there) and draws there; the Simulation it shows steps the physics
// on its own thread, and the viewer reads the state under the Simulation's
// lock once per frame.
//
// A GAN run directory has no simulation: ShowGan draws its newest sample
// grid (pixels unsmoothed) and FID curve instead, re-read once a second.
//
// Driving it: Run() until the window closes or Esc, or, headless in tests,
// RunFrames(n) / InjectKey / Screenshot.
//
// Keys: space pause, right arrow one step while paused, r new episode,
// c next camera, [ and ] slower/faster, p PNG screenshot, h help, Esc quit.
// Mouse: left drag orbit, right drag pan, middle drag or wheel zoom.
#ifndef TROUPE_VIZ_VIEWER_H_
#define TROUPE_VIZ_VIEWER_H_

#include <SDL2/SDL.h>
#include <mujoco/mujoco.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/image.h"
#include "viz/curve.h"
#include "viz/gan_samples.h"
#include "viz/simulation.h"

namespace troupe::viz {

struct ViewerOptions {
  int width = 1280;
  int height = 720;
  std::string title = "troupe view";
  std::string task;  // the HUD's task line
  bool vsync = true;
  bool show_hud = true;
  bool show_help = false;
  bool show_agent_view = true;  // the pixel observation inset
  bool show_actions = true;
  bool show_curve = true;       // drawn when a curve file has points
  std::string screenshot_dir = ".";
  std::vector<CurveFile> curves;  // metrics files plotted in the curve panel
};

// OK if a display is named (DISPLAY or WAYLAND_DISPLAY); otherwise
// FailedPrecondition saying so and how to run under a virtual X server.
absl::Status CheckDisplay();

class Viewer {
 public:
  // Opens the window and its OpenGL context. Errors: CheckDisplay's;
  // Unavailable with SDL's message (and the DISPLAY tried) if SDL cannot
  // open the display, the window or the GL context.
  static absl::StatusOr<std::unique_ptr<Viewer>> Create(ViewerOptions options);
  ~Viewer();
  Viewer(const Viewer&) = delete;
  Viewer& operator=(const Viewer&) = delete;

  // Shows `simulation` from now on: makes MuJoCo's scene and GPU context
  // for its model (Internal with MuJoCo's message on failure). Make the
  // Viewer first: Mesa's llvmpipe then rasterizes the window with all
  // cores, while the env's headless pixels stay single-threaded.
  absl::Status Show(std::unique_ptr<Simulation> simulation);

  // Shows a GAN run's samples and FID curve from now on (instead of a
  // simulation). Internal with MuJoCo's message if its 2D renderer cannot
  // be made.
  absl::Status ShowGan(std::unique_ptr<GanSamples> samples);

  // Draws frames until the window is closed or Esc is pressed.
  absl::Status Run();

  // Handles pending input and draws `frames` frames, as fast as it can (no
  // vsync wait). Returns false once quitting was asked for.
  absl::StatusOr<bool> RunFrames(int frames);

  // Queues a key press (SDL_PushEvent) for the next RunFrames.
  void InjectKey(SDL_Keycode key);
  // Queues a mouse drag of (dx, dy) window pixels with `button` held.
  void InjectDrag(int button, int dx, int dy);
  // Queues a wheel turn (positive: zoom in).
  void InjectWheel(int clicks);

  // Draws a frame and returns it, window size, rows top-down.
  absl::StatusOr<Image> Screenshot();
  // Draws a frame and writes it as PNG under options.screenshot_dir, as the
  // p key does. Returns the path.
  absl::StatusOr<std::string> SaveScreenshot();

  Simulation& simulation() { return *simulation_; }
  GanSamples* gan() { return gan_.get(); }
  ViewerOptions& options() { return options_; }
  // -1: the free camera; else the model's fixed camera id.
  int camera() const { return camera_; }
  std::string CameraName() const;
  double frames_per_second() const { return frames_per_second_; }
  const std::string& last_screenshot() const { return last_screenshot_; }
  SDL_Window* window() { return window_; }

 private:
  Viewer(ViewerOptions options) : options_(std::move(options)) {}
  // Handles one SDL event; sets quit_.
  void HandleEvent(const SDL_Event& event);
  void HandleKey(SDL_Keycode key);
  // Draws one frame into the back buffer; `capture` (if not null) receives
  // it before the swap.
  absl::Status DrawFrame(Image* capture);
  void DrawAgentView(const mjrRect& viewport, int* inset_left);
  void DrawActions(const mjrRect& viewport, int right);
  void DrawCurve(const mjrRect& viewport);
  void DrawHud(const mjrRect& viewport);
  void DrawHelp(const mjrRect& viewport);
  // The simulation's scene and its 2D layers.
  absl::Status DrawScene(const mjrRect& viewport);
  // The GAN view: grid, FID figure and its HUD.
  void DrawGan(const mjrRect& viewport);
  // (Re)makes MuJoCo's scene and GPU context for `m`.
  absl::Status MakeRenderContext(const mjModel* m);
  absl::Status WriteScreenshot(const Image& image);

  ViewerOptions options_;
  SDL_Window* window_ = nullptr;
  SDL_GLContext gl_context_ = nullptr;
  bool sdl_initialized_ = false;
  bool context_made_ = false;
  bool quit_ = false;

  std::unique_ptr<Simulation> simulation_;
  std::unique_ptr<GanSamples> gan_;
  mjModel* empty_model_ = nullptr;  // the GAN view's: MuJoCo's 2D drawing needs a context made from a model
  mjvScene scene_;
  mjvOption option_;
  mjrContext context_;
  mjvCamera free_camera_;
  int camera_ = -1;
  std::unique_ptr<mjvFigure> figure_;
  SimulationStatus status_;  // the copy drawn this frame

  // Mouse state for camera dragging.
  bool button_left_ = false, button_right_ = false, button_middle_ = false;

  // Frame rate over the last half second; a pending p-key screenshot.
  std::chrono::steady_clock::time_point fps_start_ = std::chrono::steady_clock::now();
  int fps_frames_ = 0;
  double frames_per_second_ = 0;
  bool screenshot_requested_ = false;
  std::string last_screenshot_;
  std::string message_;  // shown for a few seconds (screenshot saved, errors)
  std::chrono::steady_clock::time_point message_until_;
  std::chrono::steady_clock::time_point next_curve_refresh_;
  std::vector<uint8_t> rgb_;  // scratch: read-back and scaled inset pixels
};

}  // namespace troupe::viz

#endif  // TROUPE_VIZ_VIEWER_H_
