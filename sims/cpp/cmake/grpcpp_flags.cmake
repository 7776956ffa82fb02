# grpc++ and protobuf as pkg-config resolves them, asked twice (--cflags, --libs) and cached in the
# build folder. pkg_check_modules asks sixteen questions (each field, shared and static), and
# Debian's pkgconf 1.8 spends about a CPU-second on each walking absl's hundred-odd .pc files: 25 s
# of every fresh configure on this project's 2-core VM (docs/benchmarks.md), 2 s this way.
#
# Sets SIMBRIDGE_GRPCPP_INCLUDE_DIRS, SIMBRIDGE_GRPCPP_CFLAGS_OTHER and SIMBRIDGE_GRPCPP_LINK_LIBRARIES
# (absolute paths, as pkg_check_modules' IMPORTED_TARGET resolves them), and the INTERFACE target
# simbridge_grpcpp with all three, for code that includes gRPC itself (the SDK's sources and tests).
find_package(PkgConfig REQUIRED)

function(_simbridge_pkg_config out)
  execute_process(COMMAND "${PKG_CONFIG_EXECUTABLE}" ${ARGN} grpc++ protobuf
    OUTPUT_VARIABLE text ERROR_VARIABLE err RESULT_VARIABLE rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "simbridge: pkg-config ${ARGN} grpc++ protobuf failed (${err}): "
                        "apt-get install libgrpc++-dev libprotobuf-dev pkg-config")
  endif()
  separate_arguments(text UNIX_COMMAND "${text}")
  set(${out} "${text}" PARENT_SCOPE)
endfunction()

if(NOT DEFINED SIMBRIDGE_GRPCPP_LINK_LIBRARIES)
  _simbridge_pkg_config(_cflags --cflags)
  _simbridge_pkg_config(_libs --libs)
  set(_includes "")
  set(_options "")
  foreach(_flag IN LISTS _cflags)
    if(_flag MATCHES "^-I(.+)")
      list(APPEND _includes "${CMAKE_MATCH_1}")
    else()
      list(APPEND _options "${_flag}")
    endif()
  endforeach()
  set(_dirs "")
  foreach(_flag IN LISTS _libs)
    if(_flag MATCHES "^-L(.+)")
      list(APPEND _dirs "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(_linked "")
  foreach(_flag IN LISTS _libs)
    if(_flag MATCHES "^-l(.+)")
      set(_name "${CMAKE_MATCH_1}")
      find_library(SIMBRIDGE_LIB_${_name} NAMES "${_name}" HINTS ${_dirs})
      mark_as_advanced(SIMBRIDGE_LIB_${_name})
      if(SIMBRIDGE_LIB_${_name})
        list(APPEND _linked "${SIMBRIDGE_LIB_${_name}}")
      else()
        list(APPEND _linked "${_name}")   # the compiler's own (libatomic): the linker finds it by name
      endif()
    endif()   # -L folders were the hints; -Wl,--push-state,--as-needed around -latomic: not needed
  endforeach()
  set(SIMBRIDGE_GRPCPP_INCLUDE_DIRS "${_includes}" CACHE INTERNAL "grpc++ and protobuf: -I folders")
  set(SIMBRIDGE_GRPCPP_CFLAGS_OTHER "${_options}" CACHE INTERNAL "grpc++ and protobuf: other compile flags")
  set(SIMBRIDGE_GRPCPP_LINK_LIBRARIES "${_linked}" CACHE INTERNAL "grpc++ and protobuf: libraries, absolute paths")
endif()

add_library(simbridge_grpcpp INTERFACE)
target_include_directories(simbridge_grpcpp INTERFACE ${SIMBRIDGE_GRPCPP_INCLUDE_DIRS})
target_compile_options(simbridge_grpcpp INTERFACE ${SIMBRIDGE_GRPCPP_CFLAGS_OTHER})
target_link_libraries(simbridge_grpcpp INTERFACE ${SIMBRIDGE_GRPCPP_LINK_LIBRARIES})
