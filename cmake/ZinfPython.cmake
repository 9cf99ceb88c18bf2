# SPDX-License-Identifier: Apache-2.0
# Installing the Python package zinf (install component `python`, which pip's build installs
# alone: pyproject.toml): the native module and the pure-Python files beside it.
include(GNUInstallDirs)

# Installs the package folder SRC (python/zinf: *.py, *.pyi, py.typed) with the native module:
# TARGET (built here) or MODULE (a file another build tree made). The folder zinf/ goes under
# ZINF_PYTHON_INSTALL_DIR, relative to the prefix: lib/python3.X/site-packages for `cmake
# --install`, the wheel's root for pip's build (scikit-build-core sets SKBUILD and installs
# into the wheel's site-packages).
function(zinf_install_python_package src)
  cmake_parse_arguments(arg "" "TARGET;MODULE" "" ${ARGN})
  if(SKBUILD)
    set(default_dir ".")
  else()
    set(default_dir
      "${CMAKE_INSTALL_LIBDIR}/python${Python3_VERSION_MAJOR}.${Python3_VERSION_MINOR}/site-packages")
  endif()
  set(ZINF_PYTHON_INSTALL_DIR "${default_dir}"
    CACHE STRING "Where cmake --install puts the zinf Python package (relative to the prefix)")
  cmake_path(SET dest NORMALIZE "${ZINF_PYTHON_INSTALL_DIR}/zinf")   # "./zinf" -> "zinf"
  if(arg_TARGET)
    install(TARGETS ${arg_TARGET} LIBRARY DESTINATION ${dest} COMPONENT python)
  else()
    install(FILES ${arg_MODULE} DESTINATION ${dest} COMPONENT python)
  endif()
  install(DIRECTORY ${src}/ DESTINATION ${dest} COMPONENT python
    FILES_MATCHING PATTERN "*.py" PATTERN "*.pyi" PATTERN "py.typed"
    PATTERN "__pycache__" EXCLUDE)
endfunction()

# pip's install of the module that another build tree made (ZINF_PYTHON_FROM_BUILD=that tree,
# its target zinf_python built): scripts/test.sh packages build/release's module this way, so
# CI compiles nothing twice. The module must be one the installing interpreter imports (the
# same extension suffix: both CPython 3.11 in CI); anything else is refused here, before a
# wheel is made.
function(zinf_python_from_build build_dir)
  find_package(Python3 COMPONENTS Interpreter REQUIRED)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c
      "import sysconfig; print(sysconfig.get_config_var('EXT_SUFFIX'))"
    OUTPUT_VARIABLE suffix OUTPUT_STRIP_TRAILING_WHITESPACE COMMAND_ERROR_IS_FATAL ANY)
  set(module ${build_dir}/python/zinf/_native${suffix})
  if(NOT EXISTS ${module})
    file(GLOB found ${build_dir}/python/zinf/_native*)
    message(FATAL_ERROR "zinf: ZINF_PYTHON_FROM_BUILD=${build_dir} has no ${module} for "
      "${Python3_EXECUTABLE} (found there: '${found}'): build its target zinf_python, "
      "configured for this Python version (-DPython3_EXECUTABLE)")
  endif()
  message(STATUS "zinf: packaging the module ${module}; nothing is compiled")
  zinf_install_python_package(${PROJECT_SOURCE_DIR}/python/zinf MODULE ${module})
  # The target pip's build asks for (pyproject.toml): here there is nothing to build.
  add_custom_target(zinf_python)
endfunction()
