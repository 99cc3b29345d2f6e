// A live one-line progress display for long work (frames, fps, returns,
// updates/s): redrawn in place on a terminal, printed as plain lines at a
// slower rate when stderr is a file or pipe.
#ifndef TROUPE_COMMON_STATUS_LINE_H_
#define TROUPE_COMMON_STATUS_LINE_H_

#include <chrono>
#include <string>

namespace troupe {

class StatusLine {
 public:
  // Redraws at most every `interval` (4x less often when not a terminal).
  explicit StatusLine(std::chrono::milliseconds interval = std::chrono::milliseconds(250));
  ~StatusLine();  // ends the line

  // Shows `text` if the interval has passed since the last draw, or if `force`.
  void Update(const std::string& text, bool force = false);

 private:
  bool terminal_;
  std::chrono::milliseconds interval_;
  std::chrono::steady_clock::time_point last_;
  bool drawn_ = false;
};

}  // namespace troupe

#endif  // TROUPE_COMMON_STATUS_LINE_H_
