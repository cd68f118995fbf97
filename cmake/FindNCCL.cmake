# FindNCCL: NCCL ships no CMake or pkg-config files. Looks under NCCL_ROOT (variable or
# environment), then the CUDA Toolkit, then the system. Defines NCCL_FOUND, NCCL_VERSION and the
# imported target NCCL::NCCL.
set(_nccl_hints ${NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda)
find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${_nccl_hints} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY NAMES nccl HINTS ${_nccl_hints} PATH_SUFFIXES lib lib64)
if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  foreach(_part MAJOR MINOR PATCH)
    file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _line REGEX "#define NCCL_${_part}[ \t]+[0-9]+")
    string(REGEX REPLACE ".*NCCL_${_part}[ \t]+([0-9]+).*" "\\1" _nccl_${_part} "${_line}")
  endforeach()
  set(NCCL_VERSION "${_nccl_MAJOR}.${_nccl_MINOR}.${_nccl_PATCH}")
endif()
include(FindPackageHandleStandardArgs)
find_package_handle_standard_args(NCCL REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
                                  VERSION_VAR NCCL_VERSION)
if(NCCL_FOUND AND NOT TARGET NCCL::NCCL)
  add_library(NCCL::NCCL UNKNOWN IMPORTED)
  set_target_properties(NCCL::NCCL PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                        INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()
mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
