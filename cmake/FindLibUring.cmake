# SPDX-License-Identifier: Apache-2.0
# Finds liburing through pkg-config and checks that it has the calls zinf uses
# (sparse file/buffer tables, the 6.1 setup flags), so an old liburing is "not found" rather
# than a compile error deep in swap/.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(PC_LIBURING QUIET liburing)
endif()
find_path(LibUring_INCLUDE_DIR liburing.h HINTS ${PC_LIBURING_INCLUDE_DIRS})
find_library(LibUring_LIBRARY uring HINTS ${PC_LIBURING_LIBRARY_DIRS})

if(LibUring_INCLUDE_DIR AND LibUring_LIBRARY)
  include(CheckSymbolExists)
  include(CMakePushCheckState)
  cmake_push_check_state(RESET)
  set(CMAKE_REQUIRED_INCLUDES ${LibUring_INCLUDE_DIR})
  set(CMAKE_REQUIRED_LIBRARIES ${LibUring_LIBRARY})
  check_symbol_exists(io_uring_register_files_sparse liburing.h LibUring_HAS_SPARSE)
  check_symbol_exists(IORING_SETUP_DEFER_TASKRUN liburing.h LibUring_HAS_DEFER_TASKRUN)
  cmake_pop_check_state()
endif()

include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(LibUring
  REQUIRED_VARS LibUring_LIBRARY LibUring_INCLUDE_DIR LibUring_HAS_SPARSE LibUring_HAS_DEFER_TASKRUN
  VERSION_VAR PC_LIBURING_VERSION)

if(LibUring_FOUND AND NOT TARGET LibUring::LibUring)
  add_library(LibUring::LibUring UNKNOWN IMPORTED)
  set_target_properties(LibUring::LibUring PROPERTIES
    IMPORTED_LOCATION ${LibUring_LIBRARY}
    INTERFACE_INCLUDE_DIRECTORIES ${LibUring_INCLUDE_DIR})
endif()
