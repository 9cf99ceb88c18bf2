# SPDX-License-Identifier: Apache-2.0
# Interface targets for warnings and sanitizers (linked PRIVATE by every zinf target, so no
# global flag edits), and the helpers that declare a layer library and its header check.

add_library(zinf_warnings INTERFACE)
add_library(zinf::warnings ALIAS zinf_warnings)
target_compile_options(zinf_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wconversion -Wno-sign-conversion
  -Wnon-virtual-dtor -Woverloaded-virtual -Wimplicit-fallthrough>)
# GCC 12 at -O3 reports -Wrestrict on std::string concatenation inside libstdc++ (GCC bug
# 105651, fixed in 13); every error message here is built that way, so the false positive is
# silenced for that compiler only rather than contorting each message.
target_compile_options(zinf_warnings INTERFACE
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>,$<VERSION_LESS:$<CXX_COMPILER_VERSION>,13>>:-Wno-restrict>)
if(ZINF_WERROR)
  target_compile_options(zinf_warnings INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-Werror>)
endif()

add_library(zinf_sanitizers INTERFACE)
add_library(zinf::sanitizers ALIAS zinf_sanitizers)
if(ZINF_SANITIZE)
  # C and C++ only: nvcc takes no -fsanitize (the one kernel's host stub is trivial).
  target_compile_options(zinf_sanitizers INTERFACE $<$<COMPILE_LANGUAGE:C,CXX>:-fsanitize=${ZINF_SANITIZE}
    -fno-omit-frame-pointer -fno-sanitize-recover=all>)
  target_link_options(zinf_sanitizers INTERFACE -fsanitize=${ZINF_SANITIZE})
endif()

# zinf_add_layer(<name> SOURCES ... [PUBLIC_DEPS ...] [PRIVATE_DEPS ...])
# declares zinf_<name> (alias zinf::<name>) with PUBLIC include/ and PRIVATE src/.
set_property(GLOBAL PROPERTY ZINF_PUBLIC_HEADERS "")
function(zinf_add_layer name)
  cmake_parse_arguments(ARG "" "" "SOURCES;PUBLIC_DEPS;PRIVATE_DEPS" ${ARGN})
  add_library(zinf_${name} ${ARG_SOURCES})
  add_library(zinf::${name} ALIAS zinf_${name})
  target_include_directories(zinf_${name}
    PUBLIC $<BUILD_INTERFACE:${CMAKE_CURRENT_SOURCE_DIR}/include> $<INSTALL_INTERFACE:include>
    PRIVATE ${CMAKE_CURRENT_SOURCE_DIR}/src)
  target_link_libraries(zinf_${name} PUBLIC ${ARG_PUBLIC_DEPS}
    PRIVATE ${ARG_PRIVATE_DEPS} zinf::warnings zinf::sanitizers)
  set_target_properties(zinf_${name} PROPERTIES POSITION_INDEPENDENT_CODE ON)
  file(GLOB_RECURSE headers CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/include/zinf/*.h)
  foreach(h IN LISTS headers)
    set_property(GLOBAL APPEND PROPERTY ZINF_PUBLIC_HEADERS "${h}|zinf_${name}")
  endforeach()
endfunction()

# zinf_check_headers: every public header compiles on its own (docs/style.md section 1).
function(zinf_add_header_check)
  get_property(entries GLOBAL PROPERTY ZINF_PUBLIC_HEADERS)
  set(sources "")
  set(libs "")
  foreach(e IN LISTS entries)
    string(REPLACE "|" ";" parts "${e}")
    list(GET parts 0 header)
    list(GET parts 1 lib)
    string(REGEX REPLACE "^.*/include/" "" rel "${header}")
    string(MAKE_C_IDENTIFIER "${rel}" id)
    set(src ${CMAKE_BINARY_DIR}/header_check/${id}.cc)
    file(CONFIGURE OUTPUT ${src} CONTENT "#include \"${rel}\"\n#include \"${rel}\"\n")
    list(APPEND sources ${src})
    list(APPEND libs ${lib})
  endforeach()
  list(REMOVE_DUPLICATES libs)
  add_library(zinf_check_headers OBJECT EXCLUDE_FROM_ALL ${sources})
  target_link_libraries(zinf_check_headers PRIVATE ${libs} zinf::warnings)
endfunction()
