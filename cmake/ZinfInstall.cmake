# SPDX-License-Identifier: Apache-2.0
# `cmake --install`: headers, libzinf.so, the zinf CLI, the CMake package (find_package(zinf)
# -> zinf::zinf) and zinf.pc. Every installed path is relative to the prefix (GNUInstallDirs),
# and the package files locate the prefix from their own location, so an installed tree can be
# moved or packaged as a whole.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(ZINF_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/zinf)

install(TARGETS zinf_shared EXPORT zinfTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
if(TARGET zinf)
  install(TARGETS zinf RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()

# Public headers of every layer, the generated zinf/config.h and the C API. Raw CUDA handles
# live only in zinf/cuda/cuda_interop.h (docs/style.md section 1), installed only with CUDA.
foreach(layer common swap cuda prefetch adam optim offload)
  set(exclude "")
  if(NOT ZINF_HAVE_CUDA)
    set(exclude PATTERN cuda_interop.h EXCLUDE)
  endif()
  install(DIRECTORY ${PROJECT_SOURCE_DIR}/${layer}/include/zinf
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
    FILES_MATCHING PATTERN "*.h" ${exclude})
endforeach()
install(FILES ${PROJECT_BINARY_DIR}/generated/zinf/config.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/zinf)
install(FILES ${PROJECT_SOURCE_DIR}/capi/include/zinf.h DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})

# The CMake package.
install(EXPORT zinfTargets NAMESPACE zinf:: DESTINATION ${ZINF_CMAKE_INSTALL_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/zinfConfig.cmake.in
  ${PROJECT_BINARY_DIR}/package/zinfConfig.cmake
  INSTALL_DESTINATION ${ZINF_CMAKE_INSTALL_DIR})
# 0.x: a new minor version may change the ABI, so only the same minor version is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/package/zinfConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/package/zinfConfig.cmake
  ${PROJECT_BINARY_DIR}/package/zinfConfigVersion.cmake
  DESTINATION ${ZINF_CMAKE_INSTALL_DIR})

# pkg-config: the prefix is found from the .pc file's own directory (${pcfiledir}), so the file
# holds no absolute path.
file(RELATIVE_PATH ZINF_PC_TO_PREFIX /zinf-prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /zinf-prefix)
string(REGEX REPLACE "/$" "" ZINF_PC_TO_PREFIX "${ZINF_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/zinf.pc.in ${PROJECT_BINARY_DIR}/package/zinf.pc @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/package/zinf.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
