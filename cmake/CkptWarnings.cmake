# Warning and sanitizer flags shared by every ckpt target. GCC 12 reports false positives
# for maybe-uninitialized (inside nlohmann::json) and restrict (std::string at -O3).
add_library(ckpt_warnings INTERFACE)
target_compile_options(ckpt_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor
    -Wconversion-null -Wno-sign-conversion
    $<$<CXX_COMPILER_ID:GNU>:-Wno-maybe-uninitialized -Wno-restrict>>
  $<$<BOOL:${CKPT_WERROR}>:$<$<COMPILE_LANGUAGE:CXX>:-Werror>>)
# Debug sections compressed (-gz) where the compiler and linker take it: the test programs
# link libckpt's layers statically, and their debug info was 40-70 MB each uncompressed; with
# -gz a build tree takes about a third of the disk (gdb, addr2line and ASan read it as before).
option(CKPT_COMPRESS_DEBUG "Compress debug sections (-gz) when the toolchain supports it" ON)
if(CKPT_COMPRESS_DEBUG AND NOT MSVC)
  include(CheckCXXCompilerFlag)
  include(CheckLinkerFlag)
  check_cxx_compiler_flag(-gz CKPT_CXX_HAS_GZ)
  check_linker_flag(CXX -gz CKPT_LINKER_HAS_GZ)
  if(CKPT_CXX_HAS_GZ AND CKPT_LINKER_HAS_GZ)
    add_compile_options($<$<COMPILE_LANGUAGE:C,CXX>:-gz>)
    add_link_options($<$<LINK_LANGUAGE:C,CXX>:-gz>)
  endif()
endif()
if(CKPT_SANITIZE)
  add_compile_options(-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
# Fuzzing (tests/fuzz): coverage instrumentation and ASan/UBSan everywhere, libFuzzer's
# runtime linked into the fuzz_<target> binaries only. Use a build tree of its own.
if(CKPT_BUILD_FUZZERS)
  if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "Clang")
    message(FATAL_ERROR "CKPT_BUILD_FUZZERS=ON needs clang (libFuzzer); configure with CC=clang CXX=clang++")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer
    -fno-sanitize-recover=undefined)
  add_link_options(-fsanitize=address,undefined)
endif()
