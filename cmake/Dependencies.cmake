# Every dependency is a Debian package. CAF 0.17.6 ships no CMake config or pkg-config
# file, so its libraries are found by hand.
find_package(Threads REQUIRED)
find_package(PkgConfig REQUIRED)

find_path(CAF_INCLUDE_DIR caf/all.hpp REQUIRED)
find_library(CAF_CORE_LIBRARY caf_core REQUIRED)
find_library(CAF_IO_LIBRARY caf_io REQUIRED)
add_library(caf::core UNKNOWN IMPORTED)
set_target_properties(caf::core PROPERTIES IMPORTED_LOCATION ${CAF_CORE_LIBRARY}
  INTERFACE_INCLUDE_DIRECTORIES ${CAF_INCLUDE_DIR} INTERFACE_LINK_LIBRARIES Threads::Threads)
add_library(caf::io UNKNOWN IMPORTED)
set_target_properties(caf::io PROPERTIES IMPORTED_LOCATION ${CAF_IO_LIBRARY}
  INTERFACE_LINK_LIBRARIES caf::core)

find_package(CapnProto REQUIRED)
find_package(spdlog REQUIRED)
# Node links: HMAC-SHA256 and random nonces (Debian libssl-dev).
find_package(OpenSSL REQUIRED COMPONENTS Crypto)
find_package(nlohmann_json REQUIRED)
# Asio and Beast are header-only (Debian libboost1.74-dev).
find_package(Boost 1.74 REQUIRED)
find_package(CLI11 REQUIRED)
find_package(Catch2 2 REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
pkg_check_modules(XXHASH REQUIRED IMPORTED_TARGET libxxhash)

# CUDA is optional: on when nvcc exists (kernels come with the CUDA backend issue).
set(TROUPE_HAS_CUDA OFF)
if(TROUPE_ENABLE_CUDA)
  include(CheckLanguage)
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    set(TROUPE_HAS_CUDA ON)
    # Ampere and Hopper by default; -DTROUPE_CUDA_ARCHS=... to change.
    set(TROUPE_CUDA_ARCHS "80;90" CACHE STRING "CUDA architectures of the CUDA backend")
    set(CMAKE_CUDA_ARCHITECTURES ${TROUPE_CUDA_ARCHS})
    enable_language(CUDA)
    # CMake 3.25 does not know nvcc 13's C++20 flag; tell it.
    set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
    set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    find_package(CUDAToolkit REQUIRED)
    if(CCACHE_PROGRAM)
      set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
    endif()
  endif()
endif()
message(STATUS "troupe: CUDA backend ${TROUPE_HAS_CUDA}")
