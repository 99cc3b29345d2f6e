// What this build of troupe is: the commit its sources were at when it was
// built (cmake/build_info.cmake), so that a figure, a run or a report can
// say which code made it.
#ifndef TROUPE_COMMON_BUILD_INFO_H_
#define TROUPE_COMMON_BUILD_INFO_H_

namespace troupe {

// "0123abcdef01", "0123abcdef01+changes" (sources edited since that commit;
// changes to docs/, tests/ and Markdown do not count) or "unknown" (built
// outside a git checkout, e.g. from a pip sdist).
const char* BuildCommit();

}  // namespace troupe

#endif  // TROUPE_COMMON_BUILD_INFO_H_
