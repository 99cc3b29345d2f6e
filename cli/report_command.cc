#include <cstdio>

#include "cli/commands.h"
#include "viz/report.h"

namespace troupe::cli {

void AddReportCommand(CLI::App& app, int* exit_code) {
  auto dir = std::make_shared<std::string>();
  auto output = std::make_shared<std::string>();
  CLI::App* cmd = app.add_subcommand(
      "report", "Write one self-contained HTML page of a run directory, or of a directory of runs (a sweep): curves, "
                "metrics tables, videos, config");
  cmd->add_option("dir", *dir, "A run directory (runs/NAME-DATE-TIME) or a folder whose subfolders are runs")
      ->required();
  cmd->add_option("-o,--output", *output, "Where to write the page (default DIR/report.html)");
  cmd->callback([dir, output, exit_code] {
    auto written = viz::WriteReport(*dir, *output);
    if (!written.ok()) {
      std::fprintf(stderr, "troupe report: %s\n", std::string(written.status().message()).c_str());
      *exit_code = written.status().code() == absl::StatusCode::kInvalidArgument ? 2 : 1;
      return;
    }
    std::printf("troupe report: wrote %s (open it in a browser)\n", written->c_str());
  });
}

}  // namespace troupe::cli
