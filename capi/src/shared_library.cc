// SPDX-License-Identifier: Apache-2.0
// libzinf.so's own translation unit. The library's content is the layers, linked whole
// (capi/CMakeLists.txt); CMake needs one source of the target's own, and this one records the
// version the library was built as, which `strings libzinf.so | grep zinf-version` finds.
#include "zinf/config.h"

namespace zinf::detail {

/// The version string of this build, kept in the binary for inspection of an installed copy.
extern const char kLibraryVersionTag[];
const char kLibraryVersionTag[] = "zinf-version " ZINF_VERSION;

}  // namespace zinf::detail
