#include "common/build_info.h"

#include "troupe_build_info.h"  // generated: TROUPE_BUILD_COMMIT

namespace troupe {

const char* BuildCommit() { return TROUPE_BUILD_COMMIT; }

}  // namespace troupe
